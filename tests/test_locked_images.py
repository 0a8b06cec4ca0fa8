"""A locked image tower's features kept per image (csclip.train.locked_images): the
tower's own features, each distinct image through the tower once, a changed image never
served a stale feature, the budget kept, and the step uses it only where the tower's
output cannot change."""

from __future__ import annotations

import copy

import pytest
import torch

from csclip.model import create_bundle
from csclip.train.locked_images import LockedImageFeatures, digests, tower_is_fixed


@pytest.fixture(scope="module")
def locked():
    torch.manual_seed(0)
    model = create_bundle("csclip-tiny").model
    model.visual.requires_grad_(False)
    return model


def _images(count: int, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(count, 3, 64, 64, generator=generator)


class _Counting:
    """The model, counting the images its image tower is asked to encode."""

    def __init__(self, model):
        self.model, self.images = model, 0

    def encode_image(self, images, normalize=False):
        self.images += images.shape[0]
        return self.model.encode_image(images, normalize=normalize)


def test_each_distinct_image_runs_through_the_tower_once(locked):
    first, second = _images(8, seed=1), _images(8, seed=2)
    batch = torch.cat([first, first[:3]])          # a batch may repeat an image
    counting, cache = _Counting(locked), LockedImageFeatures(max_mb=16)
    with torch.no_grad():
        expected = locked.encode_image(batch, normalize=True)
        got = cache(counting, batch)
    assert counting.images == 8 and (cache.misses, cache.hits) == (8, 3)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    assert not got.requires_grad

    # The next epoch: the same images (in another order) beside new ones.
    mixed = torch.cat([second, first.flip(0)])
    with torch.no_grad():
        expected = locked.encode_image(mixed, normalize=True)
    got = cache(counting, mixed)
    assert counting.images == 16 and len(cache) == 16 and cache.hits == 3 + 8
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


def test_a_changed_image_is_a_new_key(locked):
    images = _images(4, seed=3)
    cache = LockedImageFeatures(max_mb=16)
    before = cache(locked, images)
    changed = images.clone()
    changed[2, 1, 30, 30] += 1e-3  # one value of one pixel
    after = cache(locked, changed)
    assert cache.misses == 5
    torch.testing.assert_close(after[[0, 1, 3]], before[[0, 1, 3]], rtol=0, atol=0)
    with torch.no_grad():
        torch.testing.assert_close(after[2], locked.encode_image(changed[2:3], normalize=True)[0],
                                   rtol=0, atol=1e-6)
    assert not torch.equal(after[2], before[2])
    # The key covers the dtype and the shape as well as the bytes.
    assert digests(images[:1])[0] != digests(images[:1].double())[0]
    assert digests(images[:1])[0] != digests(images[:1].reshape(1, 3, 32, 128))[0]


def test_past_its_budget_it_keeps_what_it_has_and_computes_the_rest(locked):
    # 64 floats + 400 bytes of overhead per entry: 0.002 MiB holds 3 of them.
    cache = LockedImageFeatures(max_mb=0.002)
    images = _images(6, seed=4)
    counting = _Counting(locked)
    first = cache(counting, images)
    assert len(cache) == 3 and cache.full
    again = cache(counting, images)
    assert counting.images == 6 + 3  # the three kept are not computed again
    torch.testing.assert_close(again, first, rtol=0, atol=1e-6)


def test_only_a_tower_whose_output_cannot_change_counts_as_fixed():
    torch.manual_seed(0)
    model = create_bundle("csclip-tiny").model.train()
    assert not tower_is_fixed(model.visual)  # it trains
    model.visual.requires_grad_(False)
    assert tower_is_fixed(model.visual)
    with_dropout = copy.deepcopy(model.visual)
    with_dropout.ln_post = torch.nn.Sequential(with_dropout.ln_post, torch.nn.Dropout(0.1))
    assert not tower_is_fixed(with_dropout)
    assert tower_is_fixed(with_dropout.eval())  # dropout is off in eval mode
    with_norm = torch.nn.Sequential(torch.nn.BatchNorm2d(3).requires_grad_(False)).train()
    assert not tower_is_fixed(with_norm)  # its running statistics move in training mode


def test_the_step_keeps_features_only_for_a_locked_tower_on_a_cpu(locked):
    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import objective_for
    from csclip.train.step import StepOptions, build_training, locked_image_features

    objective = objective_for(LossConfig(method="clip"), 2, None)
    options = StepOptions(objective, locked_image_cache_mb=64)
    cpu = torch.device("cpu")
    on = build_training(copy.deepcopy(locked), OptimConfig(), options, cpu)
    assert isinstance(on.runner.image_features, LockedImageFeatures)
    unlocked = create_bundle("csclip-tiny").model
    assert build_training(unlocked, OptimConfig(), options, cpu).runner.image_features is None
    off = StepOptions(objective, locked_image_cache_mb=0)
    assert build_training(copy.deepcopy(locked), OptimConfig(), off, cpu).runner.image_features is None
    for other in (StepOptions(objective, locked_image_cache_mb=64, compile=True),):
        assert locked_image_features(locked, other, cpu) is None
    assert locked_image_features(locked, options, torch.device("meta")) is None


def test_training_with_kept_features_takes_the_same_steps(locked):
    """Three epochs of CLIP steps over the same batches, with and without the features
    kept: the same losses and weights (to float rounding)."""
    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import objective_for
    from csclip.preprocess import tokenizer
    from csclip.train.step import StepOptions, build_training, train_step

    objective = objective_for(LossConfig(method="clip"), 2, None)
    tokens = tokenizer("csclip-tiny")([f"a red circle number {i}" for i in range(16)])
    batches = [{"image": _images(8, seed=10 + i), "caption": tokens[8 * i:8 * i + 8]}
               for i in range(2)]
    runs = {mb: build_training(copy.deepcopy(locked), OptimConfig(lr=1e-3),
                               StepOptions(objective, locked_image_cache_mb=mb),
                               torch.device("cpu"))
            for mb in (0, 16)}
    losses = {mb: [float(train_step(training, batch).total)
                   for _ in range(3) for batch in batches] for mb, training in runs.items()}
    assert runs[16].runner.image_features.hits == 2 * 2 * 8
    assert losses[16] == pytest.approx(losses[0], rel=1e-6, abs=1e-7)
    for (name, kept), plain in zip(runs[16].model.named_parameters(),
                                   runs[0].model.parameters(), strict=True):
        torch.testing.assert_close(kept, plain, rtol=0, atol=1e-6, msg=name)

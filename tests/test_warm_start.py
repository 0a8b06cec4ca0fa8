"""The layout warm start (loss.method layout, ours): its targets, worked out by hand on a
hand-made scene; the stream's target column; the objective through the one training step
(csclip.train.step) on a tiny world; its head in checkpoints but not in the CLIP model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csclip.config import validate_config
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError
from csclip.loss import LayoutQuestion, layout_loss
from csclip.train.warm_start import (
    LayoutVocabulary,
    image_cell_targets,
    layout_question,
    layout_targets,
)
from csclip.world import Scene, SceneObject, scene_from_record, world_record

VOCABULARY = LayoutVocabulary(("red", "green", "blue"), ("circle", "square", "triangle", "cross"))
QUESTION = LayoutQuestion(("red", "green", "blue"), ("circle", "square", "triangle", "cross"), 3)
WORLD = WorldConfig(seed=11, image_size=32, num_train=48, num_val=8, num_test=0)


def _scene() -> Scene:
    #   row 0: red circle (col 0)      blue square (col 2)
    #   row 2:           red square (col 1)
    return Scene((SceneObject("circle", "red", "large", row=0, col=0),
                  SceneObject("square", "blue", "small", row=0, col=2),
                  SceneObject("square", "red", "small", row=2, col=1)), grid_size=3, image_size=64)


@pytest.mark.parametrize("vocabulary", [VOCABULARY, QUESTION])
def test_image_cell_targets_put_each_kind_in_its_cell_and_the_rest_absent(vocabulary):
    target = image_cell_targets(vocabulary, _scene())
    assert target.shape == (12,)
    assert target[vocabulary.kind("red", "circle")] == 0
    assert target[vocabulary.kind("blue", "square")] == 2
    assert target[vocabulary.kind("red", "square")] == 2 * 3 + 1
    others = [k for k in range(12) if k not in {vocabulary.kind("red", "circle"),
                                                 vocabulary.kind("blue", "square"),
                                                 vocabulary.kind("red", "square")}]
    assert (target[others] == 9).all()  # "absent" is the class after the 9 cells
    assert QUESTION.num_classes == 10


def test_layout_loss_is_the_cross_entropy_of_each_kind():
    # two kinds, three classes: logits that put all mass on the right class cost ~0, a
    # uniform head log(3) per kind.
    targets = torch.tensor([[0, 2]])
    sure = torch.tensor([[50.0, 0, 0, 0, 0, 50.0]])
    assert float(layout_loss(sure, targets)) < 1e-6
    assert float(layout_loss(torch.zeros(1, 6), targets)) == pytest.approx(np.log(3))


def test_the_stream_carries_each_scenes_targets_cached_or_not():
    from csclip.config.train import SamplingConfig
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import (
        decode_batch,
        image_shape,
        prepare_batch,
        preprocess_key,
        sample_batch,
    )
    from csclip.units import records_to_table

    records = [world_record(WORLD, "train", i) for i in range(6)]
    question = layout_question(WORLD)
    preprocess = spec_of(create_bundle("csclip-tiny", image_size=32).model,
                         "csclip-tiny").preprocess_cfg
    table = records_to_table(records)
    kwargs = {"sampling": SamplingConfig().model_dump(mode="json"), "model_name": "csclip-tiny",
              "seed": 0, "epoch": 0, "columns": []}
    cached = sample_batch(decode_batch(table, preprocess=preprocess_key(preprocess),
                                       model_name="csclip-tiny", layout=question),
                          image_shape=image_shape(preprocess), **kwargs)
    streamed = prepare_batch(table, preprocess=preprocess_key(preprocess), layout=question,
                             **kwargs)
    assert sorted(cached) == sorted(streamed) == ["image", "layout_target"]
    expected = np.stack([image_cell_targets(question, scene_from_record(r)) for r in records])
    np.testing.assert_array_equal(cached["layout_target"], expected)
    np.testing.assert_array_equal(streamed["layout_target"], expected)
    np.testing.assert_array_equal(layout_targets(table.to_pylist(), question), expected)


def _layout_config(**optim):
    from csclip.config.train import TrainConfig

    return validate_config(TrainConfig, {
        "model": {"image_size": 32}, "data": {"world": WORLD.model_dump(), "batch_size": 16},
        "loss": {"method": "layout"},
        "optim": {"lr": 1e-3, "weight_decay": 0.1, "decay_all_params": True,
                  "betas": [0.9, 0.999], "eps": 1e-8, "schedule": "constant",
                  "grad_clip": None, **optim}})


def _constant_head_loss(world: WorldConfig) -> float:
    """The cross-entropy of the best head that ignores the image (it answers every kind
    with the class frequencies of the training scenes: mostly "absent"): the entropy of
    those frequencies. A head that always says "absent" does no better."""
    question = layout_question(world)
    targets = np.stack([image_cell_targets(question, scene_from_record(world_record(world, "train", i)))
                        for i in range(world.num_train)])
    shares = np.bincount(targets.ravel()) / targets.size
    shares = shares[shares > 0]
    return float(-(shares * np.log(shares)).sum())


def _batches(setup, config):
    from csclip.train.stream import decode_batch, image_shape, preprocess_key, sample_batch
    from csclip.units import records_to_table

    table = records_to_table([world_record(WORLD, "train", i) for i in range(WORLD.num_train)])
    rows = decode_batch(table, preprocess=preprocess_key(setup.spec.preprocess_cfg),
                        model_name="csclip-tiny", layout=layout_question(WORLD))
    data = sample_batch(rows, sampling=config.sampling.model_dump(mode="json"),
                        model_name="csclip-tiny", seed=0, epoch=0, columns=[],
                        image_shape=image_shape(setup.spec.preprocess_cfg))
    return {name: torch.from_numpy(value) for name, value in data.items()}


@pytest.mark.slow
def test_the_layout_objective_trains_the_image_tower_only_through_the_one_step():
    from csclip.train.loop import prepare_training
    from csclip.train.step import train_step
    from csclip.train.warm_start import measure_layout

    config = _layout_config(max_steps=150)
    torch.manual_seed(0)
    setup = prepare_training(config, torch.device("cpu"))
    model = setup.training.model
    frozen = {n: p.detach().clone() for n, p in model.named_parameters()
              if not n.startswith(("visual.", "layout_head."))}
    visual = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith("visual.")}
    start = measure_layout(model, setup.bundle.preprocess, WORLD, 8)
    data, generator = _batches(setup, config), torch.Generator().manual_seed(0)
    losses = []
    for _ in range(150):
        index = torch.randint(WORLD.num_train, (16,), generator=generator)
        losses.append(float(train_step(setup.training, {k: v[index] for k, v in data.items()}).total))
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in frozen.items())  # text tower, temperature
    assert any(not torch.equal(after[n], p) for n, p in visual.items())
    # Learning means reading the image: the loss falls far below what any head that
    # ignores the image can reach (~0.75 here; "absent" alone is right for 85% of kinds,
    # which is why a presence accuracy proves nothing).
    floor = _constant_head_loss(WORLD)
    assert losses[0] > floor and np.mean(losses[-10:]) < 0.6 * floor
    end = measure_layout(model, setup.bundle.preprocess, WORLD, 8)
    assert end.held_out_loss < start.held_out_loss and end.absent_share > 70.0


def test_the_head_is_checkpointed_with_the_run_and_left_out_of_the_model(tmp_path):
    from csclip.model import create_bundle, load_bundle, save_checkpoint
    from csclip.train.loop import prepare_training
    from csclip.train.warm_start import measure_checkpoint, measure_layout

    config = _layout_config(max_steps=1)
    setup = prepare_training(config, torch.device("cpu"))
    assert [n for n, p in setup.training.model.named_parameters() if p.requires_grad][-2:] == [
        "layout_head.weight", "layout_head.bias"]
    directory = save_checkpoint(setup.training.model, setup.spec, tmp_path / "ckpt")
    assert "layout_head.weight" in torch.load(directory / "model.pt")
    # As the pretraining's model.pretrained and as an evaluated model: CLIP alone.
    loaded = load_bundle(directory)
    assert not hasattr(loaded.model, "layout_head")
    visual = setup.training.model.visual.state_dict()
    assert all(torch.equal(loaded.model.visual.state_dict()[k], v) for k, v in visual.items())
    create_bundle("csclip-tiny", str(directory), image_size=32)
    # The measurement reads the head back: the same answers as the live model.
    assert (measure_checkpoint(str(directory), config.model, WORLD, held_out=4)
            == measure_layout(setup.training.model, setup.bundle.preprocess, WORLD, 4))


def test_the_layout_objective_needs_the_world():
    from csclip.train.loop import step_options

    config = _layout_config(max_steps=1)
    assert step_options(config).objective.layout == layout_question(WORLD)
    on_a_table = config.model_copy(update={"data": config.data.model_copy(
        update={"units_uri": "units.parquet"})})
    with pytest.raises(ConfigError, match="loss.method layout needs the synthetic world"):
        step_options(on_a_table)
    with pytest.raises(ConfigError, match="image_foil_weight"):
        validate_config(type(config), {"loss": {"method": "layout", "image_foil_weight": 1.0}})

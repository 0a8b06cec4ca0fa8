"""The text tower without its padding (csclip.train.trimmed_text): the same features and
gradients as open_clip's full-context forward, for the rows of every length a batch mixes,
and the step's runner uses it only where it is exact."""

from __future__ import annotations

import pytest
import torch

from csclip.model import create_bundle
from csclip.preprocess import tokenizer
from csclip.train.trimmed_text import TrimmedTextForward, can_trim, encode_text_trimmed

TEXTS = [
    "red circle",
    "a large yellow cross",
    "A scene with a green square, a large yellow cross and a purple circle. The purple "
    "circle is below the large yellow cross.",
    "the blue square is left of the red circle",
    "two dogs",
    "a man riding a horse on a beach next to the sea while the sun sets behind him and two "
    "dogs run after them along the water towards the rocks",
]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return create_bundle("csclip-tiny").model.eval()


def _tokens(texts: list[str]) -> torch.Tensor:
    return tokenizer("csclip-tiny")(texts)


def _full_and_trimmed_gradients(model, tokens: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    """Each parameter's gradient of one random weighting of the features, through the
    full-context forward and through encode_text_trimmed."""
    weights = torch.randn(tokens.shape[0], model.text_projection.shape[1])
    grads = []
    for encode in (lambda t: model.encode_text(t, normalize=True),
                   lambda t: encode_text_trimmed(model, t)):
        model.zero_grad(set_to_none=True)
        (encode(tokens) * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()
                      if p.grad is not None})
    return grads


def test_features_and_gradients_equal_the_full_context(model):
    tokens = _tokens(TEXTS * 3)
    lengths = tokens.argmax(1) + 1
    assert lengths.min() < 8 and lengths.max() == tokens.shape[1]  # short, long, truncated rows
    full = model.encode_text(tokens, normalize=True)
    trimmed = encode_text_trimmed(model, tokens)
    torch.testing.assert_close(trimmed, full, rtol=0, atol=1e-5)

    grads = _full_and_trimmed_gradients(model, tokens)
    assert grads[0].keys() == grads[1].keys()
    for name, expected in grads[0].items():
        # Float rounding of sums in another order, relative to the tensor's scale.
        error = float((grads[1][name] - expected).abs().max())
        assert error <= 1e-5 * max(float(expected.abs().max()), 1e-3), (name, error)


def test_a_repeated_text_runs_once_and_its_rows_sum_its_gradient(model):
    tokens = _tokens(TEXTS + TEXTS[:2] + TEXTS[3:4])  # 9 rows, 6 distinct
    seen = []
    hook = model.transformer.register_forward_hook(lambda _m, args, _o: seen.append(args[0]))
    try:
        features = encode_text_trimmed(model, tokens)
    finally:
        hook.remove()
    assert sum(x.shape[0] for x in seen) == len(TEXTS)  # each distinct text once
    torch.testing.assert_close(features, model.encode_text(tokens, normalize=True),
                               rtol=0, atol=1e-5)
    assert torch.equal(features[6], features[0]) and torch.equal(features[8], features[3])

    grads = [g["token_embedding.weight"] for g in _full_and_trimmed_gradients(model, tokens)]
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0,
                               atol=1e-5 * float(grads[0].abs().max()))


def test_positions_past_every_end_get_no_gradient(model):
    """Why cutting them changes nothing: the full forward's gradient there is exactly 0."""
    tokens = _tokens(TEXTS[:4])
    longest = int((tokens.argmax(1) + 1).max())
    assert longest < tokens.shape[1]
    model.zero_grad(set_to_none=True)
    model.encode_text(tokens, normalize=True).sum().backward()
    assert model.positional_embedding.grad[:longest].abs().sum() > 0
    assert not model.positional_embedding.grad[longest:].any()


def test_runner_returns_clip_forward(model):
    images = torch.randn(3, 3, 64, 64)
    tokens = _tokens(TEXTS[:3])
    expected = model(images, tokens)
    got = TrimmedTextForward(model)(images, tokens)
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    torch.testing.assert_close(got[1], expected[1], rtol=0, atol=1e-5)
    torch.testing.assert_close(got[2], expected[2], rtol=0, atol=0)
    assert TrimmedTextForward(model)(None, tokens)[0] is None


def test_only_argmax_pooled_causal_towers_are_trimmed(model):
    assert can_trim(model)
    model.text_pool_type = "last"
    try:
        assert not can_trim(model)
    finally:
        model.text_pool_type = "argmax"


def test_the_step_runs_it_unless_asked_not_to(model):
    from csclip.config.loss import LossConfig
    from csclip.config.train import OptimConfig
    from csclip.loss import objective_for
    from csclip.train.step import StepOptions, build_training

    objective = objective_for(LossConfig(method="clip"), 2, None)
    on = build_training(model, OptimConfig(), StepOptions(objective), torch.device("cpu"))
    off = build_training(model, OptimConfig(), StepOptions(objective, trim_text=False),
                         torch.device("cpu"))
    assert isinstance(on.runner, TrimmedTextForward) and on.runner.model is model
    assert off.runner is model


def test_length_groups_split_only_where_it_saves():
    from csclip.train.trimmed_text import length_groups

    # Captions of 17-32 tokens: one call at the longest (groups of a few rows cost more).
    captions = [17, 20, 24, 28, 32, 30, 22, 26]
    assert length_groups(captions) == [(32, sorted(range(8), key=lambda i: -captions[i]))]
    # A CS-CLIP batch: captions near 30 beside units of 4-11 tokens: two calls.
    lengths = [30, 28, 31, 29, 5, 7, 11, 6, 4, 9, 8, 10]
    groups = length_groups(lengths)
    assert [length for length, _ in groups] == [31, 11]
    assert sorted(groups[0][1]) == [0, 1, 2, 3] and sorted(groups[1][1]) == list(range(4, 12))
    # Every row exactly once, each in a call at least as long as it.
    for length, rows in groups:
        assert all(lengths[row] <= length for row in rows)
    assert sorted(row for _, rows in groups for row in rows) == list(range(len(lengths)))

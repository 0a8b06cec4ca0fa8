"""The world's layout question (csclip.world.layout, ours; issue 10): its answers, worked out
by hand on a hand-made scene, and the image tower's warm start on a tiny world."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csclip.world import Scene, SceneObject, WorldConfig, world_record
from csclip.world.config import ABOVE, BELOW, LEFT, RIGHT
from csclip.world.layout import (
    DIRECTIONS,
    LayoutHead,
    LayoutVocabulary,
    image_cell_targets,
    image_layout_warm_start,
    layout_accuracy,
    layout_loss,
    record_image_targets,
)

VOCABULARY = LayoutVocabulary(("red", "green", "blue"), ("circle", "square", "triangle", "cross"))


def _scene() -> Scene:
    #   row 0: red circle (col 0)      blue square (col 2)
    #   row 2:           red square (col 1)
    return Scene((SceneObject("circle", "red", "large", row=0, col=0),
                  SceneObject("square", "blue", "small", row=0, col=2),
                  SceneObject("square", "red", "small", row=2, col=1)), grid_size=3, image_size=64)


def _answer(target, mask, first, second, direction):
    index = VOCABULARY.index(VOCABULARY.kind(*first), VOCABULARY.kind(*second),
                             DIRECTIONS.index(direction))
    return (float(target[index]), float(mask[index]))


def test_image_cell_targets_put_each_kind_in_its_cell_and_the_rest_absent():
    target = image_cell_targets(VOCABULARY, _scene())
    assert target.shape == (12,)
    assert target[VOCABULARY.kind("red", "circle")] == 0
    assert target[VOCABULARY.kind("blue", "square")] == 2
    assert target[VOCABULARY.kind("red", "square")] == 2 * 3 + 1
    others = [k for k in range(12) if k not in {VOCABULARY.kind("red", "circle"),
                                                 VOCABULARY.kind("blue", "square"),
                                                 VOCABULARY.kind("red", "square")}]
    assert (target[others] == 9).all()  # "absent" is the class after the 9 cells


def test_an_image_answers_every_direction_of_every_pair_of_its_objects():
    target, mask = VOCABULARY.image_targets(_scene())
    circle, blue, red_square = ("red", "circle"), ("blue", "square"), ("red", "square")
    assert _answer(target, mask, circle, blue, LEFT) == (1.0, 1.0)
    assert _answer(target, mask, circle, blue, RIGHT) == (0.0, 1.0)
    assert _answer(target, mask, circle, blue, ABOVE) == (0.0, 1.0)   # same row
    assert _answer(target, mask, blue, circle, RIGHT) == (1.0, 1.0)
    assert _answer(target, mask, circle, red_square, ABOVE) == (1.0, 1.0)
    assert _answer(target, mask, red_square, blue, BELOW) == (1.0, 1.0)
    assert _answer(target, mask, red_square, blue, LEFT) == (1.0, 1.0)
    # 3 objects: 6 ordered pairs x 4 directions answered; nothing about absent kinds.
    assert mask.sum() == 24
    assert _answer(target, mask, ("green", "cross"), circle, LEFT) == (0.0, 0.0)


def test_a_relation_text_answers_its_pair_on_its_axis_only():
    target, mask = VOCABULARY.text_targets("red circle", LEFT, "blue square")
    circle, blue = ("red", "circle"), ("blue", "square")
    assert _answer(target, mask, circle, blue, LEFT) == (1.0, 1.0)
    assert _answer(target, mask, circle, blue, RIGHT) == (0.0, 1.0)
    assert _answer(target, mask, blue, circle, RIGHT) == (1.0, 1.0)
    assert _answer(target, mask, blue, circle, LEFT) == (0.0, 1.0)
    assert _answer(target, mask, circle, blue, ABOVE)[1] == 0.0  # the other axis: unsaid
    assert mask.sum() == 4
    # Sizes do not change the kind; an unknown color or a non-relation is no question.
    same = VOCABULARY.text_targets("large red circle", LEFT, "small blue square")
    assert np.array_equal(same[0], target) and np.array_equal(same[1], mask)
    assert VOCABULARY.text_targets("purple circle", LEFT, "blue square") is None
    assert VOCABULARY.text_targets("red circle", "is near", "blue square") is None
    assert VOCABULARY.text_targets("red circle", LEFT, "red circle") is None


def test_a_world_record_gives_each_relation_with_its_antonym_and_swap():
    world = WorldConfig(seed=5, num_train=30, num_val=0, num_test=0)
    vocabulary = LayoutVocabulary(tuple(world.colors), tuple(world.shapes))
    record = next(r for r in (world_record(world, "train", i) for i in range(30)) if r.relations)
    examples = vocabulary.text_examples(record)
    assert len(examples) == 3 * len(record.relations)
    unit = record.relations[0]
    texts = [text for text, _, _ in examples[:3]]
    assert texts[0] == unit.text
    assert texts[1] != texts[0] and texts[2] != texts[0]
    # The three differ only in layout, and their answers disagree where they are asked.
    (t0, m0), (t1, _), (t2, _) = ((t, m) for _, t, m in examples[:3])
    asked = m0 > 0
    assert not np.array_equal(t0[asked], t1[asked]) and not np.array_equal(t0[asked], t2[asked])
    image_target, image_mask = record_image_targets(vocabulary, record)
    # The image agrees with the unit wherever the unit asks.
    assert np.array_equal(image_target[asked], t0[asked]) and (image_mask[asked] == 1).all()


def test_the_shared_head_and_its_loss():
    head = LayoutHead(8, VOCABULARY)
    features = torch.randn(4, 8)
    logits = head(features)
    assert logits.shape == (4, VOCABULARY.size)
    # The head sees the normalized embedding: the scale of a feature vector is irrelevant.
    assert torch.allclose(head(features * 7.0), logits, atol=1e-5)
    target = torch.zeros(4, VOCABULARY.size)
    mask = torch.zeros(4, VOCABULARY.size)
    assert layout_loss(logits, target, mask).item() == 0.0  # nothing asked
    mask[:, :3] = 1
    target[:, 0] = 1
    expected = torch.nn.functional.binary_cross_entropy_with_logits(logits[:, :3], target[:, :3])
    assert layout_loss(logits, target, mask).item() == pytest.approx(expected.item(), rel=1e-5)
    assert 0.0 <= layout_accuracy(logits, target, mask) <= 100.0
    frozen = LayoutHead(8, VOCABULARY, frozen=True, seed=1)
    assert not any(p.requires_grad for p in frozen.parameters())
    assert torch.equal(frozen.linear.weight, LayoutHead(8, VOCABULARY, frozen=True, seed=1).linear.weight)


def test_the_warm_start_trains_the_image_tower_only_and_learns():
    from csclip.model import create_bundle

    world = WorldConfig(seed=11, image_size=32, num_train=48, num_val=8, num_test=0)
    bundle = create_bundle("csclip-tiny", image_size=32)
    model = bundle.model
    text_before = {n: p.detach().clone() for n, p in model.named_parameters()
                   if not n.startswith("visual.")}
    visual_before = {n: p.detach().clone() for n, p in model.named_parameters()
                     if n.startswith("visual.")}
    lines: list[str] = []
    result = image_layout_warm_start(model, bundle.preprocess, world, 60, batch_size=16,
                                     held_out=8, log_every=30, log=lines.append)
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in text_before.items())
    assert any(not torch.equal(after[n], p) for n, p in visual_before.items())
    assert result.steps == 60 and len(lines) == 2 and "step 60/60" in lines[-1]
    # Cross-entropy over 13 classes per kind starts near ln 13 = 2.56; the head quickly
    # learns that most kinds are absent.
    assert result.first_loss > 1.5 and result.last_loss < 0.7 * result.first_loss
    assert 0.0 <= result.cell_accuracy <= 100.0
    assert result.presence_accuracy > 70.0
    with pytest.raises(ValueError, match="held_out"):
        image_layout_warm_start(model, bundle.preprocess, world, 1, held_out=0)

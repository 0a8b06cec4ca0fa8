"""The pairwise layout question (research/spatial/layout_question.py): its answers, worked
out by hand on a hand-made scene. Run with `pytest research/spatial`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from csclip.config.world import ABOVE, BELOW, LEFT, RIGHT, WorldConfig
from csclip.world import Scene, SceneObject, world_record
from research.spatial.layout_question import (
    DIRECTIONS,
    LayoutHead,
    PairVocabulary,
    layout_accuracy,
    layout_loss,
    record_image_targets,
)

VOCABULARY = PairVocabulary(("red", "green", "blue"), ("circle", "square", "triangle", "cross"))


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
    vocabulary = PairVocabulary(tuple(world.colors), tuple(world.shapes))
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

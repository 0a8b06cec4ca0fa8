"""The layout warm start of the demo's pretraining (csclip.train.warm_start, ours): its
targets, worked out by hand on a hand-made scene, and the image tower's training on a tiny
world."""

from __future__ import annotations

import pytest
import torch

from csclip.train.warm_start import LayoutVocabulary, image_cell_targets, image_layout_warm_start
from csclip.world import Scene, SceneObject, WorldConfig

VOCABULARY = LayoutVocabulary(("red", "green", "blue"), ("circle", "square", "triangle", "cross"))


def _scene() -> Scene:
    #   row 0: red circle (col 0)      blue square (col 2)
    #   row 2:           red square (col 1)
    return Scene((SceneObject("circle", "red", "large", row=0, col=0),
                  SceneObject("square", "blue", "small", row=0, col=2),
                  SceneObject("square", "red", "small", row=2, col=1)), grid_size=3, image_size=64)


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

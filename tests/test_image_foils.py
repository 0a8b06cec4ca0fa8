"""Image-side counterfactual foils (ours): the world's swapped render and the
photo mirror, the loss term's known answer, and the training batch wiring."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from csclip.config.loss import LossConfig
from csclip.config.world import WorldConfig
from csclip.loss import image_foil_loss, objective_for
from csclip.train.image_foils import draw_image_foil, foil_units
from csclip.units import Unit, UnitsRecord
from csclip.world import scene_from_record, world_record
from csclip.world.pairs import relation_objects, swap_objects

WORLD = WorldConfig(image_size=32)


def test_swapped_scene_makes_the_relation_false_and_keeps_the_objects():
    checked = 0
    for index in range(40):
        record = world_record(WORLD, "val", index)
        scene = scene_from_record(record)
        for unit in record.relations:
            found = relation_objects(scene, unit)
            assert found is not None  # world mentions pick out exactly one object
            swapped = swap_objects(scene, *found)
            assert scene.holds(unit.text) and not swapped.holds(unit.text)
            assert swapped.holds(f"{unit.object} {unit.predicate} {unit.subject}")
            assert sorted((o.color, o.shape) for o in swapped.objects) == sorted(
                (o.color, o.shape) for o in scene.objects)
            checked += 1
    assert checked > 40


def test_world_image_foil_is_the_rendered_swap():
    record = world_record(WORLD, "val", 3)
    image = Image.open(__import__("io").BytesIO(record.image_bytes)).convert("RGB")
    foil = draw_image_foil(record, image, random.Random(0))
    assert foil is not None and foil.unit in {u.text for u in record.relations}
    swapped = swap_objects(scene_from_record(record), *relation_objects(
        scene_from_record(record), next(u for u in record.relations if u.text == foil.unit)))
    assert swapped.holds(foil.foil_text) and not swapped.holds(foil.unit)
    assert foil.image.size == image.size
    assert np.abs(np.asarray(foil.image, np.int16) - np.asarray(image, np.int16)).sum() > 0


def test_photo_foil_mirrors_only_for_left_right_relations():
    left = Unit.relation("man", "is left of", "dog", ())
    above = Unit.relation("lamp", "is above", "table", ())
    record = UnitsRecord("s", "i", "a man left of a dog", "train", (), (left, above))
    assert [u.text for u in foil_units(record)] == [left.text]
    image = Image.fromarray(np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3))
    foil = draw_image_foil(record, image, random.Random(0))
    assert foil.unit == left.text and foil.foil_text == "man is right of dog"
    assert (np.asarray(foil.image) == np.asarray(image)[:, ::-1]).all()
    only_above = UnitsRecord("s", "i", "a lamp above a table", "train", (), (above,))
    assert draw_image_foil(only_above, image, random.Random(0)) is None


def test_image_foil_loss_known_answer_and_mask():
    # Scale 1. Sample 0 has a foil whose features equal its own image and unit: rows I_0
    # and I'_0 each score [u_0, u'_0] = [1, 1] (and sample 2's pair 0), so they cannot
    # choose; sample 2's pair is orthogonal to everything else: a clean [1, 0, 0, 0] row.
    e = torch.eye(4)
    image = torch.stack([e[0], e[3], e[1], e[3]])
    units = torch.stack([e[0], e[3], e[1], e[3]])
    foil_images = torch.stack([e[0], e[3], e[2], e[3]])
    foil_texts = torch.stack([e[0], e[3], e[2], e[3]])
    mask = torch.tensor([True, False, True, False])
    loss = image_foil_loss(image, foil_images, units, foil_texts, mask, torch.tensor(1.0))
    # Valid rows (both directions alike): I_0 -> [1, 0, 1, 0] (ln(2e + 2) - 1), I_2 ->
    # [0, 1, 0, 0] (ln(e + 3) - 1), I'_0 like I_0, I'_2 like I_2.
    tied = math.log(2 * math.e + 2) - 1
    clean = math.log(math.e + 3) - 1
    assert loss.item() == pytest.approx((tied + clean) / 2, abs=1e-6)
    zero = image_foil_loss(image, foil_images, units, foil_texts,
                           torch.zeros(4, dtype=torch.bool), torch.tensor(1.0))
    assert zero.item() == 0.0


def test_image_foil_loss_falls_as_the_towers_tell_the_counterfactuals_apart():
    gen = torch.Generator().manual_seed(1)
    base = F.normalize(torch.randn(6, 16, generator=gen), dim=-1)
    layout = F.normalize(torch.randn(6, 16, generator=gen), dim=-1)
    mask = torch.ones(6, dtype=torch.bool)

    def loss(strength: float) -> float:
        # I and I' (and u and u') differ by `strength` along a per-sample layout direction.
        image = F.normalize(base + strength * layout, dim=-1)
        foil = F.normalize(base - strength * layout, dim=-1)
        return image_foil_loss(image, foil, image, foil, mask, torch.tensor(10.0)).item()

    assert loss(0.0) > loss(0.5) > loss(2.0)


def test_objective_adds_the_weighted_image_foil_term():
    objective = objective_for(LossConfig(method="clip", image_foil_weight=0.5), 2)
    assert objective.columns == ("caption", "image_foil_unit", "image_foil_text")
    assert objective.image_columns == ("image", "image_foil")
    assert "image_foil_mask" in objective.mask_columns
    assert objective_for(LossConfig(), 2).image_columns == ("image",)  # off by default
    gen = torch.Generator().manual_seed(0)
    image, caption, unit, foil, foil_text = (F.normalize(torch.randn(4, 8, generator=gen), dim=-1)
                                             for _ in range(5))
    mask = torch.ones(4, dtype=torch.bool)
    parts = objective.loss(image, {"caption": caption, "image_foil_unit": unit,
                                   "image_foil_text": foil_text},
                           {"image_foil_mask": mask}, torch.tensor(10.0), {"image_foil": foil})
    expected = image_foil_loss(image, foil, unit, foil_text, mask, torch.tensor(10.0))
    torch.testing.assert_close(parts.image_foil, expected)
    torch.testing.assert_close(parts.total, parts.full + 0.5 * expected)


@pytest.mark.parametrize("method", ["clip", "csclip"])
def test_training_batch_carries_image_foils(method):
    from train_helpers import compute_loss

    from csclip.config.train import SamplingConfig
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import prepare_batch, preprocess_key
    from csclip.units import records_to_table

    records = [world_record(WORLD, "train", i) for i in range(6)]
    bundle = create_bundle("csclip-tiny", image_size=32)
    spec = spec_of(bundle.model, "csclip-tiny")
    objective = objective_for(LossConfig(method=method, image_foil_weight=1.0), 2)
    columns = prepare_batch(records_to_table(records), sampling=SamplingConfig().model_dump(),
                            preprocess=preprocess_key(spec.preprocess_cfg),
                            model_name="csclip-tiny", seed=0, epoch=0,
                            columns=list(objective.columns))
    assert columns["image_foil"].shape == columns["image"].shape
    assert columns["image_foil_mask"].all()  # every world record has a relation
    assert not np.allclose(columns["image_foil"], columns["image"])
    batch = {k: torch.as_tensor(v) for k, v in columns.items()}
    parts = compute_loss(bundle.model, batch, objective)
    assert parts.image_foil is not None and parts.image_foil.item() > 0
    assert batch["image_foil_text"].shape == batch["image_foil_unit"].shape
    parts.total.backward()
    assert bundle.model.visual.conv1.weight.grad is not None

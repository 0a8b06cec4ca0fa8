"""Image-side counterfactual foils for relation units (ours, beyond the paper).

A relation unit "A is left of B" has text foils (antonym, swap, ...) that train the text
tower to read the relation; nothing in the paper's objective makes the image tower see it.
An image foil is the same picture with the relation made false while everything the text
names stays: on the synthetic world, the scene re-rendered with A and B exchanged; on a
photo, its horizontal mirror for a left/right relation (both objects stay, their order
flips). Each foil comes with the text true of it ("B r A" on the world, "A" right-of "B"
for a mirrored left-of). The loss (csclip.loss, `loss.image_foils`) adds image and foil,
unit and foil text, to one symmetric contrast. Pure: no ray.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image, ImageOps

from csclip.units import Unit, UnitsRecord, normalize_text, render_relation
from csclip.world.pairs import relation_objects, swap_objects
from csclip.world.render import render_image
from csclip.world.scene import scene_from_record

# Horizontal predicates: a mirror image makes them false (A left of B -> A right of B).
# Vertical ones have no natural photo counterfactual (an upside-down photo is not a scene).
_HORIZONTAL_WORDS = ("left", "right")


@dataclass(frozen=True)
class ImageFoil:
    """The relation unit an image foil belongs to, the foil image (the unit is false of
    it) and the text that is true of the foil instead."""

    unit: str
    image: Image.Image
    foil_text: str


def _is_world(record: UnitsRecord) -> bool:
    return bool(record.meta.get("scene"))


def _world_foil(record: UnitsRecord, unit: Unit) -> Image.Image | None:
    scene = scene_from_record(record)
    found = relation_objects(scene, unit)
    if found is None:
        return None
    return render_image(swap_objects(scene, *found))


def _is_horizontal(unit: Unit) -> bool:
    words = normalize_text(unit.predicate or "").split()
    return any(word in words for word in _HORIZONTAL_WORDS)


def foil_units(record: UnitsRecord) -> list[Unit]:
    """The relation units of `record` that can get an image foil: on the world, relations
    between two objects the scene picks out; on photos, left/right relations."""
    if _is_world(record):
        scene = scene_from_record(record)
        return [u for u in record.relations if relation_objects(scene, u) is not None]
    return [u for u in record.relations if _is_horizontal(u)]


def draw_image_foil(record: UnitsRecord, image: Image.Image,
                    rng: random.Random) -> ImageFoil | None:
    """One image foil for `record` (a relation unit drawn uniformly among foil_units), or
    None when the record has no such unit. `image` is the record's decoded RGB image."""
    units = foil_units(record)
    if not units:
        return None
    return image_foil(record, units[draw_foil_index(len(units), rng)], image)


def draw_foil_index(count: int, rng: random.Random) -> int:
    """Which of `count` (> 0) candidates an epoch's draw takes: draw_image_foil's draw, and
    a shard's among the foils rendered once when it was written (image_foil_candidates)."""
    return rng.randrange(count)


def image_foil_candidates(record: UnitsRecord, image: Image.Image) -> list[ImageFoil | None]:
    """Every foil draw_image_foil can give `record`, in foil_units' order (the shards of
    pixels hold them, rendered once and each epoch draws one index, csclip.train.stream)."""
    return [image_foil(record, unit, image) for unit in foil_units(record)]


def image_foil(record: UnitsRecord, unit: Unit, image: Image.Image) -> ImageFoil | None:
    """The image foil of relation unit `unit` (one of foil_units(record)); `image` is the
    record's decoded RGB image."""
    if _is_world(record):
        foil = _world_foil(record, unit)
        if foil is None:
            return None
        # A and B exchanged places: "B r A" holds of the foil.
        return ImageFoil(unit.text, foil.convert("RGB"),
                         render_relation(unit.object or "", unit.predicate or "", unit.subject or ""))
    # Mirrored: A and B keep their names, left and right trade places.
    return ImageFoil(unit.text, ImageOps.mirror(image),
                     render_relation(unit.subject or "", _mirror_predicate(unit.predicate or ""),
                                     unit.object or ""))


def _mirror_predicate(predicate: str) -> str:
    swap = {"left": "right", "right": "left"}
    return " ".join(swap.get(word, word) for word in predicate.split())


"""Compositional test items built from world scenes: Winoground-style mirrored pairs (one
relation, subject and object swapped) and SugarCrepe-style in-place replace foils."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterable
from dataclasses import dataclass

from csclip.config.world import ABOVE, BELOW, LEFT, RIGHT
from csclip.units import ChangeType, Unit, UnitsRecord, contains_phrase
from csclip.world.render import render_png
from csclip.world.scene import Scene, SceneObject, scene_from_record
from csclip.world.truth import WorldLanguageError, parse_entity

AXES: tuple[str, ...] = ("x", "y")


@dataclass(frozen=True)
class MirroredPair:
    """Image A (a val scene) and image B (its mirror image). caption_a states one relation
    of A; caption_b is the same words with subject and object swapped, true of B only."""

    pair_id: str
    image_id: str  # the record image A comes from
    scene_a: Scene
    scene_b: Scene
    caption_a: str
    caption_b: str
    image_a: bytes
    image_b: bytes


@dataclass(frozen=True)
class ReplaceItem:
    """A caption and the same caption with one entity replaced in place by its foil."""

    image_id: str
    caption: str
    foil_caption: str
    change_type: str


def mirror_scene(scene: Scene, axis: str) -> Scene:
    """The scene flipped left-right (axis "x": columns and x offsets) or top-bottom ("y")."""
    if axis not in AXES:
        raise ValueError(f"axis must be one of {AXES}, not {axis!r}")
    last = scene.grid_size - 1

    def flip(obj: SceneObject) -> SceneObject:
        if axis == "x":
            return dataclasses.replace(obj, col=last - obj.col, dx=-obj.dx)
        return dataclasses.replace(obj, row=last - obj.row, dy=-obj.dy)

    return Scene(tuple(flip(o) for o in scene.objects), scene.grid_size, scene.image_size)


def swap_objects(scene: Scene, first: int, second: int) -> Scene:
    """The scene with objects `first` and `second` (indices) exchanging places (cell and
    offset); every other object stays. For a relation between them, the swapped scene is
    the image-side counterfactual: "A left of B" becomes false, the objects stay the same."""
    objects = list(scene.objects)
    a, b = objects[first], objects[second]
    objects[first] = dataclasses.replace(a, row=b.row, col=b.col, dx=b.dx, dy=b.dy)
    objects[second] = dataclasses.replace(b, row=a.row, col=a.col, dx=a.dx, dy=a.dy)
    return Scene(tuple(objects), scene.grid_size, scene.image_size)


def relation_objects(scene: Scene, unit: Unit) -> tuple[int, int] | None:
    """Indices of the objects a relation unit's subject and object name, or None when a
    mention does not pick out exactly one object or the unit is not a world relation."""
    try:
        subject = parse_entity(str(unit.subject or "").split(), unit.text)
        object = parse_entity(str(unit.object or "").split(), unit.text)
    except WorldLanguageError:
        return None
    found = []
    for phrase in (subject, object):
        matches = [i for i, obj in enumerate(scene.objects) if phrase.matches(obj)]
        if len(matches) != 1:
            return None
        found.append(matches[0])
    return (found[0], found[1]) if found[0] != found[1] else None


def _with_article(text: str) -> str:
    return f"an {text}" if text[0] in "aeiou" else f"a {text}"


def _name(obj: SceneObject) -> str:
    # Color + shape picks out one object: each (color, shape) pair occurs once per scene.
    return f"{obj.color} {obj.shape}"


def relation_caption(subject: SceneObject, predicate: str, object: SceneObject) -> str:
    """ "a red circle is left of a blue square" (the oracle's language)."""
    return f"{_with_article(_name(subject))} {predicate} {_with_article(_name(object))}"


def mirrored_pair(record: UnitsRecord, rng: random.Random) -> MirroredPair | None:
    """A mirrored pair from one world record, or None when no two objects differ in column
    or row (never, in practice: objects sit in distinct cells)."""
    scene = scene_from_record(record)
    objects = scene.objects
    options = [
        (a, b, axis)
        for a in range(len(objects))
        for b in range(a + 1, len(objects))
        for axis, differs in (
            ("x", objects[a].col != objects[b].col),
            ("y", objects[a].row != objects[b].row),
        )
        if differs
    ]
    if not options:
        return None
    a, b, axis = rng.choice(options)
    first, second = objects[a], objects[b]
    if axis == "x":
        predicate = rng.choice((LEFT, RIGHT))
        # Order subject and object so that the predicate holds of scene A.
        holds = (first.col < second.col) == (predicate == LEFT)
    else:
        predicate = rng.choice((ABOVE, BELOW))
        holds = (first.row < second.row) == (predicate == ABOVE)
    subject, object = (first, second) if holds else (second, first)
    mirrored = mirror_scene(scene, axis)
    return MirroredPair(
        pair_id=f"{record.image_id}/mirror-{axis}",
        image_id=record.image_id,
        scene_a=scene,
        scene_b=mirrored,
        caption_a=relation_caption(subject, predicate, object),
        caption_b=relation_caption(object, predicate, subject),
        image_a=render_png(scene),
        image_b=render_png(mirrored),
    )


def build_mirrored_pairs(
    records: Iterable[UnitsRecord], seed: int = 0, max_pairs: int = 200
) -> list[MirroredPair]:
    """Up to `max_pairs` mirrored pairs, one per world record (those with meta['scene']),
    in record order; each record's choice is seeded by (seed, image_id)."""
    pairs: list[MirroredPair] = []
    for record in records:
        if len(pairs) >= max_pairs:
            break
        if not record.meta.get("scene"):
            continue
        pair = mirrored_pair(record, random.Random(f"{seed}/mirror/{record.image_id}"))
        if pair is not None:
            pairs.append(pair)
    return pairs


REPLACE_TYPES = (ChangeType.ATTRIBUTE_CHANGE, ChangeType.OBJECT_CHANGE)


def replace_item(record: UnitsRecord, rng: random.Random) -> ReplaceItem | None:
    """The caption with one entity replaced in place by one of its attribute or object
    foils (foils the scene makes false), or None when the record has none usable."""
    options = [
        (unit.text, foil)
        for unit in record.entities
        for foil in unit.foils
        if foil.change_type in REPLACE_TYPES
        and contains_phrase(record.caption, unit.text)
        and not contains_phrase(record.caption, foil.text)
    ]
    if not options:
        return None
    text, foil = rng.choice(options)
    foil_caption = record.caption.replace(text, foil.text, 1)
    if foil_caption == record.caption:
        return None
    return ReplaceItem(record.image_id, record.caption, foil_caption, str(foil.change_type))


def build_replace_items(
    records: Iterable[UnitsRecord], seed: int = 0, max_items: int = 200
) -> list[ReplaceItem]:
    """Up to `max_items` replace items, one per record that has a usable foil."""
    items: list[ReplaceItem] = []
    for record in records:
        if len(items) >= max_items:
            break
        item = replace_item(record, random.Random(f"{seed}/replace/{record.image_id}"))
        if item is not None:
            items.append(item)
    return items

"""Scenes: 2-4 objects (shape, color, size) in the cells of a coarse grid. The scene is
the truth: `Scene.holds(text)` judges world-language text against it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from csclip.config.world import SIZES, WorldConfig
from csclip.errors import DataError
from csclip.units import UnitsRecord
from csclip.world.truth import statement_holds


@dataclass(frozen=True)
class SceneObject:
    """One object. `row`/`col` are grid cells (row 0 at the top); `dx`/`dy` are its pixel
    offset from the cell centre (rendering only: relations use cells)."""

    shape: str
    color: str
    size: str
    row: int
    col: int
    dx: int = 0
    dy: int = 0


@dataclass(frozen=True)
class Scene:
    """A grid of objects; each (color, shape) pair occurs at most once."""

    objects: tuple[SceneObject, ...]
    grid_size: int
    image_size: int

    def holds(self, text: str) -> bool:
        """Whether world-language `text` is true of this scene, e.g. "red circle",
        "large blue square", "red circle is not above blue square", "A and B".

        Raises:
            WorldLanguageError: `text` is outside the world's language.
        """
        return statement_holds(text, self.objects)

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces): same scene, same string."""
        data = {"grid_size": self.grid_size, "image_size": self.image_size,
                "objects": [vars(o) for o in self.objects]}  # flat: no deep copy needed
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_json(text: str) -> Scene:
        """Inverse of to_json."""
        data = json.loads(text)
        return Scene(tuple(SceneObject(**o) for o in data["objects"]), data["grid_size"],
                     data["image_size"])


def scene_from_record(record: UnitsRecord) -> Scene:
    """The scene stored in a world record's `meta["scene"]`.

    Raises:
        DataError: the record is not from the synthetic world.
    """
    text = record.meta.get("scene")
    if not text:
        raise DataError(f"record {record.sample_id!r} has no meta['scene']; only synthetic-world "
                        "records (source='gold' from csclip.world) carry a scene")
    try:
        return Scene.from_json(text)
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"record {record.sample_id!r}: meta['scene'] is not a valid scene "
                        f"({err})") from err


def sample_scene(config: WorldConfig, rng: random.Random) -> Scene:
    """Draw a scene: distinct cells, distinct (color, shape) pairs, random sizes."""
    num_objects = rng.randint(config.min_objects, config.max_objects)
    cells = rng.sample(range(config.grid_size**2), num_objects)
    pairs = rng.sample([(c, s) for c in config.colors for s in config.shapes], num_objects)
    cell_px = config.image_size / config.grid_size
    objects = []
    for cell, (color, shape) in zip(cells, pairs, strict=True):
        size = rng.choice(SIZES)
        # Free room between the object's extent and the cell border, times the jitter.
        room = int(cell_px * (0.5 - object_radius_fraction(size)) * config.position_jitter)
        objects.append(SceneObject(shape, color, size, row=cell // config.grid_size,
                                   col=cell % config.grid_size,
                                   dx=rng.randint(-room, room), dy=rng.randint(-room, room)))
    return Scene(tuple(objects), config.grid_size, config.image_size)


def object_radius_fraction(size: str) -> float:
    """Half-extent of an object as a fraction of its cell: large objects fill most of the
    cell, small ones about half of that, so the two sizes differ clearly."""
    return 0.42 if size == "large" else 0.22

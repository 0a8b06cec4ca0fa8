"""The synthetic world (issue 2, part 4): seeded scenes of 2-4 shapes on a grid, rendered
to PNG, captioned, with gold entity/relation units and oracle-checked foils.

Pure: importing this package never imports ray (the Ray source is `csclip.world.ray_source`).
"""

from csclip.world.config import ANTONYMS, PALETTE, PREDICATES, SHAPES, SIZES, SPLITS, WorldConfig
from csclip.world.generate import iter_world, sample_seed, world_record
from csclip.world.scene import Scene, SceneObject, scene_from_record
from csclip.world.truth import WorldLanguageError, parse_statement

__all__ = [
    "ANTONYMS", "PALETTE", "PREDICATES", "SHAPES", "SIZES", "SPLITS", "Scene", "SceneObject",
    "WorldConfig", "WorldLanguageError", "iter_world", "parse_statement", "sample_seed",
    "scene_from_record", "world_record",
]

"""The synthetic world: seeded scenes of 2-4 shapes on a grid, rendered
to PNG, captioned, with gold entity/relation units and oracle-checked foils.

Pure: importing this package never imports ray (the Ray source is `csclip.world.ray_source`).
"""

from csclip.config.world import ANTONYMS, PALETTE, PREDICATES, SHAPES, SIZES, SPLITS, WorldConfig
from csclip.world.generate import iter_world, sample_seed, world_record
from csclip.world.scene import Scene, SceneObject, scene_from_record
from csclip.world.summary import WorldSummary, format_summary, summarize
from csclip.world.truth import WorldLanguageError, parse_statement
from csclip.world.writer import (
    iter_world_split,
    read_world_config,
    read_world_split,
    write_world,
)

__all__ = [
    "ANTONYMS", "PALETTE", "PREDICATES", "SHAPES", "SIZES", "SPLITS", "Scene", "SceneObject",
    "WorldConfig", "WorldLanguageError", "WorldSummary", "format_summary", "iter_world",
    "iter_world_split", "parse_statement", "read_world_config", "read_world_split",
    "sample_seed", "scene_from_record", "summarize", "world_record", "write_world",
]

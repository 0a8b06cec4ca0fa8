"""World records, streamed: each sample comes from its own RNG seeded by (seed, split,
index), so any index can be generated alone, in any process, in any order."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Iterator

from csclip.config.world import SPLITS, WorldConfig
from csclip.units import UnitsRecord
from csclip.world.captions import describe
from csclip.world.render import render_png
from csclip.world.scene import sample_scene


def sample_seed(seed: int, split: str, index: int) -> int:
    """A 64-bit seed for one sample. A hash (not seed + index) so that neighbouring
    samples and splits do not share RNG streams."""
    digest = hashlib.blake2b(f"csclip-world/{seed}/{split}/{index}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little")


def sample_id(split: str, index: int) -> str:
    return f"world-{split}-{index:07d}"


def world_record(config: WorldConfig, split: str, index: int) -> UnitsRecord:
    """Sample `index` of `split`: a scene rendered to PNG, its caption and gold units.

    The record has `source="gold"`, the PNG in `image_bytes`, the scene as JSON in
    `meta["scene"]` (see `scene_from_record`) and the caption template in
    `meta["template"]`.

    Raises:
        ConfigError: `split` is not train, val or test.
    """
    config.num_samples(split)  # validates the split name
    rng = random.Random(sample_seed(config.seed, split, index))
    scene = sample_scene(config, rng)
    described = describe(scene, config, rng)
    name = sample_id(split, index)
    return UnitsRecord(
        sample_id=name, image_id=name, caption=described.caption, split=split,
        entities=described.entities, relations=described.relations,
        image_bytes=render_png(scene), source="gold",
        meta={"scene": scene.to_json(), "template": described.template},
    )


def iter_world(config: WorldConfig, splits: Iterable[str] = SPLITS) -> Iterator[UnitsRecord]:
    """Every record of `splits`, in order, one at a time (never all in memory)."""
    for split in splits:
        for index in range(config.num_samples(split)):
            yield world_record(config, split, index)

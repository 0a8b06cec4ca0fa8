"""The world as a Ray Data source: `ray.data.range(n)` mapped to units-table rows, so a
pipeline reads the world exactly as it reads a units table written from COCO.

This is the only module of `csclip.world` that imports ray.
"""

from __future__ import annotations

import pyarrow as pa
import ray

from csclip.config.world import WorldConfig
from csclip.units import records_to_table
from csclip.world.generate import world_record


def generate_batch(batch: dict, config: dict, split: str) -> pa.Table:
    """Map a batch of `id`s (from `ray.data.range`) to world rows in UNITS_SCHEMA.

    `config` is `WorldConfig.model_dump()`: plain data crosses the Ray boundary and is
    validated again here.
    """
    world = WorldConfig.model_validate(config)
    return records_to_table(world_record(world, split, int(i)) for i in batch["id"])


def world_dataset(config: WorldConfig, split: str, *, batch_size: int = 256,
                  num_blocks: int | None = None) -> ray.data.Dataset:
    """A lazy Ray Dataset of the `split` samples in the units-table layout
    (`csclip.units.UNITS_SCHEMA`; decode rows with `csclip.units.record_from_row`).

    Rows are generated inside Ray tasks from their index alone, so the dataset streams
    and any block can be recomputed. Raises ConfigError for an unknown split.
    """
    count = config.num_samples(split)
    dataset = ray.data.range(count, override_num_blocks=num_blocks)
    return dataset.map_batches(generate_batch, batch_size=batch_size, batch_format="numpy",
                               fn_kwargs={"config": config.model_dump(mode="json"),
                                          "split": split})

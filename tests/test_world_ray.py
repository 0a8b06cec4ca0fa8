"""The world as a Ray Data source yields exactly the records the generator makes."""

from __future__ import annotations

from csclip.config.world import WorldConfig
from csclip.units import UNITS_SCHEMA, record_from_row
from csclip.world import iter_world


def test_world_dataset_matches_the_generator(ray_session):
    from csclip.world.ray_source import world_dataset

    config = WorldConfig(seed=7, image_size=32, num_train=0, num_val=9, num_test=0)
    dataset = world_dataset(config, "val", batch_size=4, num_blocks=3)
    assert dataset.schema().base_schema.equals(UNITS_SCHEMA)
    records = sorted((record_from_row(row) for row in dataset.take_all()),
                     key=lambda r: r.sample_id)
    assert records == list(iter_world(config, ["val"]))

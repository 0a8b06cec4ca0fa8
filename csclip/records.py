"""The units records every stage reads: one split of a units table (local or s3://) or of
the synthetic world. Evaluation, the ablation, the demo and evaluation during training
load their split here, so none of them imports the training program to read data."""

from __future__ import annotations

import pyarrow.parquet as pq

from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.storage import filesystem_for
from csclip.units import (
    UNITS_SCHEMA,
    UnitsRecord,
    check_units_table,
    table_to_records,
    units_table_uri,
)
from csclip.world import iter_world


def load_split(units_uri: str | None, split: str, world: WorldConfig, *,
               split_setting: str = "--set data.split=NAME") -> list[UnitsRecord]:
    """The records of one split: read from a units table (local or s3://; only that
    split's rows are read) or, when units_uri is None, generated from the synthetic world.

    Raises ConfigError for a split the world does not have, DataError for a missing table
    or an empty split (naming the splits that are present and `split_setting`, how the
    caller's command chooses another: evaluate's field, benchmark build's --split).
    """
    if units_uri is None:
        if split not in ("train", "val", "test"):
            raise ConfigError(f"split {split!r}: the synthetic world has train, val, test")
        records = list(iter_world(world, splits=(split,)))
        if not records:
            raise DataError(f"the synthetic world (seed {world.seed}) has no records in split {split!r}; "
                            f"raise data.world.num_{split}")
        return records


    units_uri = units_table_uri(units_uri)  # an extraction's --out folder: its units/
    fs, path = filesystem_for(units_uri)
    check_units_table(fs, path, units_uri)  # unfinished, unreadable, another schema
    try:
        table = pq.read_table(path, filesystem=fs, schema=UNITS_SCHEMA,
                              filters=[("split", "=", split)])
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"units table not found or unreadable: {units_uri} ({err})") from err
    if table.num_rows == 0:
        present = sorted(set(pq.read_table(path, filesystem=fs, columns=["split"])
                             .column("split").to_pylist()))
        raise DataError(f"{units_uri}: no records in split {split!r} (splits present: "
                        f"{present or 'none'}); choose one with {split_setting} or add "
                        f"{split!r} rows")
    return table_to_records(table)

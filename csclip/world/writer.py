"""The world as a units table: sharded Parquet under `{uri}/{split}/part-XXXXX.parquet`
(local path or s3://), written one row group at a time so memory stays flat."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from csclip.config.world import SPLITS, WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.storage import filesystem_for, is_dir, join, list_files, read_bytes, write_bytes_atomic
from csclip.units import UNITS_SCHEMA, UnitsRecord, record_from_row, records_to_table
from csclip.world.generate import world_record
from csclip.world.summary import SummaryBuilder, WorldSummary

logger = logging.getLogger(__name__)
CONFIG_FILE = "_world_config.json"  # leading "_": Parquet dataset readers skip it


def _resolve(uri: str, filesystem: pafs.FileSystem | None) -> tuple[pafs.FileSystem, str]:
    if filesystem is None:
        return filesystem_for(uri)
    return filesystem, uri.removeprefix("s3://").removeprefix("file://").rstrip("/")


def write_world(config: WorldConfig, uri: str, *, rows_per_file: int = 10_000,
                row_group_size: int = 1_000, splits: Iterable[str] = SPLITS,
                filesystem: pafs.FileSystem | None = None,
                num_examples: int = 3) -> WorldSummary:
    """Generate the world and write it as sharded Parquet in `UNITS_SCHEMA`.

    Files: `{uri}/{split}/part-00000.parquet`, ... (`rows_per_file` rows each) and
    `{uri}/_world_config.json`. Old `part-*.parquet` files of the written splits are
    removed first, so a smaller rerun leaves no stale shards. Only one row group
    (`row_group_size` records, PNG bytes included) is in memory at a time. Same config,
    same bytes.

    Args:
        uri: a local directory or `s3://bucket/prefix` (endpoint from AWS_ENDPOINT_URL).
        filesystem: a pyarrow filesystem to use instead of the one the URI implies.
        num_examples: records kept in the summary as examples.

    Returns:
        The summary of what was written, with the file paths.
    """
    if rows_per_file < 1 or row_group_size < 1:
        raise ConfigError(f"rows_per_file ({rows_per_file}) and row_group_size "
                          f"({row_group_size}) must be >= 1")
    fs, root = _resolve(uri, filesystem)
    splits = tuple(splits)
    totals = {split: config.num_samples(split) for split in splits}  # validates split names
    write_bytes_atomic(fs, join(root, CONFIG_FILE),
                       json.dumps(config.model_dump(mode="json"), sort_keys=True).encode())
    builder, files = SummaryBuilder(num_examples=num_examples), []
    for split in splits:
        directory = join(root, split)
        fs.create_dir(directory, recursive=True)
        for stale in list_files(fs, directory, ".parquet"):
            fs.delete_file(stale)
        for shard, start in enumerate(range(0, totals[split], rows_per_file)):
            stop = min(start + rows_per_file, totals[split])
            path = join(directory, f"part-{shard:05d}.parquet")
            _write_shard(config, split, range(start, stop), path, fs, row_group_size, builder)
            files.append(path)
            logger.info("world %s: %d/%d samples written (%s)", split, stop, totals[split], path)
    return builder.build(files=files, uri=uri)


def _write_shard(config: WorldConfig, split: str, indices: range, path: str,
                 fs: pafs.FileSystem, row_group_size: int, builder: SummaryBuilder) -> None:
    with pq.ParquetWriter(path, UNITS_SCHEMA, filesystem=fs) as writer:
        for start in range(indices.start, indices.stop, row_group_size):
            records = [world_record(config, split, i)
                       for i in range(start, min(start + row_group_size, indices.stop))]
            for record in records:
                builder.add(record)
            writer.write_table(records_to_table(records), row_group_size=len(records))


def iter_world_split(uri: str, split: str, *, batch_size: int = 256,
                     filesystem: pafs.FileSystem | None = None) -> Iterator[UnitsRecord]:
    """Stream the records of one written split, shard by shard, in sample order.

    Raises:
        DataError: `{uri}/{split}` holds no Parquet shards.
    """
    fs, root = _resolve(uri, filesystem)
    directory = join(root, split)
    paths = list_files(fs, directory, ".parquet") if is_dir(fs, directory) else []
    if not paths:
        raise DataError(f"no world shards under {uri}/{split}; run write_world(config, "
                        f"{uri!r}) first")
    for path in paths:  # part-00000, part-00001, ...: sorted = sample order
        with fs.open_input_file(path) as handle:
            for batch in pq.ParquetFile(handle).iter_batches(batch_size=batch_size):
                yield from (record_from_row(row) for row in batch.to_pylist())


def read_world_split(uri: str, split: str, *,
                     filesystem: pafs.FileSystem | None = None) -> list[UnitsRecord]:
    """All records of one written split (see iter_world_split for streaming)."""
    return list(iter_world_split(uri, split, filesystem=filesystem))


def read_world_config(uri: str, *, filesystem: pafs.FileSystem | None = None) -> WorldConfig:
    """The WorldConfig a world directory was written with."""
    fs, root = _resolve(uri, filesystem)
    return WorldConfig.model_validate_json(read_bytes(fs, join(root, CONFIG_FILE)))

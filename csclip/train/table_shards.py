"""A units table trained on as webdataset shards: training has one data path at scale.

A run on a units table (`data.units_uri` without `data.shards`: an extraction over COCO,
a CSV, ...) does not read the table in a global shuffle every epoch. Once per table, split,
image root, model and transform, its rows are written as shards (csclip.shards.write, as
`csclip shards` writes them: the samples permuted once by the run's seed and cut into
shards, every image decoded once) with each shard's units beside them, in the layout of
`csclip extract --format webdataset` (units/{stem}.parquet, _done/{stem}.json,
_complete.json). Training then reads them as any shards (csclip.train.shards): shards
permuted per epoch and a bounded buffer, no all-to-all.

The images are stored as the eval transform's uint8 pixels (encoding `pixels`: decoded
once, an epoch reads them), or as their files (encoding `original`) where an epoch needs
the decoded image itself: data.augment, image foils, the layout warm start.

The folder is `<units folder's parent>/train_shards/<key>/` (local or s3://); the key
hashes the table's bytes and every setting above, so a changed table is written again,
never silently reused. It counts as written once its _complete.json is there
(last). One run writes it at a time (csclip.ownership's lease); another run that needs it
waits and reads it. An image that is missing or cannot be read stops the run, naming it
(a wrong image root must not shrink the data); one that does not decode, or a row with no
image, is counted and left out, as rejects.parquet records.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import time

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

from csclip.config.shards import ShardsOutputConfig
from csclip.config.train import DataConfig
from csclip.errors import DataError
from csclip.ownership import Lease, acquire_lease, release_lease
from csclip.preprocess import image_pixels
from csclip.shards.write import (
    MISSING_IMAGE,
    REJECTS_FILE,
    UNREADABLE_IMAGE,
    PixelEncoding,
    read_manifest,
    shard_samples,
    write_shards,
)
from csclip.storage import exists, filesystem_for, join, read_bytes, write_bytes_atomic
from csclip.train.shards import UNIT_COLUMNS
from csclip.train.stream import image_shape, preprocess_key
from csclip.units import (
    EXTRACTION_COMPLETE,
    EXTRACTION_DONE_DIR,
    UNITS_SCHEMA,
    check_units_table,
    units_table_uri,
)

__all__ = ["TableShards", "table_shards", "table_shards_key", "units_digest"]

logger = logging.getLogger(__name__)

TABLE_SHARDS_DIR = "train_shards"
SHARDS_DIR = "shards"
UNITS_DIR = "units"
# The layout written here and how its images are stored; a change must not reuse folders
# written before it, so it is part of the key.
FORMAT = 1
SAMPLES_PER_SHARD = 1000
# Rejections that stop the run: the image is not there to decode (a wrong image root, an
# unreachable store), which must not shrink the data.
FATAL_REJECTS = (MISSING_IMAGE, UNREADABLE_IMAGE)
MAX_LISTED = 20


def units_digest(units_uri: str) -> str:
    """sha256 of the units table's Parquet files (names relative to it, and bytes), in the
    order a reader lists them: the content the key covers."""
    fs, path = filesystem_for(units_uri)
    try:
        files = sorted(pads.dataset(path, filesystem=fs, format="parquet").files)
    except (FileNotFoundError, OSError, pa.ArrowInvalid) as err:
        raise DataError(f"data.units_uri: cannot read {units_uri} ({err})") from err
    digest = hashlib.sha256()
    for file in files:
        digest.update(posixpath.relpath(file, path).encode() + b"\0")
        with fs.open_input_stream(file) as stream:
            while chunk := stream.read(8 << 20):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def table_shards_key(units_sha256: str, data: DataConfig, encoding: str, seed: int,
                     preprocess_cfg: dict | None, model_name: str | None) -> str:
    """24 hex digits naming a units table's shards: the table's content, the split, the
    image root, the encoding, the permutation's seed and (encoding pixels) the transform
    and model."""
    text = json.dumps({"format": FORMAT, "units": units_sha256, "split": data.split,
                       "image_root": data.image_root, "encoding": encoding, "seed": seed,
                       "preprocess": preprocess_cfg, "model": model_name},
                      sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def table_shards_uri(units_uri: str, key: str) -> str:
    """`train_shards/<key>` in the folder that holds the units table (an extraction's
    output folder for its units/)."""
    if "://" in units_uri:
        parent = units_uri.rstrip("/").rsplit("/", 1)[0]
    else:
        parent = posixpath.dirname(filesystem_for(units_uri)[1].rstrip("/"))
    return posixpath.join(parent, TABLE_SHARDS_DIR, key)


class TableShards:
    """A units table's shards: the data.shards pattern and data.units_uri to train on,
    and what writing them rejected (by reason)."""

    def __init__(self, uri: str, num_shards: int, rejected: dict[str, int], reused: bool):
        self.uri = uri
        self.num_shards = num_shards
        self.rejected = rejected
        self.reused = reused

    @property
    def pattern(self) -> str:
        last = self.num_shards - 1
        names = f"{{00000..{last:05d}}}" if last else "00000"
        return join(self.uri, SHARDS_DIR, f"{names}.tar")

    @property
    def units_uri(self) -> str:
        """The units as an extraction over the shards lays them out (its --out folder)."""
        return self.uri

    def data(self, data: DataConfig) -> DataConfig:
        """`data` reading these shards instead of the table."""
        return data.model_copy(update={"shards": self.pattern, "units_uri": self.units_uri,
                                       "image_root": None})


def encoding_for(data: DataConfig, needs_decoded_image: bool) -> str:
    """`pixels` (decoded once) unless every epoch needs the decoded image itself."""
    return "original" if data.augment or needs_decoded_image else "pixels"


def table_shards(data: DataConfig, *, seed: int, preprocess_cfg: dict, model_name: str,
                 needs_decoded_image: bool = False) -> TableShards:
    """The shards of `data`'s units table (split data.split): found under their key, or
    written now. needs_decoded_image: the objective reads the decoded image every epoch
    (image foils, the layout warm start).

    Raises DataError for an unreadable table, no rows in the split, or images that are
    missing or unreadable."""
    units_uri = units_table_uri(data.units_uri)
    fs, path = filesystem_for(units_uri)
    check_units_table(fs, path, units_uri)
    encoding = encoding_for(data, needs_decoded_image)
    pixels = encoding == "pixels"
    key = table_shards_key(units_digest(units_uri), data, encoding, seed,
                           preprocess_cfg if pixels else None, model_name if pixels else None)
    uri = table_shards_uri(units_uri, key)
    found = _finished(uri)
    if found is None:
        lease = _lease_or_wait(uri)
        if isinstance(lease, Lease):
            try:
                found = _finished(uri) or _write(data, units_uri, uri, encoding, seed,
                                                 preprocess_cfg, model_name)
            finally:
                release_lease(lease)
        else:
            found = lease
    else:
        logger.info("%s (split %s) is written as shards already: %s", units_uri, data.split, uri)
    _refuse_missing(found, uri)
    return found


def _finished(uri: str) -> TableShards | None:
    fs, path = filesystem_for(uri)
    if not exists(fs, join(path, EXTRACTION_COMPLETE)):
        return None
    manifest = read_manifest(join(uri, SHARDS_DIR))
    if manifest is None:
        return None
    return TableShards(uri, len(manifest["shards"]), dict(manifest["rejected"]), reused=True)


def _lease_or_wait(uri: str, poll_s: float = 2.0) -> Lease | TableShards:
    """The lease on the folder (one writer at a time), or, while another run holds it, its
    result once written. A holder that dies is taken over when its lease expires
    (csclip.ownership)."""
    waiting = False
    while True:
        try:
            lease = acquire_lease(uri, "csclip train: writing a units table as shards")
        except DataError as held:
            if not waiting:
                logger.info("waiting for another run to write these shards: %s", held)
                waiting = True
            time.sleep(poll_s)
        else:
            return lease
        found = _finished(uri)
        if found is not None:
            return found


def _write(data: DataConfig, units_uri: str, uri: str, encoding: str, seed: int,
           preprocess_cfg: dict, model_name: str) -> TableShards:
    """The table's split written as shards, then each shard's units, then the marker."""
    started = time.perf_counter()
    rows = _split_rows(units_uri, data)
    logger.info("writing %d rows of %s (split %s) as webdataset shards (%s), once for every "
                "run: %s", len(rows), units_uri, data.split, encoding, uri)
    output = ShardsOutputConfig(uri=join(uri, SHARDS_DIR), samples_per_shard=SAMPLES_PER_SHARD,
                                seed=seed, encoding=encoding)
    pixels = None
    if encoding == "pixels":
        pixels = PixelEncoding(model=model_name, shape=image_shape(preprocess_cfg),
                               preprocess=preprocess_cfg,
                               transform=image_pixels(preprocess_key(preprocess_cfg)))
    images = [{key: row.get(key) for key in ("sample_id", "image_id", "caption", "split",
                                             "image_path", "image_bytes")} for row in rows]
    summary = write_shards(images, output, image_root=data.image_root, pixels=pixels,
                           config=data)
    fs, path = filesystem_for(uri)
    shards_fs, shards_path = filesystem_for(output.uri)
    rejects = pq.read_table(io.BytesIO(read_bytes(shards_fs, join(shards_path, REJECTS_FILE))))
    rejected = set(rejects.column("sample_id").to_pylist())
    by_id = {row["sample_id"]: row for row in rows}
    for stem, ids in shard_samples([row["sample_id"] for row in rows], output).items():
        kept = [by_id[i] for i in ids if i not in rejected]
        table = pa.Table.from_pylist(kept, schema=UNITS_SCHEMA).select(UNIT_COLUMNS)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        write_bytes_atomic(fs, join(path, UNITS_DIR, f"{stem}.parquet"), sink.getvalue())
        write_bytes_atomic(fs, join(path, EXTRACTION_DONE_DIR, f"{stem}.json"),
                           json.dumps({"read": len(ids), "with_units": len(kept)}).encode())
    write_bytes_atomic(fs, join(path, EXTRACTION_COMPLETE), json.dumps({
        "units_uri": units_uri, "split": data.split, "num_read": summary.num_read,
        "num_written": summary.num_written, "rejected": summary.rejected}, indent=1).encode())
    logger.info("wrote %d shards of %d rows (%d rejected) in %.1f s", summary.num_shards,
                summary.num_written, sum(summary.rejected.values()),
                time.perf_counter() - started)
    return TableShards(uri, summary.num_shards, dict(summary.rejected), reused=False)


def _split_rows(units_uri: str, data: DataConfig) -> list[dict]:
    """The table's rows of data.split, their relative image paths joined to
    data.image_root (a path leaving it is rejected by the writer, which checks it)."""
    fs, path = filesystem_for(units_uri)
    try:
        table = pads.dataset(path, filesystem=fs, format="parquet", schema=UNITS_SCHEMA
                             ).to_table(filter=pads.field("split") == data.split)
    except (FileNotFoundError, OSError, pa.ArrowInvalid) as err:
        raise DataError(f"data.units_uri: cannot read {units_uri} ({err})") from err
    if not table.num_rows:
        raise DataError(f"data.units_uri: {units_uri} has no rows of split {data.split!r} "
                        "(data.split)")
    rows = table.to_pylist()
    if data.image_root is not None:
        for row in rows:
            if row.get("image_path"):
                row["image_path"] = posixpath.join(data.image_root, row["image_path"])
    return rows


def _refuse_missing(found: TableShards, uri: str) -> None:
    """DataError naming the images that are missing or unreadable; a warning for those
    that do not decode or are outside the image root (counted, left out)."""
    fatal = {reason: n for reason, n in found.rejected.items() if reason in FATAL_REJECTS}
    shards_uri = join(uri, SHARDS_DIR)
    if fatal:
        fs, path = filesystem_for(shards_uri)
        rejects = pq.read_table(io.BytesIO(read_bytes(fs, join(path, REJECTS_FILE))))
        example = next(row for row in rejects.to_pylist() if row["reason"] in FATAL_REJECTS)
        raise DataError(f"{sum(fatal.values())} images of the units table cannot be read "
                        f"({', '.join(f'{r} {n}' for r, n in sorted(fatal.items()))}), e.g. "
                        f"{example['detail']}; check the units' image_path and data.image_root "
                        f"(train --image-root). All rejects: {join(shards_uri, REJECTS_FILE)}")
    dropped = sum(found.rejected.values())
    if dropped:
        logger.warning("%d rows of the units table are left out (%s): %s", dropped,
                       ", ".join(f"{r} {n}" for r, n in sorted(found.rejected.items())),
                       join(shards_uri, REJECTS_FILE))

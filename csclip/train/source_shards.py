"""The world and units tables trained on as webdataset shards: training has one data path.

A run on a units table (`data.units_uri` without `data.shards`: an extraction over COCO,
a CSV, ...) or on the synthetic world does not read its rows in a global shuffle every
epoch. Once per source, split, model and transform, its rows are written as shards
(csclip.shards.write, as `csclip shards` writes them: the samples permuted once by the
run's seed and cut into shards, every image decoded once) with each shard's units beside
them, in the layout of `csclip extract --format webdataset` (units/{stem}.parquet,
_done/{stem}.json, _complete.json). Training then reads them as any shards
(csclip.train.shards): shards permuted per epoch and a bounded buffer, no all-to-all.

The images are stored as the eval transform's uint8 pixels (encoding `pixels`: decoded
once, an epoch reads them), with every sample's image-foil candidates rendered and
transformed once where the objective draws image foils (always for the world, whose warm
start and pretraining share one world), or as their files (encoding `original`) with
data.augment, which draws a new crop every epoch.

A units table's folder is `<units folder's parent>/train_shards/<key>/`, the world's
`<run.storage_path>/world_shards/<key>/` (local or s3://); the key hashes the table's
bytes (the world's config) and every setting above, so a changed source is written again,
never silently reused. It counts as written once its _complete.json is there (last). One
run writes it at a time (csclip.ownership's lease); another run that needs it waits and
reads it. An image that is missing or cannot be read stops the run, naming it (a wrong
image root must not shrink the data); one that does not decode, or a row with no image,
is counted and left out, as rejects.parquet records.
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
from csclip.train.shard_members import foil_candidate_members
from csclip.train.shards import UNIT_COLUMNS
from csclip.train.stream import image_shape, preprocess_key
from csclip.units import (
    EXTRACTION_COMPLETE,
    EXTRACTION_DONE_DIR,
    UNITS_SCHEMA,
    check_units_table,
    record_from_row,
    records_to_table,
    units_table_uri,
)
from csclip.world.generate import world_record

__all__ = ["SourceShards", "source_shards", "source_shards_key", "units_digest"]

logger = logging.getLogger(__name__)

TABLE_SHARDS_DIR = "train_shards"
WORLD_SHARDS_DIR = "world_shards"
# World rows rendered in the driver at a time.
WORLD_CHUNK = 1000
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


def source_shards_key(source: dict, data: DataConfig, encoding: str, seed: int,
                      image_foils: bool, preprocess_cfg: dict | None,
                      model_name: str | None) -> str:
    """24 hex digits naming a source's shards: the source (a units table's content, or
    the world's config), the split, the image root, the encoding, the permutation's seed,
    whether they hold image-foil candidates and (encoding pixels) the transform and
    model."""
    text = json.dumps({"format": FORMAT, **source, "split": data.split,
                       "image_root": data.image_root, "encoding": encoding, "seed": seed,
                       "image_foils": image_foils, "preprocess": preprocess_cfg,
                       "model": model_name}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def table_shards_parent(units_uri: str) -> str:
    """The folder that holds the units table (an extraction's output folder for its
    units/): its shards go to `train_shards/<key>` there."""
    if "://" in units_uri:
        return units_uri.rstrip("/").rsplit("/", 1)[0]
    return posixpath.dirname(filesystem_for(units_uri)[1].rstrip("/"))


class SourceShards:
    """A source's shards: the data.shards pattern and data.units_uri to train on, and what
    writing them rejected (by reason)."""

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
        """`data` reading these shards instead of its source."""
        return data.model_copy(update={"shards": self.pattern, "units_uri": self.units_uri,
                                       "image_root": None})


def source_shards(data: DataConfig, *, seed: int, preprocess_cfg: dict, model_name: str,
                  image_foils: bool = False, storage_root: str | None = None) -> SourceShards:
    """The shards of `data`'s source (split data.split): its units table, or without one
    the world; found under their key, or written now. image_foils: the objective draws
    image foils (their candidates are written beside the pixels). storage_root: where the
    world's shards go (run.storage_path, absolute).

    Raises DataError for an unreadable table, no rows in the split, or images that are
    missing or unreadable."""
    encoding = "original" if data.augment else "pixels"
    pixels = encoding == "pixels"
    if data.units_uri is not None:
        units_uri = units_table_uri(data.units_uri)
        fs, path = filesystem_for(units_uri)
        check_units_table(fs, path, units_uri)
        source = {"units": units_digest(units_uri)}
        foils = pixels and image_foils
        where, parent = units_uri, table_shards_parent(units_uri)
        folder = TABLE_SHARDS_DIR
    else:
        if storage_root is None:
            raise ValueError("the world's shards need a storage root")
        units_uri = None
        source = {"world": data.world.model_dump(mode="json")}
        foils = pixels  # the warm start and the pretraining share one world's shards
        where, parent = f"the world (seed {data.world.seed})", storage_root.rstrip("/")
        folder = WORLD_SHARDS_DIR
    key = source_shards_key(source, data, encoding, seed, foils,
                            preprocess_cfg if pixels else None, model_name if pixels else None)
    uri = join(parent, folder, key)
    found = _finished(uri)
    if found is None:
        lease = _lease_or_wait(uri)
        if isinstance(lease, Lease):
            try:
                found = _finished(uri) or _write(data, units_uri, where, uri, encoding, seed,
                                                 preprocess_cfg, model_name, foils)
            finally:
                release_lease(lease)
        else:
            found = lease
    else:
        logger.info("%s (split %s) is written as shards already: %s", where, data.split, uri)
    _refuse_missing(found, uri)
    return found


def _finished(uri: str) -> SourceShards | None:
    fs, path = filesystem_for(uri)
    if not exists(fs, join(path, EXTRACTION_COMPLETE)):
        return None
    manifest = read_manifest(join(uri, SHARDS_DIR))
    if manifest is None:
        return None
    return SourceShards(uri, len(manifest["shards"]), dict(manifest["rejected"]), reused=True)


def _lease_or_wait(uri: str, poll_s: float = 2.0) -> Lease | SourceShards:
    """The lease on the folder (one writer at a time), or, while another run holds it, its
    result once written. A holder that dies is taken over when its lease expires
    (csclip.ownership)."""
    waiting = False
    while True:
        try:
            lease = acquire_lease(uri, "csclip train: writing the training data as shards")
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


def _write(data: DataConfig, units_uri: str | None, where: str, uri: str, encoding: str,
           seed: int, preprocess_cfg: dict, model_name: str, foils: bool) -> SourceShards:
    """The source's split written as shards, then each shard's units, then the marker."""
    started = time.perf_counter()
    rows = _split_rows(units_uri, data) if units_uri is not None else _world_rows(data)
    logger.info("writing %d rows of %s (split %s) as webdataset shards (%s%s), once for every "
                "run: %s", len(rows), where, data.split, encoding,
                ", with image-foil candidates" if foils else "", uri)
    output = ShardsOutputConfig(uri=join(uri, SHARDS_DIR), samples_per_shard=SAMPLES_PER_SHARD,
                                seed=seed, encoding=encoding)
    pixels = extra = None
    by_id = {row["sample_id"]: row for row in rows}
    if encoding == "pixels":
        shape = image_shape(preprocess_cfg)
        transform = image_pixels(preprocess_key(preprocess_cfg))
        pixels = PixelEncoding(model=model_name, shape=shape, preprocess=preprocess_cfg,
                               transform=transform)
        if foils:
            def extra(row: dict, image) -> dict[str, bytes]:
                record = record_from_row(by_id[row["sample_id"]])
                return foil_candidate_members(record, image, transform, shape)
    images = [{key: row.get(key) for key in ("sample_id", "image_id", "caption", "split",
                                             "image_path", "image_bytes")} for row in rows]
    summary = write_shards(images, output, image_root=data.image_root, pixels=pixels,
                           config=data, extra_members=extra)
    fs, path = filesystem_for(uri)
    shards_fs, shards_path = filesystem_for(output.uri)
    rejects = pq.read_table(io.BytesIO(read_bytes(shards_fs, join(shards_path, REJECTS_FILE))))
    rejected = set(rejects.column("sample_id").to_pylist())
    for stem, ids in shard_samples(list(by_id), output).items():
        kept = [by_id[i] for i in ids if i not in rejected]
        table = pa.Table.from_pylist(kept, schema=UNITS_SCHEMA).select(UNIT_COLUMNS)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        write_bytes_atomic(fs, join(path, UNITS_DIR, f"{stem}.parquet"), sink.getvalue())
        write_bytes_atomic(fs, join(path, EXTRACTION_DONE_DIR, f"{stem}.json"),
                           json.dumps({"read": len(ids), "with_units": len(kept)}).encode())
    write_bytes_atomic(fs, join(path, EXTRACTION_COMPLETE), json.dumps({
        "source": where, "split": data.split, "num_read": summary.num_read,
        "num_written": summary.num_written, "rejected": summary.rejected}, indent=1).encode())
    logger.info("wrote %d shards of %d rows (%d rejected) in %.1f s", summary.num_shards,
                summary.num_written, sum(summary.rejected.values()),
                time.perf_counter() - started)
    return SourceShards(uri, summary.num_shards, dict(summary.rejected), reused=False)


def _world_rows(data: DataConfig) -> list[dict]:
    """The world's rows of data.split (UNITS_SCHEMA, PNG bytes), rendered here."""
    count = data.world.num_samples(data.split)
    rows: list[dict] = []
    for start in range(0, count, WORLD_CHUNK):
        rows.extend(records_to_table(world_record(data.world, data.split, index) for index in
                                     range(start, min(count, start + WORLD_CHUNK))).to_pylist())
    if not rows:
        raise DataError(f"the world has no samples in split {data.split!r} (data.split, "
                        "data.world)")
    return rows


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


def _refuse_missing(found: SourceShards, uri: str) -> None:
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

"""Images decoded once per run (`data.prepare_images`): the eval transform's uint8
pixels of every image, written once to a Parquet table beside the units table and read by
every epoch instead of the JPEGs.

Without augmentation the image a step sees is the same in every epoch, and the eval
transform quantises to uint8 before normalising (open_clip's ToTensor of a PIL image), so
storing the resized, cropped RGB pixels loses nothing: an epoch that normalises them gives
the streamed path's float tensors bit for bit (tests/test_prepared_images.py). The table
lives at `<units folder's parent>/prepared_images/<key>/` (local or s3://), where the key
hashes the units table's bytes, the split, the transform and the tokenizer's model: a units
table changed after preparation gets a new key and is prepared again, never silently
reused. Images named by `image_path` are taken as immutable (COCO's are); the table's bytes
are what the key covers. A table counts as prepared only once its `_prepared.json` is
written (last); a folder without it (a killed preparation) is cleared and written again.
One run writes a folder at a time (csclip.ownership's lease); another that needs the same
table waits for it and reads it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads

from csclip.config.train import DataConfig
from csclip.errors import ConfigError, DataError
from csclip.ownership import Lease, acquire_lease, release_lease
from csclip.preprocess import image_normalize, image_pixels, tokenizer
from csclip.storage import exists, filesystem_for, join, read_bytes, write_bytes_atomic
from csclip.train.stream import (
    CAPTION_TOKENS,
    DECODED,
    IMAGE_SOURCE_COLUMNS,
    PIXELS,
    decode_image,
    deterministic,
    fixed_size_list,
    image_shape,
    keep_last,
    preprocess_key,
    read_units_parquet,
    source_dataset,
    text_rows,
    wait_for_a_free_cpu,
)
from csclip.units import units_table_uri

if TYPE_CHECKING:
    from csclip.loss import Objective

logger = logging.getLogger(__name__)

PREPARED_DIR = "prepared_images"
ROWS_DIR = "rows"
MANIFEST = "_prepared.json"
# The prepared table's layout and the decoding it holds; a change here must not reuse
# tables written before it, so it is part of the key.
FORMAT = 2  # 2: rows carry the stored caption shuffles (text_rows' meta)
MAX_LISTED_FAILURES = 20
ROWS_PER_BLOCK = 512


@dataclass(frozen=True)
class PreparedImages:
    """A prepared table: where it is and what preparing it found (its _prepared.json)."""

    uri: str  # the folder holding rows/ and _prepared.json
    key: str
    num_read: int  # rows of the split
    num_decode_failures: int
    seconds: float  # the preparation's wall time (when it was written)
    reused: bool  # found prepared, not written by this call

    @property
    def rows_uri(self) -> str:
        return posixpath.join(self.uri, ROWS_DIR)


def training_source(data: DataConfig, preprocess_cfg: dict, model_name: str,
                    objective: Objective) -> tuple[Any, Any]:
    """(rows, checked): the Ray Dataset the epochs read and the one the check pass
    (csclip.train.stream.plan_data) reads, both deterministic. The world's rows,
    materialized; a units table's, streamed; or with `data.prepare_images` the units'
    prepared table (prepared now unless it is already), whose check reads only its
    `decoded` column.

    Raises ConfigError when the objective needs the decoded image or the scene in every
    epoch (image foils, loss.method layout), DataError for an unreadable units table.
    """
    if not data.prepare_images:
        if data.units_uri is None:
            source = world_rows(data)
        else:  # a units table streams from storage
            source = deterministic(source_dataset(data))
        return source, source
    if objective.layout is not None or "image_foil" in objective.image_columns:
        raise ConfigError(f"data.prepare_images: loss.method {objective.method} with image "
                          "foils or layout targets reads the decoded image and the scene in "
                          "every epoch; turn data.prepare_images off")
    prepared = prepare_images(data, preprocess_cfg, model_name)
    fs, rows_path = filesystem_for(prepared.rows_uri)
    # Blocks of ~ROWS_PER_BLOCK rows (~75 MB at 224 px): Ray's reader would cut the table
    # into blocks of ~1 MB, and every epoch's global shuffle pays per block.
    blocks = max(1, -(-(prepared.num_read - prepared.num_decode_failures) // ROWS_PER_BLOCK))
    rows = deterministic(read_units_parquet(rows_path, fs, override_num_blocks=blocks))
    checked = deterministic(read_units_parquet(rows_path, fs, columns=["sample_id", DECODED]))
    return rows, checked


# The world's rows, materialized, per (Ray node and job, world, split): the demo's warm
# start and pretraining read one world and its two fine-tunings another, and each run
# rendered its world again (a good part of a run's start, with the check of
# csclip.train.stream.plan_data, which keeps its answer for these datasets). The two last.
_WORLD_ROWS: dict[tuple, Any] = {}


def world_rows(data: DataConfig):
    """The synthetic world's rows of `data` (PNG bytes, a few KB each) as a materialized
    Ray Dataset: kept, rather than every scene rendered again in every epoch, and the
    same dataset for the next run of this driver on the same world."""
    import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    context = ray.get_runtime_context()
    key = (context.get_node_id(), context.get_job_id(), data.world.model_dump_json(), data.split)

    def render():
        wait_for_a_free_cpu()
        return deterministic(source_dataset(data)).materialize()

    return keep_last(_WORLD_ROWS, key, render)


def channel_lookup(preprocess_cfg: dict) -> np.ndarray:
    """(3, 256) float32: what the eval transform's normalisation makes of each uint8 value
    in each channel (csclip.preprocess.image_normalize's own arithmetic)."""
    values = np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (3, 256, 1))
    return np.ascontiguousarray(image_normalize(preprocess_key(preprocess_cfg))(values)[:, :, 0])


class ImageNormalizer:
    """A batch's uint8 `image` and `image_foil` (B, 3, H, W), as the prepared, the
    cached and the streamed epochs ship them, normalised on the worker's device to the
    float32 tensors of the eval or training transform, bit for bit: on a CPU by
    csclip.preprocess.image_normalize itself, on an accelerator by looking each value up
    in channel_lookup's table (a copy, exact on any device; the device's own division may
    differ in the last bit). A float32 image passes through."""

    COLUMNS = ("image", "image_foil")

    def __init__(self, preprocess_cfg: dict, device) -> None:
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        self._normalize = image_normalize(preprocess_key(preprocess_cfg))
        self._lookup = torch.from_numpy(channel_lookup(preprocess_cfg)).to(device)  # (3, 256)

    def __call__(self, batch: dict) -> dict:
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        out = batch
        for name in self.COLUMNS:
            image = batch.get(name)
            if image is None or image.dtype != torch.uint8:
                continue
            out = dict(out) if out is batch else out
            out[name] = (torch.from_numpy(self._normalize(image.numpy()))
                         if image.device.type == "cpu" else self.by_lookup(image))
        return out

    def by_lookup(self, image):
        """(B, 3, H, W) uint8 -> float32 on the image's device, through the table."""
        import torch  # noqa: PLC0415  Ray Data's actors unpickle this module (pixels_batch) and never need torch

        lookup = self._lookup.to(image.device)
        channels = [lookup[c][image[:, c].long()] for c in range(image.shape[1])]  # (B, H, W)
        return torch.stack(channels, dim=1)                                       # (B, 3, H, W)


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


def prepared_key(units_sha256: str, split: str, preprocess: tuple, model_name: str) -> str:
    """24 hex digits naming a prepared table: the units' content, the split, the
    transform (its preprocess key) and the model whose tokenizer made the caption tokens."""
    text = json.dumps({"format": FORMAT, "units": units_sha256, "split": split,
                       "preprocess": [list(item) for item in preprocess],
                       "model": model_name}, sort_keys=True, default=list)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def prepared_uri(units_uri: str, key: str) -> str:
    """`prepared_images/<key>` in the folder that holds the units table (an extraction's
    output folder for its units/)."""
    if "://" in units_uri:
        parent = units_uri.rstrip("/").rsplit("/", 1)[0]
    else:
        parent = posixpath.dirname(filesystem_for(units_uri)[1].rstrip("/"))
    return posixpath.join(parent, PREPARED_DIR, key)


def prepare_images(data: DataConfig, preprocess_cfg: dict, model_name: str, *,
                   rows_per_block: int = 128, rows_per_file: int = 1024) -> PreparedImages:
    """The prepared table of `data`'s units (split `data.split`) for this transform and
    model: found under its key, or written now by one Ray Data pass (pixels_batch)."""
    units_uri = units_table_uri(data.units_uri)
    preprocess = preprocess_key(preprocess_cfg)
    started = time.perf_counter()
    key = prepared_key(units_digest(units_uri), data.split, preprocess, model_name)
    uri = prepared_uri(units_uri, key)
    fs, path = filesystem_for(uri)
    found = _read_manifest(fs, join(path, MANIFEST), read_bytes)
    if found is not None and found.get("key") == key:
        logger.info("images prepared already for %s (split %s): %s", units_uri, data.split, uri)
        return _prepared(uri, found, reused=True)
    lease = _lease_or_wait(uri, fs, path, key)
    if not isinstance(lease, Lease):  # another run prepared it while this one waited
        return _prepared(uri, lease, reused=True)
    try:
        return _prepare(data, lease, units_uri, key, preprocess, preprocess_cfg, model_name,
                        started, rows_per_block, rows_per_file)
    finally:
        release_lease(lease)


def _lease_or_wait(uri: str, fs, path: str, key: str, poll_s: float = 2.0) -> Lease | dict:
    """The lease on the prepared folder (one writer at a time: two preparations at once
    wrote each row twice), or, while another run holds it, that run's manifest once it is
    written. A holder that dies is taken over when its lease expires (csclip.ownership)."""
    waiting = False
    while True:
        try:
            lease = acquire_lease(uri, "csclip train: preparing images")
        except DataError as held:
            if not waiting:
                logger.info("waiting for another run to prepare these images: %s", held)
                waiting = True
            time.sleep(poll_s)
        else:
            found = _read_manifest(fs, join(path, MANIFEST), read_bytes)
            if found is not None and found.get("key") == key:  # finished while we waited
                release_lease(lease)
                return found
            return lease
        found = _read_manifest(fs, join(path, MANIFEST), read_bytes)
        if found is not None and found.get("key") == key:
            return found


def _prepare(data: DataConfig, lease: Lease, units_uri: str, key: str, preprocess: tuple,
             preprocess_cfg: dict, model_name: str, started: float, rows_per_block: int,
             rows_per_file: int) -> PreparedImages:
    """Write the prepared table under the lease: the rows, then the manifest, last."""
    uri = lease.uri
    fs, path = filesystem_for(uri)
    rows_path = join(path, ROWS_DIR)
    if exists(fs, rows_path):  # a preparation that did not finish: nothing of it is trusted
        fs.delete_dir_contents(rows_path)
    logger.info("preparing images of %s (split %s) once for every epoch: %s", units_uri,
                data.split, uri)
    source = deterministic(source_dataset(data))
    rows = source.map_batches(pixels_batch, batch_format="pyarrow", batch_size=rows_per_block,
                              fn_kwargs={"preprocess": preprocess, "model_name": model_name})
    # Uncompressed: zstd hardly shrinks the pixels (photographs' resized pixels hardly
    # compress; the text columns are a small part of a row) and cost every epoch their
    # decompression, more than the read itself (docs/performance.md).
    rows.write_parquet(rows_path, filesystem=fs, min_rows_per_file=rows_per_file,
                       compression="none")
    manifest = _manifest(fs, rows_path, key, units_uri, data.split, preprocess_cfg, model_name,
                         time.perf_counter() - started)
    write_bytes_atomic(fs, join(path, MANIFEST), json.dumps(manifest, indent=1).encode())
    logger.info("prepared %d images (%d undecodable) in %.1f s: %s", manifest["num_read"],
                manifest["num_decode_failures"], manifest["seconds"], uri)
    return _prepared(uri, manifest, reused=False)


def _read_manifest(fs, path: str, read_bytes) -> dict | None:
    if not exists(fs, path):
        return None
    try:
        return json.loads(read_bytes(fs, path))
    except ValueError:  # not JSON: an unfinished or foreign folder, prepared again
        return None


def _manifest(fs, rows_path: str, key: str, units_uri: str, split: str, preprocess_cfg: dict,
              model_name: str, seconds: float) -> dict:
    status = pads.dataset(rows_path, filesystem=fs, format="parquet").to_table(
        columns=["sample_id", DECODED])
    decoded = status.column(DECODED).to_pylist()
    failed = [sid for sid, ok in zip(status.column("sample_id").to_pylist(), decoded,
                                     strict=True) if not ok]
    return {"format": FORMAT, "key": key, "units_uri": units_uri, "split": split,
            "preprocess": preprocess_cfg, "model_name": model_name,
            "num_read": len(decoded), "num_decode_failures": len(failed),
            "failed_ids": failed[:MAX_LISTED_FAILURES], "seconds": round(seconds, 3),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def _prepared(uri: str, manifest: dict, reused: bool) -> PreparedImages:
    return PreparedImages(uri, manifest["key"], int(manifest["num_read"]),
                          int(manifest["num_decode_failures"]), float(manifest["seconds"]),
                          reused)


def pixels_batch(batch: pa.Table, *, preprocess: tuple, model_name: str) -> pa.Table:
    """Map function of the preparation: each row's image through the eval transform up to
    its uint8 pixels (csclip.preprocess.image_pixels) and the caption's tokens. A row whose
    image does not decode keeps null pixels and `decoded` False (the check pass counts it,
    the epochs drop it). Rows sharing an image (COCO's five captions, side by side in a
    units table) decode it once.

    Returns TEXT_COLUMNS, PIXELS (fixed-size binary of 3*H*W bytes: (3, H, W) uint8),
    DECODED and CAPTION_TOKENS (fixed-size list of context_length int64).
    """
    pixels_of = image_pixels(preprocess)
    shape = image_shape(dict(preprocess))
    size = int(np.prod(shape))
    sources = batch.select([c for c in IMAGE_SOURCE_COLUMNS if c in batch.column_names])
    values: list[bytes | None] = []
    seen: dict[Any, bytes | None] = {}
    for row in sources.to_pylist():
        same = _image_identity(row)
        if same is not None and same in seen:
            values.append(seen[same])
            continue
        image = decode_image(row)
        value = None if image is None else _pixel_bytes(pixels_of(image), shape)
        if same is not None:
            seen[same] = value
        values.append(value)
    out = text_rows(batch)
    out = (out.append_column(PIXELS, pa.array(values, type=pa.binary(size)))
              .append_column(DECODED, pa.array([v is not None for v in values], type=pa.bool_())))
    captions = out.column("caption").to_pylist()
    if not captions:
        return out.append_column(CAPTION_TOKENS, pa.array([], type=pa.list_(pa.int64(), 1)))
    tokens = tokenizer(model_name)(captions).numpy().astype(np.int64)  # (n, L)
    return out.append_column(CAPTION_TOKENS, fixed_size_list(tokens))


def _image_identity(row: dict) -> Any:
    """What makes two rows' images the same image: their bytes, or their path."""
    if row.get("image_bytes") is not None:
        return bytes(row["image_bytes"])
    return ("path", row["image_path"]) if row.get("image_path") else None


def _pixel_bytes(pixels: np.ndarray, shape: Sequence[int]) -> bytes:
    if pixels.shape != tuple(shape) or pixels.dtype != np.uint8:
        raise ValueError(f"the transform gave {pixels.dtype} {pixels.shape}, not uint8 {shape}")
    return np.ascontiguousarray(pixels).tobytes()

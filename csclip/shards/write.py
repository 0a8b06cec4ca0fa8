"""Captions and their images written as webdataset shards (`csclip shards`), laid out as
img2dataset writes them (csclip.shards.layout), each image decoded once on the way.

The samples are sorted by sample_id, permuted once by the seed, then cut into shards of
`samples_per_shard`: the same input and seed give the same bytes. A sample whose caption
is empty or whose image is missing, unreadable, outside the image root or undecodable is
a row of `rejects.parquet` with its reason, and its shard is that much shorter. Each shard
goes up whole (written to a local temporary file first); `shards.json`, written last, says
the folder is finished and with what settings.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import posixpath
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel

from csclip import storage
from csclip.config.shards import ShardsOutputConfig
from csclip.errors import DataError
from csclip.ownership import CONFIG_FILE, output_lease
from csclip.shards.layout import PIXELS_SUFFIX, SHARDS_MANIFEST, stats_name

__all__ = ["EMPTY_CAPTION", "ExtraMembers", "MISSING_IMAGE", "NO_IMAGE", "OUTSIDE_IMAGE_ROOT", "REJECTS_FILE",
           "UNDECODABLE_IMAGE", "UNREADABLE_IMAGE", "PixelEncoding", "ShardsSummary",
           "read_manifest", "sample_key", "shard_name", "shard_samples", "write_shards"]

log = logging.getLogger(__name__)

REJECTS_FILE = "rejects.parquet"

# Samples prepared at once (read, decoded, encoded): a read waits on storage and PIL
# decodes and encodes outside the GIL, so threads overlap them; 8 holds at most 8 images
# (a few MB each decoded) in memory, and the shard's own tar is written in order anyway.
NUM_THREADS = 8

# Why a sample is not written (rejects.parquet's `reason`).
EMPTY_CAPTION = "empty_caption"
NO_IMAGE = "no_image"  # the row names no image (a caption-only .txt input)
MISSING_IMAGE = "missing_image"
UNREADABLE_IMAGE = "unreadable_image"  # there, but the store fails to read it
OUTSIDE_IMAGE_ROOT = "outside_image_root"
UNDECODABLE_IMAGE = "undecodable_image"

REJECTS_SCHEMA = pa.schema([("sample_id", pa.string()), ("shard", pa.string()),
                            ("reason", pa.string()), ("detail", pa.string())])

# The suffix `original` keeps per format PIL reads; any other format is re-encoded as png
# (lossless), since readers take only IMAGE_SUFFIXES.
ORIGINAL_SUFFIXES = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}
# Fixed tar headers (owner, time): the same samples make the same bytes.
TAR_OWNER = "csclip"
TAR_MTIME = 0
# What decides a folder's bytes: a rerun into a finished folder must match it.
SETTINGS = ("encoding", "seed", "samples_per_shard", "jpeg_quality", "model", "image_shape",
            "preprocess", "num_read", "input_sha256")

# webdataset splits a member's name at the first dot of its base name; "/" would make
# folders and "\\" or whitespace trip other tools.
_KEY_UNSAFE = re.compile(r"[./\\\s]")
_NUMBERED = re.compile(r"^(\d{5,})(?:\.tar|_stats\.json)$")


@dataclass(frozen=True)
class PixelEncoding:
    """How encoding `pixels` turns an RGB PIL image into the model's (3, H, W) uint8
    pixels (`transform`: csclip.preprocess.image_pixels of `preprocess`, the model's
    preprocess_cfg)."""

    model: str
    shape: tuple[int, int, int]
    preprocess: dict
    transform: Callable[[Image.Image], np.ndarray]


# More members of a sample from its row and decoded RGB image (write_shards).
ExtraMembers = Callable[[dict, Image.Image], dict[str, bytes]]


@dataclass(frozen=True)
class ShardsSummary:
    """What a run wrote: read = written + rejected (by reason)."""

    uri: str
    num_read: int
    num_written: int
    rejected: dict[str, int]
    num_shards: int
    already_written: bool = False

    def format(self) -> str:
        reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.rejected.items()))
        num_rejected = sum(self.rejected.values())
        lines = [f"read {self.num_read} = written {self.num_written} + rejected "
                 f"{num_rejected}" + (f" ({reasons})" if reasons else "")]
        if self.already_written:
            lines.append(f"{self.uri}: already written with these settings "
                         f"({self.num_shards} shards); nothing to do")
        else:
            lines.append(f"wrote {self.num_shards} shards to {self.uri} ({SHARDS_MANIFEST} "
                         f"lists them{f'; rejects in {REJECTS_FILE}' if num_rejected else ''})")
        return "\n".join(lines)


@dataclass(frozen=True)
class _Rejected:
    reason: str
    detail: str


def sample_key(sample_id: str) -> str:
    """A sample's key in the shards: its id with `.`, `/`, `\\` and whitespace as `_`."""
    return _KEY_UNSAFE.sub("_", sample_id)


def shard_name(index: int) -> str:
    """The shard file of index `index`: `00042.tar`."""
    return f"{index:05d}.tar"


def shard_chunks(num_read: int, output: ShardsOutputConfig) -> list[list[int]]:
    """The positions (in sample_id order) each shard holds before rejections: the samples
    permuted once by output.seed, cut into runs of output.samples_per_shard."""
    order = np.random.default_rng(output.seed).permutation(num_read).tolist()
    size = output.samples_per_shard
    return [order[start:start + size] for start in range(0, num_read, size)]


def shard_samples(sample_ids: Sequence[str], output: ShardsOutputConfig) -> dict[str, list[str]]:
    """The sample ids write_shards puts in each shard (by stem, `00042`) before its
    rejections, in the order written."""
    ids = sorted(sample_ids)
    return {posixpath.splitext(shard_name(index))[0]: [ids[i] for i in chunk]
            for index, chunk in enumerate(shard_chunks(len(ids), output))}


def read_manifest(uri: str, endpoint_url: str | None = None) -> dict | None:
    """The SHARDS_MANIFEST of the shard folder `uri` (local or s3://), None where there is
    none (a folder not written by `csclip shards`, or one it has not finished). Raises
    DataError for a manifest that is not a JSON object."""
    fs, path = storage.filesystem_for(uri, endpoint_url)
    file = storage.join(path, SHARDS_MANIFEST)
    if not storage.exists(fs, file):
        return None
    try:
        manifest = json.loads(storage.read_bytes(fs, file))
    except (ValueError, UnicodeDecodeError) as err:
        raise DataError(f"{storage.join(uri, SHARDS_MANIFEST)}: not valid JSON ({err}); "
                        "write the shards again into an empty folder") from err
    if not isinstance(manifest, dict):
        raise DataError(f"{storage.join(uri, SHARDS_MANIFEST)}: a JSON "
                        f"{type(manifest).__name__}, not an object")
    return manifest


def write_shards(rows: Sequence[dict], output: ShardsOutputConfig, *,
                 image_root: str | None = None, image_endpoint_url: str | None = None,
                 pixels: PixelEncoding | None = None,
                 config: BaseModel | None = None,
                 extra_members: ExtraMembers | None = None) -> ShardsSummary:
    """Write `rows` (csclip.extract.captions.CAPTION_SCHEMA dicts) as shards into
    `output.uri`, holding its lease (one writer per folder; `config`, the run's resolved
    config, is stored beside as config.yaml).

    image_root: relative image paths were joined to it; a path that leads outside it is
    a rejection. image_endpoint_url: the S3 endpoint of the images. pixels: for encoding
    `pixels`, the model's transform. extra_members(row, image): more members of a sample
    (suffix -> bytes) made from its row and decoded RGB image (training's image-foil
    candidates, csclip.train.source_shards).
    Raises DataError for no rows, two samples with one key, a finished folder written
    with other settings, or a folder of shards csclip did not write.
    """
    if (output.encoding == "pixels") != (pixels is not None):
        raise ValueError("a PixelEncoding goes with encoding pixels, and only with it")
    if not rows:
        raise DataError("no samples to write; check input.*")
    uri = storage.resolve_output(output.uri, "output.uri")
    rows = sorted(rows, key=lambda row: row["sample_id"])
    keys = _keys(rows)
    settings = _settings(rows, output, pixels)
    finished = _finished(uri, settings, output.endpoint_url)
    if finished is not None:
        return finished
    fs, path = storage.filesystem_for(uri, output.endpoint_url)
    _refuse_foreign(fs, path, uri)
    with output_lease(uri, "csclip shards", output.endpoint_url, config=config):
        finished = _finished(uri, settings, output.endpoint_url)  # a writer just before us
        if finished is not None:
            return finished

        def prepare(index: int) -> dict | _Rejected:
            return _prepare(rows[index], keys[index], output, pixels, image_root,
                            image_endpoint_url, extra_members)

        return _write(uri, len(rows), prepare, [row["sample_id"] for row in rows], output,
                      settings)


def _keys(rows: Sequence[dict]) -> list[str]:
    keys = [sample_key(row["sample_id"]) for row in rows]
    owner: dict[str, str] = {}
    for row, key in zip(rows, keys, strict=True):
        if not key or key.startswith("__"):
            raise DataError(f"sample_id {row['sample_id']!r} makes the key {key!r}, which "
                            "webdataset readers skip; give the samples other ids")
        if key in owner:
            raise DataError(f"samples {owner[key]!r} and {row['sample_id']!r} both make the "
                            f"shard key {key!r} ('.', '/', '\\\\' and whitespace become '_'); "
                            "give them ids that differ otherwise")
        owner[key] = row["sample_id"]
    return keys


def _settings(rows: Sequence[dict], output: ShardsOutputConfig,
              pixels: PixelEncoding | None) -> dict:
    digest = hashlib.sha256()
    for row in rows:
        image = row.get("image_bytes")
        fields = [row.get(name) for name in ("sample_id", "image_id", "caption", "split",
                                              "image_path", "gold_json")]
        fields.append(hashlib.sha256(image).hexdigest() if image is not None else None)
        digest.update(json.dumps(fields).encode() + b"\n")
    settings = {"encoding": output.encoding, "seed": output.seed,
                "samples_per_shard": output.samples_per_shard, "num_read": len(rows),
                "input_sha256": digest.hexdigest()}
    if output.encoding == "jpeg":
        settings["jpeg_quality"] = output.jpeg_quality
    if pixels is not None:
        settings.update(model=pixels.model, image_shape=list(pixels.shape),
                        preprocess=json.loads(json.dumps(pixels.preprocess)))
    return settings


def _finished(uri: str, settings: dict, endpoint_url: str | None) -> ShardsSummary | None:
    """The summary of a folder finished with `settings`; None for an unfinished one.
    Raises DataError for one finished with other settings."""
    manifest = read_manifest(uri, endpoint_url)
    if manifest is None:
        return None
    differ = [f"{name} {manifest.get(name)!r} there, {settings.get(name)!r} now"
              for name in SETTINGS if manifest.get(name) != settings.get(name)]
    if differ:
        raise DataError(f"{uri} holds shards written with other settings ({'; '.join(differ)}"
                        "); write them to another folder, or delete that one first")
    return ShardsSummary(uri, manifest["num_read"], manifest["num_samples"],
                         dict(manifest["rejected"]), len(manifest["shards"]),
                         already_written=True)


def _refuse_foreign(fs: pafs.FileSystem, path: str, uri: str) -> None:
    """Refuse a folder of .tar files with no trace of `csclip shards` (their config.yaml,
    written when a run takes the folder): its shards would be overwritten or mixed in."""
    names = [posixpath.basename(p) for p in storage.list_files(fs, path)]
    if any(name.endswith(".tar") for name in names) and CONFIG_FILE not in names:
        raise DataError(f"{uri} holds .tar files that `csclip shards` did not write; give an "
                        "empty or new folder")


def _write(uri: str, num_read: int, prepare: Callable[[int], dict | _Rejected],
           sample_ids: list[str], output: ShardsOutputConfig, settings: dict) -> ShardsSummary:
    fs, path = storage.filesystem_for(uri, output.endpoint_url)
    chunks = shard_chunks(num_read, output)
    num_shards = len(chunks)
    shards, rejects, rejected = [], [], Counter()
    tar_writer = _tar_writer()  # its import (torch's) out of the first shard's time
    started = time.monotonic()
    with ThreadPoolExecutor(NUM_THREADS) as pool:
        for index in range(num_shards):
            name = shard_name(index)
            chunk = chunks[index]
            samples, shard_rejected = [], Counter()
            for position, prepared in zip(chunk, pool.map(prepare, chunk), strict=True):
                if isinstance(prepared, _Rejected):
                    rejects.append({"sample_id": sample_ids[position], "shard": name,
                                    "reason": prepared.reason, "detail": prepared.detail})
                    shard_rejected[prepared.reason] += 1
                else:
                    samples.append(prepared)
            _write_tar(tar_writer, fs, storage.join(path, name), samples)
            _write_json(fs, stats_name(storage.join(path, name)), {
                "count": len(chunk), "successes": len(samples), "failed_to_download": 0,
                "failed_to_resize": sum(shard_rejected.values()),
                "status_dict": {"success": len(samples), **shard_rejected}})
            shards.append({"name": name, "count": len(samples)})
            rejected.update(shard_rejected)
            _log_progress(name, len(samples), shard_rejected, index + 1, num_shards,
                          sum(map(len, chunks[:index + 1])), num_read, started)
    table = pa.Table.from_pylist(rejects, schema=REJECTS_SCHEMA)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    storage.write_bytes_atomic(fs, storage.join(path, REJECTS_FILE), sink.getvalue())
    _remove_stale(fs, path, num_shards)
    num_written = sum(shard["count"] for shard in shards)
    assert num_written + len(rejects) == num_read, "every sample is written or rejected"
    _write_json(fs, storage.join(path, SHARDS_MANIFEST), {
        "format": "webdataset", **settings, "shards": shards, "num_samples": num_written,
        "rejected": dict(sorted(rejected.items())), "decoded": True})
    return ShardsSummary(uri, num_read, num_written, dict(rejected), num_shards)


def _log_progress(name: str, written: int, rejected: Counter, done_shards: int,
                  num_shards: int, done: int, total: int, started: float) -> None:
    elapsed = time.monotonic() - started
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 else 0.0
    log.info("shard %s: %d written, %d rejected; %d/%d shards, %d/%d samples, %.0f "
             "samples/s, ETA %s", name, written, sum(rejected.values()), done_shards,
             num_shards, done, total, rate, _duration(eta))


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _tar_writer() -> type:
    from webdataset.writer import TarWriter  # noqa: PLC0415  webdataset imports torch, which readers of csclip.shards never need

    return TarWriter


def _write_tar(tar_writer: type, fs: pafs.FileSystem, path: str, samples: list[dict]) -> None:
    """One shard, built in a local temporary file and then put in place whole (a killed
    run leaves no half shard under the shard's name)."""
    with tempfile.TemporaryFile() as local:
        # encoder=False: the members are bytes already, written as they are.
        with tar_writer(local, user=TAR_OWNER, group=TAR_OWNER, mtime=TAR_MTIME,
                       encoder=False, format="PAX_FORMAT") as tar:
            for sample in samples:
                tar.write(sample)
        local.seek(0)
        storage.write_bytes_atomic(fs, path, local.read())


def _write_json(fs: pafs.FileSystem, path: str, data: dict) -> None:
    storage.write_bytes_atomic(fs, path, json.dumps(data, indent=1, sort_keys=True).encode())


def _remove_stale(fs: pafs.FileSystem, path: str, num_shards: int) -> None:
    """Remove the numbered shards and stats past `num_shards`: left by an unfinished run of
    other settings (this folder's config.yaml says `csclip shards` wrote it)."""
    for file in storage.list_files(fs, path):
        numbered = _NUMBERED.match(posixpath.basename(file))
        if numbered and int(numbered.group(1)) >= num_shards:
            storage.delete_file(fs, file)


# -- one sample: read, decode once, encode -------------------------------------------------

def _prepare(row: dict, key: str, output: ShardsOutputConfig, pixels: PixelEncoding | None,
             image_root: str | None, endpoint_url: str | None,
             extra_members: ExtraMembers | None = None) -> dict | _Rejected:
    """A sample's members ({"__key__", image suffix, "txt", "json"}), or why it is rejected."""
    caption = row.get("caption") or ""
    if not caption.strip():
        return _Rejected(EMPTY_CAPTION, "the caption is empty")
    data = _image_bytes(row, image_root, endpoint_url)
    if isinstance(data, _Rejected):
        return data
    source = row.get("image_path") or "image_bytes"
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as err:
        # PIL reports a truncated or corrupt file as OSError.
        return _Rejected(UNDECODABLE_IMAGE, f"{source}: {err}"[:300])
    suffix, encoded = _encode(image, data, output, pixels)
    meta = {"key": key, "sample_id": row["sample_id"], "image_id": row["image_id"],
            "split": row["split"], "caption": caption, "source": row.get("image_path"),
            "width": image.width, "height": image.height}
    if row.get("gold_json") is not None:
        meta["gold_json"] = row["gold_json"]
    extra = extra_members(row, _rgb(image)) if extra_members is not None else {}
    return {"__key__": key, suffix: encoded, "txt": caption.encode("utf-8"),
            "json": json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"),
            **extra}


def _image_bytes(row: dict, image_root: str | None,
                 endpoint_url: str | None) -> bytes | _Rejected:
    if row.get("image_bytes") is not None:
        return bytes(row["image_bytes"])
    image_path = row.get("image_path")
    if not image_path:
        return _Rejected(NO_IMAGE, "the row names no image")
    if image_root and not _inside(image_path, image_root):
        return _Rejected(OUTSIDE_IMAGE_ROOT, f"{image_path} is not under the image root "
                                             f"{image_root}")
    fs, path = storage.filesystem_for(image_path, endpoint_url)
    try:
        return storage.read_bytes_retrying(fs, path)  # a throttled store is tried again
    except DataError as err:  # not found
        return _Rejected(MISSING_IMAGE, str(err)[:300])
    except OSError as err:
        return _Rejected(UNREADABLE_IMAGE, f"{image_path}: {err}"[:300])


def _inside(path: str, root: str) -> bool:
    """Whether `path` lies under `root`, by their text: ".." resolved, no absolute path or
    URI that leaves it (links inside the root are its owner's choice)."""
    def parts(uri: str) -> tuple[str, str]:
        scheme, sep, rest = uri.partition("://")
        return (scheme, posixpath.normpath(rest)) if sep else ("", posixpath.normpath(uri))

    (path_scheme, path_rest), (root_scheme, root_rest) = parts(path), parts(root)
    return path_scheme == root_scheme and (
        root_rest == "." and not path_rest.startswith(("/", "..", "~"))
        or path_rest.startswith(root_rest.rstrip("/") + "/"))


def _encode(image: Image.Image, data: bytes, output: ShardsOutputConfig,
            pixels: PixelEncoding | None) -> tuple[str, bytes]:
    """(member suffix, bytes) of the decoded `image`, whose file is `data`."""
    if pixels is not None:
        array = np.ascontiguousarray(pixels.transform(_rgb(image)), dtype=np.uint8)
        assert array.shape == pixels.shape, (array.shape, pixels.shape)
        buffer = io.BytesIO()
        np.save(buffer, array, allow_pickle=False)
        return PIXELS_SUFFIX, buffer.getvalue()
    if output.encoding == "original" and image.format in ORIGINAL_SUFFIXES:
        return ORIGINAL_SUFFIXES[image.format], data
    buffer = io.BytesIO()
    if output.encoding == "original":
        _rgb(image).save(buffer, format="PNG")
        return "png", buffer.getvalue()
    _rgb(image).save(buffer, format="JPEG", quality=output.jpeg_quality)
    return "jpg", buffer.getvalue()


def _rgb(image: Image.Image) -> Image.Image:
    # As training decodes (csclip.train.stream.decode_image): RGB, alpha dropped.
    return image if image.mode == "RGB" else image.convert("RGB")

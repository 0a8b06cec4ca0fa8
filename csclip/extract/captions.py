"""Caption readers: COCO Karpathy `dataset_coco.json`, COCO
`captions_*.json`, SugarCrepe JSON, CSV / TSV as open_clip_train reads them, JSONL of
(image, caption), plain text (one caption a line) and the synthetic world, from local paths
or s3://, into one table of (sample_id, image reference, caption, split). A file's format
follows its name unless input.format is given (resolve_format). Parsing is pure (no Ray);
`caption_dataset` wraps the table as a Ray Dataset."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import posixpath
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs

from csclip import storage
from csclip.config.extract import InputConfig, InputFormat
from csclip.errors import DataError
from csclip.karpathy import read_karpathy
from csclip.units import record_to_row
from csclip.world import iter_world

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger(__name__)


# A file's format from its suffix (resolve_format); .json is told apart by name, else content.
SUFFIX_FORMATS: dict[str, InputFormat] = {".txt": "txt", ".csv": "csv", ".tsv": "csv",
                                          ".jsonl": "jsonl",
                                          ".tar": "webdataset"}

# One row per caption. `image_path` is the image reference (URI or path relative to
# input.image_root); world rows carry the rendered PNG in `image_bytes` and their gold
# units (a units-table row as JSON, without the image) in `gold_json`.
CAPTION_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("image_path", pa.string()),
    pa.field("caption", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("image_bytes", pa.binary()),
    pa.field("gold_json", pa.string()),
])




def _row(sample_id: str, image_id: str, image_path: str | None, caption: str, split: str,
         image_bytes: bytes | None = None, gold_json: str | None = None) -> dict:
    return {"sample_id": sample_id, "image_id": image_id, "image_path": image_path,
            "caption": caption if isinstance(caption, str) else "", "split": split,
            "image_bytes": image_bytes, "gold_json": gold_json}


def _image_ref(root: str | None, *parts: str) -> str:
    rel = posixpath.join(*[p for p in parts if p])
    return posixpath.join(root, rel) if root else rel


def _load_json(fs: pafs.FileSystem, path: str) -> object:
    try:
        return json.loads(storage.read_bytes(fs, path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err}); check input.format") from err
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}); check input.uri") from err


def _text(fs: pafs.FileSystem, path: str, encoding: str = "utf-8") -> str:
    try:
        return storage.read_bytes(fs, path).decode(encoding)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}); check input.uri") from err


@contextlib.contextmanager
def _entry(path: str, fmt: str, where: str) -> Iterator[None]:
    """A field missing (KeyError names it) or of another type in one entry of a file is
    a DataError naming the file and the entry."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise DataError(f"{path}: not a {fmt} file ({where}: {type(err).__name__} {err}); "
                        "check input.format and input.uri") from err


def _expect(cond: bool, path: str, fmt: str, what: str) -> None:
    if not cond:
        raise DataError(f"{path}: not a {fmt} file ({what}); check input.format and input.uri")


def iter_karpathy(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """COCO Karpathy `dataset_coco.json`: images with `sentences` and a `split`."""
    for entry in read_karpathy(fs, path, cfg.restval_as_train):
        yield _row(f"coco-{entry.image_id}-{entry.sentence_id}", entry.image_id,
                   _image_ref(cfg.image_root, entry.image_file), entry.caption, entry.split)


_COCO_SPLIT = re.compile(r"(train|val|test)\d*")


def iter_coco(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """COCO `captions_<split><year>.json`: `images` (id, file_name) and `annotations`."""
    data = _load_json(fs, path)
    _expect(isinstance(data, dict) and isinstance(data.get("annotations"), list), path, "COCO captions",
            "no 'annotations' list")
    split = cfg.split
    if split is None:
        found = _COCO_SPLIT.search(posixpath.basename(path))
        if not found:
            raise DataError(f"{path}: cannot infer the split from the file name; set input.split")
        split = found.group(1)
    with _entry(path, "COCO captions", "images"):
        files = {img["id"]: img.get("file_name") for img in data.get("images", [])}
    for number, ann in enumerate(data["annotations"]):
        with _entry(path, "COCO captions", f"annotation {number}"):
            image_id = ann["image_id"]
            ref = _image_ref(cfg.image_root, files.get(image_id) or f"{int(image_id):012d}.jpg")
            row = _row(f"coco-{image_id}-{ann['id']}", str(image_id), ref,
                       ann.get("caption", ""), split)
        yield row


def iter_sugarcrepe(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """SugarCrepe `<subset>.json`: {"0": {filename, caption, negative_caption}, ...}; a
    directory reads every subset. Only the positive caption is a caption of the image."""
    paths = storage.list_files(fs, path, ".json") if storage.is_dir(fs, path) else [path]
    if not paths:
        raise DataError(f"{path}: no SugarCrepe *.json files found")
    for file in paths:
        subset = posixpath.basename(file)[: -len(".json")]
        data = _load_json(fs, file)
        _expect(isinstance(data, dict), file, "SugarCrepe", "top level is not an object")
        for key, entry in data.items():
            _expect(isinstance(entry, dict) and "filename" in entry, file, "SugarCrepe",
                    f"entry {key!r} has no 'filename'")
            with _entry(file, "SugarCrepe", f"entry {key!r}"):
                image_id = posixpath.splitext(entry["filename"])[0]
                row = _row(f"sugarcrepe-{subset}-{int(key):06d}", image_id,
                           _image_ref(cfg.image_root, entry["filename"]),
                           entry.get("caption", ""), cfg.split or "test")
            yield row


def _table_rows(rows: list[dict], path: str, cfg: InputConfig, image_key: str = "image",
                caption_key: str = "caption") -> Iterator[dict]:
    stem = posixpath.splitext(posixpath.basename(path))[0]
    for number, item in enumerate(rows):
        if not isinstance(item, dict):
            raise DataError(f"{path}: row {number} is a JSON {type(item).__name__}, not an "
                            f"object with {image_key!r} and {caption_key!r}")
        if caption_key not in item or image_key not in item:
            raise DataError(f"{path}: row {number} needs {image_key!r} and {caption_key!r} "
                            f"columns (has {sorted(item)})")
        image = str(item[image_key])
        image_id = str(item.get("image_id") or posixpath.splitext(posixpath.basename(image))[0])
        sample_id = str(item.get("sample_id") or f"{stem}-{number:08d}")
        yield _row(sample_id, image_id, _image_ref(cfg.image_root, image), item[caption_key],
                   str(item.get("split") or cfg.split or "train"))


def iter_csv(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """CSV / TSV with a header, as open_clip_train reads it: the image path in column
    input.csv_img_key, the caption in input.csv_caption_key, cells separated by
    input.csv_separator; optional `split`, `image_id`, `sample_id` columns."""
    text = _text(fs, path, "utf-8-sig")
    reader = csv.DictReader(io.StringIO(text), delimiter=cfg.csv_separator)
    rows = list(reader)
    header = reader.fieldnames or []
    for key, flag in ((cfg.csv_img_key, "--csv-img-key"), (cfg.csv_caption_key, "--csv-caption-key")):
        if key not in header:
            raise DataError(
                f"{path}: no column {key!r} ({flag}) in the header {header} read with "
                f"--csv-separator {cfg.csv_separator!r}; set --csv-img-key, --csv-caption-key "
                "and --csv-separator (input.csv_*; open_clip_train's names and defaults) to "
                "the file's")
    yield from _table_rows(rows, path, cfg, cfg.csv_img_key, cfg.csv_caption_key)


def iter_txt(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """Plain text, one caption a line. A line has no image: image_path is None and the
    caption is its own image, image_id = sample_id = `<file stem>-<line:08d>` (the line
    number, from 1). A blank line is an empty caption (a counted `empty_caption` rejection),
    so every line keeps its number."""
    if cfg.image_root:
        raise DataError(f"{path}: a .txt input names no images; leave input.image_root unset "
                        "or give a CSV / JSONL with an image column")
    stem = posixpath.splitext(posixpath.basename(path))[0]
    for number, line in enumerate(_text(fs, path, "utf-8-sig").splitlines(), start=1):
        sample_id = f"{stem}-{number:08d}"
        yield _row(sample_id, sample_id, None, line.strip(), cfg.split or "train")


def iter_jsonl(fs: pafs.FileSystem, path: str, cfg: InputConfig) -> Iterator[dict]:
    """JSON Lines, one object per line with the same keys as the CSV format."""
    rows = []
    for number, line in enumerate(_text(fs, path).splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise DataError(f"{path}: line {number + 1} is not valid JSON ({err})") from err
    yield from _table_rows(rows, path, cfg)


def iter_world_captions(cfg: InputConfig) -> Iterator[dict]:
    """The synthetic world's captions, with their PNG and gold units."""
    for record in iter_world(cfg.world, splits=cfg.splits or ("train", "val", "test")):
        row = record_to_row(record)
        row.pop("image_bytes")
        yield _row(record.sample_id, record.image_id, record.image_path, record.caption,
                   record.split, record.image_bytes, json.dumps(row, sort_keys=True))


_FILE_READERS = {"karpathy": iter_karpathy, "coco": iter_coco, "sugarcrepe": iter_sugarcrepe,
                 "csv": iter_csv, "jsonl": iter_jsonl, "txt": iter_txt}


def resolve_format(cfg: InputConfig) -> InputConfig:
    """`cfg` with input.format decided: as given; "world" without input.uri; else from the
    file's name: .txt, .csv / .tsv, .jsonl, .tar (a webdataset shard pattern) by suffix; a
    .json by name (Karpathy's
    `dataset_*.json`, COCO's `captions_*.json`), else by its content (read once more).

    Raises DataError for a directory or a suffix that names no format.
    """
    if cfg.format is not None:
        return cfg
    if cfg.uri is None:
        return cfg.model_copy(update={"format": "world"})
    fs, path = storage.filesystem_for(cfg.uri, cfg.endpoint_url)
    name = posixpath.basename(path.rstrip("/"))
    suffix = posixpath.splitext(name)[1].lower()
    if suffix in SUFFIX_FORMATS:
        fmt = SUFFIX_FORMATS[suffix]
    elif suffix == ".json":
        fmt = ("karpathy" if name.startswith("dataset_") else
               "coco" if name.startswith("captions_") else _json_format(fs, path))
    elif storage.is_dir(fs, path):
        raise DataError(f"{cfg.uri} is a directory: give its format (--format sugarcrepe for "
                        "a directory of SugarCrepe subsets; input.format)")
    else:
        raise DataError(f"{cfg.uri}: the suffix {suffix or '(none)'!r} names no caption format "
                        f"(.txt, .csv, .tsv, .jsonl, .json, .tar); give --format (input.format)")
    log.info("input %s read as format %s (from its name or content; --format to override)",
             cfg.uri, fmt)
    return cfg.model_copy(update={"format": fmt})


def _json_format(fs: pafs.FileSystem, path: str) -> InputFormat:
    """Which caption JSON `path` is, from its layout (the readers' own checks)."""
    data = _load_json(fs, path)
    if isinstance(data, dict):
        images = data.get("images")
        if isinstance(images, list) and images and isinstance(images[0], dict) \
                and "sentences" in images[0]:
            return "karpathy"
        if isinstance(data.get("annotations"), list):
            return "coco"
        if data and all(isinstance(v, dict) and "filename" in v for v in data.values()):
            return "sugarcrepe"
    raise DataError(f"{path}: neither a Karpathy, a COCO captions nor a SugarCrepe JSON "
                    "file; give --format (input.format)")


def iter_captions(cfg: InputConfig) -> Iterator[dict]:
    """Caption rows (CAPTION_SCHEMA dicts) in file order, filtered to `cfg.splits`."""
    cfg = resolve_format(cfg)
    if cfg.format == "world":
        yield from iter_world_captions(cfg)
        return
    fs, path = storage.filesystem_for(cfg.uri, cfg.endpoint_url)
    for row in _FILE_READERS[cfg.format](fs, path, cfg):
        if cfg.splits is None or row["split"] in cfg.splits:
            yield row


def caption_table(cfg: InputConfig) -> pa.Table:
    """All captions as one table sorted by sample_id (the order shards are cut in).

    Raises DataError when the input is empty or a sample_id repeats (resume relies on
    unique ids).
    """
    cfg = resolve_format(cfg)
    rows = sorted(iter_captions(cfg), key=lambda r: r["sample_id"])
    if not rows:
        raise DataError(f"no captions read from {cfg.uri or 'the world'} "
                        f"(format {cfg.format}, splits {cfg.splits}); check input.*")
    for previous, row in zip(rows, rows[1:], strict=False):
        if previous["sample_id"] == row["sample_id"]:
            raise DataError(f"{cfg.uri}: sample_id {row['sample_id']!r} occurs twice; "
                            "give rows unique sample_id values")
    if cfg.limit is not None:
        rows = rows[: cfg.limit]
    return pa.Table.from_pylist(rows, schema=CAPTION_SCHEMA)


def caption_dataset(cfg: InputConfig, num_blocks: int | None = None) -> ray.data.Dataset:
    """The captions as a Ray Dataset with CAPTION_SCHEMA columns, sorted by sample_id."""
    import ray.data  # noqa: PLC0415  the readers above run without Ray (tests import them)

    table = caption_table(cfg)
    blocks = num_blocks or max(1, min(64, table.num_rows // 1000))
    return ray.data.from_arrow(table).repartition(blocks)

"""Frozen half-truth benchmark files: the items of one protocol written once, with their
provenance and a content hash, so that any model is scored on exactly those items
(`csclip benchmark build`, `csclip evaluate --benchmark FILE`). The authors never released
their benchmark as a file; this makes it one that people can share and cite. Pure: no ray.

Layout (JSON): format, version, protocol, content_hash, built_from (units URI, split,
num_samples, seed, counts of records and images), counts per condition, skipped
({condition: {reason: images}}) and items, each with image_id, image (its path or URI; null
where the source held the bytes), sample_id (the caption), condition, group, unit, foil,
anchor, completion, half_truth. The hash covers the protocol and every item's ids,
condition and texts, not where the images are stored: images moved to another root score
the same benchmark.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from csclip.errors import DataError
from csclip.eval.encoder import ImageSource, image_sources
from csclip.eval.halftruth import (
    ALL_CONDITIONS,
    CONDITION_BY_SLUG,
    BenchmarkConfig,
    HalfTruthBenchmark,
    HalfTruthItem,
    PreparedBenchmark,
    Protocol,
    benchmark_hash,
    build_for_protocol,
    build_paper_benchmark,
)
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

FORMAT = "csclip-halftruth-benchmark"
VERSION = 1
_ITEM_FIELDS = tuple(f.name for f in fields(HalfTruthItem))


@dataclass(frozen=True)
class FrozenBenchmark:
    """A benchmark file's content: the benchmark, each image's path (None: bytes held by
    the source records) and where it was built from."""

    benchmark: HalfTruthBenchmark
    images: dict[str, str | None]
    built_from: dict[str, object]

    @property
    def content_hash(self) -> str:
        return self.benchmark.content_hash


# ---------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------


def is_authors_unit_file(uri: str) -> bool:
    """Whether `uri` names the authors' unit JSON (a .json / .jsonl file, a glob of them,
    or a directory holding them) rather than a units table (Parquet)."""
    from csclip import storage

    if uri.endswith((".json", ".jsonl")):
        return True
    if any(c in uri for c in "*?["):
        return False
    try:
        fs, path = storage.filesystem_for(uri)
        return storage.is_dir(fs, path) and bool(
            storage.list_files(fs, path, ".json") or storage.list_files(fs, path, ".jsonl")
        )
    except (FileNotFoundError, OSError):
        return False


def build_frozen_benchmark(
    units_uri: str | None,
    config: BenchmarkConfig,
    split: str = "val",
    image_root: str | None = None,
) -> FrozenBenchmark:
    """The benchmark of `units_uri` under config.protocol: an authors' unit file read
    verbatim (protocol paper: nothing our validation would drop is lost; protocol csclip:
    through csclip.authors), a units table's `split`, or, with no URI, the
    synthetic world's split. image_root is joined to relative image paths of unit files."""
    from csclip.records import load_split
    from csclip.world.config import WorldConfig

    built_from: dict[str, object] = {"units": units_uri or "synthetic world", "split": split}
    if units_uri and is_authors_unit_file(units_uri):
        built_from["split"] = None  # their builder reads the whole file
        if config.protocol in ("auto", "paper"):
            from csclip.authors import read_verbatim_records

            verbatim = read_verbatim_records(units_uri, image_root)
            benchmark = build_paper_benchmark(verbatim, config.num_samples, config.paper_seed)
            images = {r.image_id: r.image_path for r in verbatim}
            return _frozen(benchmark, images, built_from, config)
        records = _authors_records(units_uri, image_root)
    else:
        records = load_split(units_uri, split, WorldConfig())
    benchmark = build_for_protocol(records, config)
    images = {r.image_id: r.image_path for r in records}
    return _frozen(benchmark, images, built_from, config)


def _authors_records(uri: str, image_root: str | None) -> list[UnitsRecord]:
    from csclip.authors import read_authors_uri

    result = read_authors_uri(uri, image_root)
    if result.rejections:
        log.warning("%s: %d records rejected (%s)", uri, len(result.rejections),
                    result.counts_by_reason())
    return result.records


def _frozen(
    benchmark: HalfTruthBenchmark,
    images: dict[str, str | None],
    built_from: dict[str, object],
    config: BenchmarkConfig,
) -> FrozenBenchmark:
    if not benchmark.items:
        reasons = ", ".join(f"{c}/{r}: {n}" for (c, r), n in benchmark.skipped.items())
        raise DataError(f"half-truth benchmark: {benchmark.num_images} images gave no items "
                        f"(skips: {reasons}); units need foils and images")
    if benchmark.protocol == Protocol.PAPER:
        built_from.update(num_samples=config.num_samples, seed=config.paper_seed)
    else:
        built_from.update(seed=config.seed)
    built_from.update(num_records=benchmark.num_records, num_images=benchmark.num_images)
    used = {item.image_id for item in benchmark.items}
    return FrozenBenchmark(benchmark, {k: v for k, v in images.items() if k in used}, built_from)


# ---------------------------------------------------------------------------------------
# Writing and reading
# ---------------------------------------------------------------------------------------


def write_benchmark_file(frozen: FrozenBenchmark, path: str | Path) -> Path:
    """Write `frozen` as JSON (one item per line, so diffs stay readable)."""
    path = Path(path)
    if path.suffix != ".json":
        raise DataError(f"benchmark file {path}: use a .json file name")
    path.parent.mkdir(parents=True, exist_ok=True)
    bench = frozen.benchmark
    counts = Counter(item.condition for item in bench.items)
    header = {
        "format": FORMAT,
        "version": VERSION,
        "protocol": bench.protocol,
        "content_hash": frozen.content_hash,
        "built_from": frozen.built_from,
        "counts": {c.slug: counts.get(c.slug, 0) for c in ALL_CONDITIONS},
        "skipped": {},
    }
    for (condition, reason), count in bench.skipped.items():
        header["skipped"].setdefault(condition, {})[reason] = count
    lines = [json.dumps({**asdict(item), "image": frozen.images.get(item.image_id)},
                        ensure_ascii=False) for item in bench.items]
    text = json.dumps(header, indent=1, ensure_ascii=False)[:-2]
    text += ',\n "items": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    path.write_text(text, encoding="utf-8")
    return path


def read_benchmark_file(path: str | Path) -> FrozenBenchmark:
    """A benchmark file, checked: format and version, every item's fields and condition,
    and the content hash against the items. Raises DataError (one line) otherwise."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"benchmark file not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise DataError(f"{path}: not a benchmark file (not valid JSON: {err}); "
                        "write one with `csclip benchmark build`") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a benchmark file (no \"format\": \"{FORMAT}\"); "
                        "write one with `csclip benchmark build`")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: benchmark file version {data.get('version')!r}; this csclip "
                        f"reads version {VERSION}")
    protocol = data.get("protocol")
    if protocol not in {p.value for p in Protocol}:
        raise DataError(f"{path}: protocol {protocol!r}; expected one of {[p.value for p in Protocol]}")
    raw_items = data.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise DataError(f"{path}: \"items\" must be a non-empty list")
    items, images = [], {}
    for index, raw in enumerate(raw_items):
        item, image = _item(raw, f"{path}: items[{index}]")
        items.append(item)
        images.setdefault(item.image_id, image)
    stated, actual = data.get("content_hash"), benchmark_hash(items, protocol)
    if stated != actual:
        raise DataError(f"{path}: content hash {stated} does not match its items ({actual}): "
                        "the file was edited or damaged; rebuild it with `csclip benchmark build`")
    built_from = data.get("built_from") if isinstance(data.get("built_from"), dict) else {}
    raw_skipped = data.get("skipped") if isinstance(data.get("skipped"), dict) else {}
    skipped = {(c, r): n for c, reasons in raw_skipped.items() if isinstance(reasons, dict)
               for r, n in reasons.items()}
    benchmark = HalfTruthBenchmark(
        tuple(items), skipped, len(images), int(built_from.get("num_records") or 0), protocol
    )
    return FrozenBenchmark(benchmark, images, built_from)


def _item(raw: object, where: str) -> tuple[HalfTruthItem, str | None]:
    if not isinstance(raw, dict):
        raise DataError(f"{where}: an item must be an object")
    missing = [name for name in _ITEM_FIELDS if not isinstance(raw.get(name), str)]
    if missing:
        raise DataError(f"{where}: fields {missing} must be strings")
    item = HalfTruthItem(**{name: raw[name] for name in _ITEM_FIELDS})
    condition = CONDITION_BY_SLUG.get(item.condition)
    if condition is None or condition.group != item.group:
        raise DataError(f"{where}: condition {item.condition!r} / group {item.group!r} is not "
                        f"one of {[(c.slug, c.group) for c in ALL_CONDITIONS]}")
    image = raw.get("image")
    if image is not None and not isinstance(image, str):
        raise DataError(f"{where}: \"image\" must be a path, a URI or null")
    return item, image


# ---------------------------------------------------------------------------------------
# Scoring a frozen benchmark
# ---------------------------------------------------------------------------------------


def prepare_frozen(
    frozen: FrozenBenchmark,
    records: list[UnitsRecord] | None = None,
    image_root: str | None = None,
) -> PreparedBenchmark:
    """The frozen items ready to score (no image-side items: those are built from units).
    Images come from the file's paths (relative ones under image_root); an image the file
    has no path for comes from `records` (the units it was built from). Raises DataError
    for an image found in neither."""
    images: dict[str, ImageSource] = {}
    without_path = []
    for image_id, image in frozen.images.items():
        if image is None:
            without_path.append(image_id)
        elif image_root and not image.startswith("/") and "://" not in image:
            images[image_id] = f"{image_root.rstrip('/')}/{image}"
        else:
            images[image_id] = image
    if without_path:
        if not records:
            raise DataError(f"benchmark file: {len(without_path)} images (e.g. "
                            f"{without_path[0]!r}) have no path in the file; pass the units "
                            "they were built from (--units, or the synthetic world's config)")
        images.update(image_sources(records, without_path))
    return PreparedBenchmark(frozen.benchmark, (), images)

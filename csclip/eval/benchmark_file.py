"""Frozen half-truth benchmark files: the items of one protocol written once, with their
provenance and a content hash, so that any model is scored on exactly those items
(`csclip benchmark build`, `csclip evaluate --benchmark FILE`). The authors never released
their benchmark as a file; this makes it one that people can share and cite. Pure: no ray.

Layout (JSON): format, version, protocol, content_hash, images_digest, built_from (units
URI, split, num_samples, seed, counts of records and images), counts per condition, skipped
({condition: {reason: images}}) and items, each with image_id, image (its path, relative to
the build's image root where it was under it; null where the source held the bytes),
image_sha256 (the image file's bytes), sample_id (the caption), condition, group, unit,
foil, anchor, completion, half_truth. The hash covers the protocol, every item's ids,
condition and texts, and the images' bytes (images_digest), not where the images are
stored: images moved to another root score the same benchmark, and an image whose bytes
changed is refused when scored or verified. So two files with one hash score any model
identically.

A file is someone else's input: its image paths must stay inside the image root
(resolve_image) unless benchmark.allow_outside_image_root says otherwise.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from csclip import storage
from csclip.authors import read_authors_uri, read_verbatim_records
from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.encoder import CROP_MARK, DIGEST_MARK, ImageSource, image_sources, load_image
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
from csclip.progress import progress
from csclip.records import load_split
from csclip.storage import filesystem_for, read_bytes
from csclip.units import UnitsRecord, units_table_uri

log = logging.getLogger(__name__)

FORMAT = "csclip-halftruth-benchmark"
# 2: each image's sha256 (image_sha256) and their digest in the hash. Version 1 files did
# not pin their images and are refused with a line saying to rebuild them.
VERSION = 2
_ITEM_FIELDS = tuple(f.name for f in fields(HalfTruthItem))
_READ_THREADS = 16  # image reads at build time (S3 latency, not CPU, is the limit)


@dataclass(frozen=True)
class FrozenBenchmark:
    """A benchmark file's content: the benchmark (its images_digest set), each image's path
    (None: bytes held by the source records), each image's sha256 and where it was built
    from."""

    benchmark: HalfTruthBenchmark
    images: dict[str, str | None]
    built_from: dict[str, object]
    image_sha256: dict[str, str]

    @property
    def content_hash(self) -> str:
        return self.benchmark.content_hash


def images_digest(image_sha256: Mapping[str, str]) -> str:
    """ "sha256:<hex>" of every (image id, sha256 of its bytes), sorted by id."""
    lines = "".join(f"{image_id}\t{digest}\n" for image_id, digest in sorted(image_sha256.items()))
    return "sha256:" + hashlib.sha256(lines.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------------------


def is_authors_unit_file(uri: str) -> bool:
    """Whether `uri` names the authors' unit JSON (a .json / .jsonl file, a glob of them,
    or a directory holding them) rather than a units table (Parquet)."""
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
    synthetic world's split. image_root is joined to relative image paths of unit files
    and of units tables."""
    built_from: dict[str, object] = {"units": units_uri or "synthetic world", "split": split}
    # An extraction's --out folder holds JSON markers beside units/: a units table.
    units_uri = units_table_uri(units_uri) if units_uri else None
    if units_uri and is_authors_unit_file(units_uri):
        built_from["split"] = None  # their builder reads the whole file
        if config.protocol in ("auto", "paper"):
            verbatim = read_verbatim_records(units_uri, image_root)
            benchmark = build_paper_benchmark(verbatim, config.num_samples, config.paper_seed)
            images = {r.image_id: r.image_path for r in verbatim}
            sources: Mapping[str, ImageSource | None] = images
            return _frozen(benchmark, images, built_from, config, sources, image_root)
        records = _authors_records(units_uri, image_root)
    else:
        records = records_under_root(load_split(units_uri, split, WorldConfig(),
                                                split_setting="--split NAME"), image_root)
    benchmark = build_for_protocol(records, config)
    images = {r.image_id: r.image_path for r in records}
    sources = image_sources(records, sorted({item.image_id for item in benchmark.items}))
    return _frozen(benchmark, images, built_from, config, sources, image_root)


def records_under_root(records: list[UnitsRecord], image_root: str | None) -> list[UnitsRecord]:
    """`records` with each relative image_path joined to image_root (--image-root): a
    units table keeps the paths its extraction's input gave, often relative to an image
    folder. Absolute paths and URIs stay as they are."""
    if not image_root:
        return records
    root = image_root.rstrip("/")
    return [replace(r, image_path=f"{root}/{r.image_path}")
            if r.image_path and not r.image_path.startswith(("/", "~")) and "://" not in r.image_path
            else r for r in records]


def _authors_records(uri: str, image_root: str | None) -> list[UnitsRecord]:
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
    sources: Mapping[str, ImageSource | None],
    image_root: str | None,
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
    used = sorted({item.image_id for item in benchmark.items})
    digests = _read_digests({image_id: sources.get(image_id) for image_id in used})
    pinned = HalfTruthBenchmark(benchmark.items, benchmark.skipped, benchmark.num_images,
                                benchmark.num_records, benchmark.protocol, images_digest(digests))
    stored = {image_id: _under_root(images.get(image_id), image_root) for image_id in used}
    return FrozenBenchmark(pinned, stored, built_from, digests)


def _read_digests(sources: Mapping[str, ImageSource | None]) -> dict[str, str]:
    """The sha256 of each image's bytes (a URI read now, several at a time). Raises
    DataError naming an image that cannot be read: a file pins its images, so they must be
    there when it is built."""

    def digest(item: tuple[str, ImageSource | None]) -> tuple[str, str]:
        image_id, source = item
        if source is None:
            raise DataError(f"benchmark build: image {image_id!r} has neither a path nor bytes "
                            "in the units")
        if isinstance(source, str):
            try:
                source = read_bytes(*filesystem_for(source.partition(CROP_MARK)[0]))
            except DataError as err:
                raise DataError(f"benchmark build: image {image_id!r} cannot be read ({err}); "
                                "the file records each image's sha256, so its images must be "
                                "there (--image-root joins a unit file's relative paths)") from err
        return image_id, hashlib.sha256(bytes(source)).hexdigest()

    with ThreadPoolExecutor(_READ_THREADS) as pool:
        return dict(progress(pool.map(digest, sources.items()), desc="benchmark build: hash images",
                             total=len(sources), unit="image"))


def _under_root(path: str | None, image_root: str | None) -> str | None:
    """A path under the build's image root stored relative to it (scored with any copy of
    the images: --image-root); other paths as they are."""
    if path is None or not image_root:
        return path
    root = image_root.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) else path


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
        "images_digest": bench.images_digest,
        "built_from": frozen.built_from,
        "counts": {c.slug: counts.get(c.slug, 0) for c in ALL_CONDITIONS},
        "skipped": {},
    }
    for (condition, reason), count in bench.skipped.items():
        header["skipped"].setdefault(condition, {})[reason] = count
    lines = [json.dumps({**asdict(item), "image": frozen.images.get(item.image_id),
                         "image_sha256": frozen.image_sha256[item.image_id]},
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
    except RecursionError as err:
        raise DataError(f"{path}: not a benchmark file (JSON nested deeper than the parser "
                        "reads); write one with `csclip benchmark build`") from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DataError(f"{path}: not a benchmark file (no \"format\": \"{FORMAT}\"); "
                        "write one with `csclip benchmark build`")
    if data.get("version") == 1:
        raise DataError(f"{path}: a version 1 benchmark file, whose hash does not pin its "
                        "images; rebuild it with `csclip benchmark build` (the same --units and "
                        "flags give the same items, now with each image's sha256)")
    if data.get("version") != VERSION:
        raise DataError(f"{path}: benchmark file version {data.get('version')!r}; this csclip "
                        f"reads version {VERSION}")
    protocol = data.get("protocol")
    if protocol not in {p.value for p in Protocol}:
        raise DataError(f"{path}: protocol {protocol!r}; expected one of {[p.value for p in Protocol]}")
    raw_items = data.get("items")
    if not isinstance(raw_items, list) or not raw_items:
        raise DataError(f"{path}: \"items\" must be a non-empty list")
    items, images, digests = [], {}, {}
    for index, raw in enumerate(raw_items):
        where = f"{path}: items[{index}]"
        item, image, digest = _item(raw, where)
        items.append(item)
        if images.setdefault(item.image_id, image) != image or \
                digests.setdefault(item.image_id, digest) != digest:
            raise DataError(f"{where}: image {item.image_id!r} has another path or sha256 than "
                            "in an earlier item: the file was edited or damaged")
    digest = images_digest(digests)
    if data.get("images_digest") != digest:
        raise DataError(f"{path}: images_digest {data.get('images_digest')} does not match its "
                        f"items' image_sha256 ({digest}): the file was edited or damaged; "
                        "rebuild it with `csclip benchmark build`")
    stated, actual = data.get("content_hash"), benchmark_hash(items, protocol, digest)
    if stated != actual:
        raise DataError(f"{path}: content hash {stated} does not match its items ({actual}): "
                        "the file was edited or damaged; rebuild it with `csclip benchmark build`")
    built_from = data.get("built_from") if isinstance(data.get("built_from"), dict) else {}
    raw_skipped = data.get("skipped") if isinstance(data.get("skipped"), dict) else {}
    skipped = {(c, r): n for c, reasons in raw_skipped.items() if isinstance(reasons, dict)
               for r, n in reasons.items()}
    benchmark = HalfTruthBenchmark(
        tuple(items), skipped, len(images), int(built_from.get("num_records") or 0), protocol,
        digest,
    )
    return FrozenBenchmark(benchmark, images, built_from, digests)


def _item(raw: object, where: str) -> tuple[HalfTruthItem, str | None, str]:
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
    digest = raw.get("image_sha256")
    if not isinstance(digest, str) or len(digest) != 64 or \
            any(c not in "0123456789abcdef" for c in digest):
        raise DataError(f"{where}: \"image_sha256\" must be the 64 hex digits of the image's "
                        "sha256")
    return item, image, digest


# ---------------------------------------------------------------------------------------
# Scoring a frozen benchmark
# ---------------------------------------------------------------------------------------


def prepare_frozen(
    frozen: FrozenBenchmark,
    records: list[UnitsRecord] | None = None,
    image_root: str | None = None,
    allow_outside_image_root: bool = False,
) -> PreparedBenchmark:
    """The frozen items ready to score (no image-side items: those are built from units).
    Images come from the file's paths (resolve_image: relative ones under image_root), each
    read with its sha256 checked (csclip.eval.encoder.DIGEST_MARK); an image the file has no
    path for comes from `records` (the units it was built from), checked here. Raises
    DataError for an image found in neither, outside the root or with other bytes."""
    images: dict[str, ImageSource] = {}
    without_path = []
    for image_id, image in frozen.images.items():
        if image is None:
            without_path.append(image_id)
        else:
            uri = resolve_image(image_id, image, image_root, allow_outside_image_root)
            images[image_id] = f"{uri}{DIGEST_MARK}{frozen.image_sha256[image_id]}"
    if without_path:
        if not records:
            raise DataError(f"benchmark file: {len(without_path)} images (e.g. "
                            f"{without_path[0]!r}) have no path in the file; pass the units "
                            "they were built from (--units, or the synthetic world's config)")
        held = image_sources(records, without_path)
        for image_id, source in held.items():
            _check_bytes(image_id, source, frozen.image_sha256[image_id])
        images.update(held)
    return PreparedBenchmark(frozen.benchmark, (), images)


def resolve_image(image_id: str, path: str, image_root: str | None,
                  allow_outside: bool = False) -> str:
    """Where the file's image `path` is read from: a relative path joined to image_root
    (the current directory without one); an absolute path or URI as it is. Unless
    allow_outside, the path must stay inside the root: no ".." component, no absolute path
    or URI that is not under image_root, no "~". The check is on the path's text; links
    inside the root are its owner's choice. Raises DataError naming the image otherwise."""
    root = image_root.rstrip("/") if image_root else None
    absolute = path.startswith(("/", "~")) or "://" in path
    uri = path if absolute or not root else f"{root}/{path}"
    if allow_outside:
        return uri
    inside = ".." not in path.split("/") and (
        not absolute or bool(root and path.startswith(root + "/")))
    if not inside:
        where = f"--image-root {root}" if root else "the current directory (no --image-root)"
        raise DataError(f"benchmark file: image {image_id!r} is at {path!r}, outside {where}; "
                        "give --image-root with the root its paths are under, or "
                        "--allow-outside-image-root to read it where the file says (its bytes "
                        "are checked against the file's sha256 either way)")
    return uri


def _check_bytes(image_id: str, source: ImageSource, expected: str) -> None:
    actual = hashlib.sha256(load_image(source)).hexdigest()
    if actual != expected:
        raise DataError(f"image {image_id!r}: its bytes in the units differ from those the "
                        f"benchmark file was built with (sha256 {actual[:16]}..., the file says "
                        f"{expected[:16]}...); score it against the units it was built from")


def verify_images(frozen: FrozenBenchmark, records: list[UnitsRecord] | None = None,
                  image_root: str | None = None, allow_outside_image_root: bool = False) -> int:
    """Read every image of the file (as prepare_frozen would) and check its sha256; the
    number of images read. Raises DataError naming the first image that differs, is
    missing or lies outside the root."""
    prepared = prepare_frozen(frozen, records, image_root, allow_outside_image_root)
    to_read = [s for s in prepared.images.values() if isinstance(s, str)]
    with ThreadPoolExecutor(_READ_THREADS) as pool:
        # Each image is dropped once checked: a benchmark's images need not fit in memory.
        for _ in progress(pool.map(lambda source: len(load_image(source)), to_read),
                          desc="benchmark verify: check images", total=len(to_read),
                          unit="image"):
            pass
    return len(prepared.images)

"""Evaluation sets read from webdataset shards: CLIP_benchmark's webdataset folders (its
`wds_<name>` copies on the HuggingFace hub) for zero-shot classification, and retrieval
over a shard pattern or a CLIP_benchmark retrieval folder (`csclip evaluate
--retrieval-shards`); every shard read by csclip.shards.read.iter_shard, every bad sample a
counted rejection with its reason.

A CLIP_benchmark folder is what clip_benchmark.datasets.builder.build_wds_dataset reads and
clip_benchmark.webdataset_builder.convert_dataset writes: `classnames.txt` and
`zeroshot_classification_templates.txt` (each line stripped, one per class / template),
an optional `dataset_type.txt` (`retrieval`; absent: classification), and per split
`<split>/nshards.txt` with the shards `<split>/{0..N-1}.tar`. A classification sample is
`{key}.webp|png|jpg|jpeg` (the first of these it has, their order) and `{key}.cls` (the
class index as text); a retrieval sample has `{key}.txt`, one caption a line.
tests/test_eval_shards.py writes folders with convert_dataset and checks that we read the
(image, label) and (image, captions) pairs build_wds_dataset reads.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from csclip.config.eval import RetrievalCounting
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.retrieval import RetrievalSet, retrieval_metrics, retrieval_set
from csclip.shards.layout import PIXELS_SUFFIX, shard_stem
from csclip.shards.read import UNREADABLE_SHARD, ShardSample, iter_shard
from csclip.shards.uris import expand_shards
from csclip.storage import exists, filesystem_for, join, read_bytes
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

# CLIP_benchmark's names (build_wds_dataset).
CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"
DATASET_TYPE_FILE = "dataset_type.txt"
NSHARDS_FILE = "nshards.txt"
# Its to_tuple(["webp", "png", "jpg", "jpeg"], "cls"): the first image suffix a sample has.
WDS_IMAGE_SUFFIXES = ("webp", "png", "jpg", "jpeg")
CLASS_SUFFIX = "cls"
WDS_LAYOUT = (f"CLIP_benchmark's webdataset folder: {CLASSNAMES_FILE}, {TEMPLATES_FILE}, "
              f"test/{NSHARDS_FILE} and test/{{0..N-1}}.tar of {{key}}.webp|png|jpg + "
              "{key}.cls")

# Reasons a sample is rejected, beside csclip.shards.read's (no_image, no_caption,
# bad_json, repeated_member, repeated_key, truncated_shard).
NO_CLASS = "no_class"
BAD_CLASS = "bad_class"  # not an integer, or no class of classnames.txt
CONFLICTING_IMAGE = "conflicting_image"  # an image_id whose samples hold different images
SHOWN_REJECTIONS = 3  # rejected samples a log line names


# ---------------------------------------------------------------------------------------
# Accounting
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rejection:
    shard: str
    key: str
    reason: str
    detail: str


@dataclass(frozen=True)
class ShardAccounting:
    """Samples read from the shards = kept + rejected (a shard cut short counts its cut as
    one read sample, rejected)."""

    num_read: int
    num_kept: int
    rejected: tuple[Rejection, ...] = ()

    def __post_init__(self) -> None:
        assert self.num_read == self.num_kept + len(self.rejected), self

    def by_reason(self) -> dict[str, int]:
        return dict(sorted(Counter(r.reason for r in self.rejected).items()))

    def metrics(self, prefix: str) -> dict[str, float]:
        """`<prefix>_num_read`, `<prefix>_num_rejected` and `<prefix>_rejected_<reason>`."""
        out = {f"{prefix}_num_read": float(self.num_read),
               f"{prefix}_num_rejected": float(len(self.rejected))}
        out.update({f"{prefix}_rejected_{r}": float(n) for r, n in self.by_reason().items()})
        return out

    def log(self, what: str) -> None:
        """One line: read = kept + rejected, by reason, the first few named (a warning when
        any was rejected)."""
        if not self.rejected:
            log.info("%s: %d samples read, all kept", what, self.num_read)
            return
        shown = "; ".join(f"{r.detail}" for r in self.rejected[:SHOWN_REJECTIONS])
        log.warning("%s: %d samples read = %d kept + %d rejected (%s), e.g. %s", what,
                    self.num_read, self.num_kept, len(self.rejected),
                    ", ".join(f"{n} {r}" for r, n in self.by_reason().items()), shown)


# ---------------------------------------------------------------------------------------
# A CLIP_benchmark webdataset folder
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WdsFolder:
    """A CLIP_benchmark webdataset folder's split: its shard URIs, dataset type, and the
    class names and templates where the folder has them (None where not)."""

    root: str
    split: str
    shards: tuple[str, ...]
    dataset_type: str
    classnames: tuple[str, ...] | None
    templates: tuple[str, ...] | None


def is_wds_folder(root: str, split: str = "test") -> bool:
    """Whether `root` (local or s3://) holds CLIP_benchmark's `<split>/nshards.txt`."""
    return exists(*filesystem_for(join(root, split, NSHARDS_FILE)))


def _text(uri: str) -> str:
    try:
        return read_bytes(*filesystem_for(uri)).decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{uri}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def _lines(uri: str) -> tuple[str, ...] | None:
    """build_wds_dataset's read: every line stripped, blank ones kept; None without the
    file."""
    if not exists(*filesystem_for(uri)):
        return None
    return tuple(line.strip() for line in _text(uri).splitlines())


def open_wds_folder(root: str, split: str = "test") -> WdsFolder:
    """The `split` of the CLIP_benchmark folder `root`. Raises DataError when nshards.txt
    is missing or not a positive count, or (local) a shard of it does not exist."""
    nshards_uri = join(root, split, NSHARDS_FILE)
    if not exists(*filesystem_for(nshards_uri)):
        raise DataError(f"{root}: no {split}/{NSHARDS_FILE} (expects {WDS_LAYOUT})")
    text = _text(nshards_uri).strip()
    if not text.isdigit() or int(text) < 1:
        raise DataError(f"{nshards_uri}: {text[:40]!r} is not a number of shards")
    shards = expand_shards(join(root, split, f"{{0..{int(text) - 1}}}.tar"))
    dataset_type = (_lines(join(root, DATASET_TYPE_FILE)) or ("classification",))[0].lower()
    return WdsFolder(root, split, tuple(shards), dataset_type or "classification",
                     _lines(join(root, CLASSNAMES_FILE)), _lines(join(root, TEMPLATES_FILE)))


# ---------------------------------------------------------------------------------------
# Classification: {key}.<image> + {key}.cls
# ---------------------------------------------------------------------------------------

def _samples(shard: str, **options) -> Iterator[ShardSample]:
    """csclip.shards.read.iter_shard(shard, **options), a shard of which nothing reads as
    a tar being a DataError (one shard of an evaluation set, not a bad sample)."""
    for sample in iter_shard(shard, **options):
        if sample.reject == UNREADABLE_SHARD:
            raise DataError(f"shard {shard} is not a readable tar ({sample.detail})")
        yield sample


def _rejection(sample: ShardSample) -> Rejection:
    """A rejected sample as counted here, its detail naming the shard."""
    detail = sample.detail or sample.key
    if not detail.startswith(sample.shard):
        detail = f"{sample.shard}: {detail}"
    return Rejection(sample.shard, sample.key, sample.reject or "", detail)


@dataclass(frozen=True)
class ClassifiedImages:
    """A CLIP_benchmark classification split as read: image key -> encoded bytes, image
    key -> class index, the folder's class names and templates, and the accounting."""

    images: dict[str, bytes]
    labels: dict[str, int]
    classnames: tuple[str, ...]
    templates: tuple[str, ...]
    accounting: ShardAccounting


def _labelled(sample: ShardSample, num_classes: int) -> tuple[bytes, int] | Rejection:
    """(image bytes, class index) of a sample with an image, or why it is rejected."""
    where = f"{sample.shard}: {sample.key}"
    if CLASS_SUFFIX not in sample.members:
        return Rejection(sample.shard, sample.key, NO_CLASS, f"{where}: no .{CLASS_SUFFIX}")
    raw = sample.members[CLASS_SUFFIX]
    try:
        label = int(raw)  # webdataset's decoder: int() of the member's bytes
    except ValueError:
        label = None
    if label is None or not 0 <= label < num_classes:
        return Rejection(sample.shard, sample.key, BAD_CLASS,
                         f"{where}: .{CLASS_SUFFIX} {raw[:20]!r} is no class index of "
                         f"0..{num_classes - 1}")
    return sample.image, label


def read_wds_classification(root: str, split: str = "test", key_prefix: str = ""
                            ) -> ClassifiedImages:
    """The `split` of CLIP_benchmark's classification folder `root` (local or s3://), as
    build_wds_dataset reads it: the shards in order, the class names and templates of its
    files. Keys: `<key_prefix><split>/<shard stem>/<key>`. Raises DataError for a folder
    without nshards.txt, class names or templates (CLIP_benchmark asserts both), of
    another dataset type, or a shard that cannot be opened; a bad sample is rejected."""
    folder = open_wds_folder(root, split)
    if folder.dataset_type != "classification":
        raise DataError(f"{root}: {DATASET_TYPE_FILE} says {folder.dataset_type!r}; a "
                        "zero-shot classification folder has none (or 'classification')")
    for name, value in ((CLASSNAMES_FILE, folder.classnames), (TEMPLATES_FILE, folder.templates)):
        if not value:
            raise DataError(f"{root}: no {name} (expects {WDS_LAYOUT})")
    images: dict[str, bytes] = {}
    labels: dict[str, int] = {}
    rejected: list[Rejection] = []
    num_read = 0
    for shard in folder.shards:
        # No caption: the class is the sample's text. A sample's image is the first of
        # WDS_IMAGE_SUFFIXES it has, as CLIP_benchmark's to_tuple takes it.
        for sample in _samples(shard, members=(CLASS_SUFFIX,), require_caption=False,
                               image_suffixes=WDS_IMAGE_SUFFIXES):
            num_read += 1
            found = _rejection(sample) if sample.reject else _labelled(
                sample, len(folder.classnames))
            if isinstance(found, Rejection):
                rejected.append(found)
                continue
            key = f"{key_prefix}{split}/{shard_stem(shard)}/{sample.key}"
            images[key], labels[key] = found
    accounting = ShardAccounting(num_read, len(labels), tuple(rejected))
    return ClassifiedImages(images, labels, folder.classnames, folder.templates, accounting)


# ---------------------------------------------------------------------------------------
# Retrieval: {key}.<image> + {key}.txt (or the json's caption)
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardRetrieval:
    """Image-text pairs read from shards: the RetrievalSet, image id -> encoded bytes,
    and the accounting."""

    rset: RetrievalSet
    images: dict[str, bytes]
    accounting: ShardAccounting


@dataclass(frozen=True)
class RetrievalShards:
    """The shards of a retrieval source, and whether each `.txt` holds one caption a line
    (a CLIP_benchmark folder) rather than one caption (a shard pattern)."""

    shards: tuple[str, ...]
    by_lines: bool


def retrieval_shards(source: str, split: str = "test") -> RetrievalShards:
    """The shards of a shard pattern or of a CLIP_benchmark retrieval folder's `split`.
    Raises DataError when a shard of the pattern (local) does not exist, or `source` is
    neither a pattern nor a retrieval folder."""
    if "{" in source or "*" in source or "::" in source or source.endswith(".tar"):
        return RetrievalShards(tuple(expand_shards(source)), False)
    if not is_wds_folder(source, split):
        raise DataError(f"{source}: neither a shard pattern (DIR/{{00000..00009}}.tar) nor "
                        f"a CLIP_benchmark retrieval folder ({split}/{NSHARDS_FILE})")
    folder = open_wds_folder(source, split)
    if folder.dataset_type != "retrieval":
        raise DataError(f"{source}: {DATASET_TYPE_FILE} says {folder.dataset_type!r}, not "
                        "'retrieval': a classification folder (the zero-shot suites read it)")
    return RetrievalShards(folder.shards, True)


def check_retrieval_shards(sources: Mapping[str, str], split: str = "test") -> None:
    """Refuse, before any model loads, a source of suites.retrieval_shards (dataset ->
    source) whose shards are not there: DataError naming the dataset."""
    for dataset, source in sources.items():
        try:
            retrieval_shards(source, split)
        except DataError as err:
            raise DataError(f"retrieval shards {dataset}: {err}") from err


def read_shard_retrieval(source: str, split: str = "test") -> ShardRetrieval:
    """Every (image, caption) of the shards of `source`: a shard pattern (local or s3://,
    `DIR/{00000..00009}.tar`, `::` between patterns) or a CLIP_benchmark retrieval folder
    (dataset_type.txt `retrieval`, `<split>/nshards.txt`).

    Pattern: one caption per sample (`.txt`, else the `.json`'s caption); samples whose
    `.json` has the same `image_id` are one image with several captions (COCO's five),
    else each sample is its own image. CLIP_benchmark folder: each sample one image, its
    `.txt` one caption a line (str.splitlines, as build_wds_dataset). Images, and each
    image's captions, in the shards' order. A sample without image or caption, with bad
    JSON, or whose image_id another sample shows with a different image, is rejected.
    Raises DataError for a shard that cannot be opened or read at all, none kept, or
    shards of transformed pixels (`csclip shards --encoding pixels`)."""
    found = retrieval_shards(source, split)
    shards, by_lines = found.shards, found.by_lines
    records: list[UnitsRecord] = []
    images: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    rejected: list[Rejection] = []
    num_read = 0
    for shard in shards:
        for sample in _samples(shard):
            num_read += 1
            if sample.image_suffix == PIXELS_SUFFIX:
                raise DataError(f"{shard}: {sample.key} holds transformed pixels (csclip shards "
                                "--encoding pixels); evaluate shards of encoded images")
            if sample.reject:
                rejected.append(_rejection(sample))
                continue
            own_id = sample.meta.get("image_id")
            image_id = str(own_id) if own_id is not None and not by_lines \
                else f"{shard_stem(shard)}/{sample.key}"
            digest = hashlib.sha256(sample.image).hexdigest()
            if digests.setdefault(image_id, digest) != digest:
                rejected.append(Rejection(shard, sample.key, CONFLICTING_IMAGE,
                                          f"{shard}: {sample.key}: image_id {image_id!r} "
                                          "shows another image in an earlier sample"))
                continue
            images.setdefault(image_id, sample.image)
            captions = sample.caption.splitlines() if by_lines else [sample.caption]
            records.extend(UnitsRecord(f"{shard_stem(shard)}/{sample.key}#{n}", image_id, text,
                                       split) for n, text in enumerate(captions))
    accounting = ShardAccounting(num_read, num_read - len(rejected), tuple(rejected))
    if not records:
        raise DataError(f"{source}: no image with a caption in {len(shards)} shards "
                        f"({len(rejected)} samples rejected: {accounting.by_reason()})")
    return ShardRetrieval(retrieval_set(records), images, accounting)


def evaluate_shard_retrieval(encoder: Encoder, source: str, dataset: str = "shards",
                             counting: RetrievalCounting = "clip_benchmark",
                             split: str = "test") -> dict[str, float]:
    """Recall@1/5/10 both ways over the shards of `source` (read_shard_retrieval): keys
    `<dataset>_ret_i2t`, `<dataset>_ret_t2i` (R@1), `<dataset>_ret_{i2t,t2i}_r{5,10}`,
    counts, and the accounting (`<dataset>_ret_num_read`, `_num_rejected`,
    `_rejected_<reason>`), counted `counting`'s way (csclip.eval.retrieval)."""
    read = read_shard_retrieval(source, split)
    read.accounting.log(f"{dataset} retrieval shards {source}")
    features = encoder.features(read.rset.texts, read.images)
    metrics = retrieval_metrics(features, read.rset, counting=counting)
    out = {f"{dataset}_{key}": value for key, value in metrics.items()}
    out.update(read.accounting.metrics(f"{dataset}_ret"))
    log.info("%s retrieval from shards: %d images, %d captions: R@1 i2t %.1f t2i %.1f",
             dataset, len(read.rset.image_ids), len(read.rset.instances),
             out[f"{dataset}_ret_i2t"], out[f"{dataset}_ret_t2i"])
    return out

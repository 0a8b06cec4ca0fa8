"""What every real-data benchmark loader produces and how it is scored: items of three
shapes (one image with candidate texts, one text with candidate images, Winoground-style
pairs), each benchmark's tie rule, per-subset and per-benchmark I2T / T2I / Group
accuracies, the accounting of every record read (scored, or skipped with a reason), and the
image folder listing that lets a missing image be counted, not crash.
"""

from __future__ import annotations

import json
import logging
import posixpath
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow.fs as pafs

from csclip import storage
from csclip.errors import DataError
from csclip.eval.encoder import Encoder, FeatureTables, ImageSource
from csclip.storage import filesystem_for, inside_folder, read_bytes

log = logging.getLogger(__name__)

# strict: the true text must score strictly above every other candidate (a tie is wrong).
# argmax_first: the official code takes np.argmax over the candidates in the benchmark's
# own order, so a tie goes to the earliest candidate (right when the true one is first).
TieRule = Literal["strict", "argmax_first"]


class BenchmarkNotFound(DataError):
    """A benchmark's files are not under the data root (a skip, reported in one line)."""


class IncompleteBenchmark(DataError):
    """A benchmark's files are there but some of its images are not (or cannot be read):
    its score would be over part of the benchmark. One line naming the layout it expects
    and what it found; suites.allow_partial scores the rest instead."""


# Why a record read from a benchmark's files is not scored. Every record is either an
# item or one of these, so read = scored + skipped holds per subset.
MISSING_IMAGE = "missing_image"  # an image the record names is not in the folder
UNREADABLE_IMAGE = "unreadable_image"  # there, but empty / not an image
MALFORMED_RECORD = "malformed_record"  # one record lacks what the format requires
NOT_VALIDATED = "not_validated"  # the benchmark's own filter (VALSE: mturk caption < 2)
SKIP_REASONS: tuple[str, ...] = (MISSING_IMAGE, UNREADABLE_IMAGE, MALFORMED_RECORD, NOT_VALIDATED)
# Skips that mean the data on disk is not the benchmark as published: by default they
# fail the benchmark (suites.allow_partial lets them through as counted skips).
IMAGE_SKIPS = frozenset((MISSING_IMAGE, UNREADABLE_IMAGE))


@dataclass(frozen=True)
class TextChoice:
    """I2T: one image and its candidate texts in the benchmark's own order."""

    subset: str
    image: str  # key into SuiteData.images
    texts: tuple[str, ...]
    true_indices: tuple[int, ...]  # several for SugarCrepe++ / BLA (all must win)
    category: str = ""  # ARO: the relation or attribute pair (macro accuracy)


@dataclass(frozen=True)
class ImageChoice:
    """T2I: one text and its candidate images in the benchmark's own order."""

    subset: str
    text: str
    images: tuple[str, ...]
    true_index: int


@dataclass(frozen=True)
class Pair:
    """Winoground-style: caption_k describes image_k; the other caption is its foil."""

    subset: str
    image_0: str
    image_1: str
    caption_0: str
    caption_1: str


@dataclass(frozen=True)
class MacroRule:
    """ARO: a subset's accuracy is the mean over categories with at least `min_count`
    items, leaving out `excluded` categories."""

    min_count: int = 25
    excluded: frozenset[str] = frozenset()


MAX_EXAMPLES = 3  # missing image paths quoted in the error line


@dataclass
class SuiteData:
    """One benchmark, loaded: its items, the images they need (key -> bytes or URI), the
    records left out per subset and reason (SKIP_REASONS), and its scoring rule. `layout`
    names the layout the loader found (or expects) and `root` where it looked, for the
    one-line error when images are missing."""

    benchmark: str
    tie_rule: TieRule = "strict"
    images: dict[str, ImageSource] = field(default_factory=dict)
    text_choices: list[TextChoice] = field(default_factory=list)
    image_choices: list[ImageChoice] = field(default_factory=list)
    pairs: list[Pair] = field(default_factory=list)
    skip_counts: dict[tuple[str, str], int] = field(default_factory=dict)  # (subset, reason)
    macro: Mapping[str, MacroRule] = field(default_factory=dict)  # subset -> rule
    # The benchmark's own score pools its items (Winoground's tags are a breakdown);
    # otherwise it is the unweighted mean over subsets (SugarCrepe, ARO, ...).
    pooled: bool = False
    layout: str = ""
    root: str = ""
    skip_examples: list[str] = field(default_factory=list)  # the first missing image paths
    # Set by limit(): the records read from the whole files (only N per subset are scored).
    records_read: dict[str, int] | None = None
    # A benchmark whose official number is not a per-item choice (BLA's per-sentence
    # credit, SVO-Probes' match / no-match, MMVP's pairs) brings its own scorer.
    scorer: Callable[[FeatureTables, SuiteData], dict[str, SubsetScores]] | None = None
    # Subsets a scorer reports beside the others that stay out of the benchmark's mean
    # (VisMin's per-category numbers beside the paper protocol's pooled "all"; its
    # `average` below takes them).
    breakdown: frozenset[str] = frozenset()
    # A benchmark whose own score is not a mean over its subsets brings its rule:
    # (per-subset scores, direction) -> `<benchmark>_<direction>`, or None for the mean
    # (the paper protocol's VisMin: its pooled "all" and its categories, as the authors').
    average: Callable[[Mapping[str, SubsetScores], str], float | None] | None = None

    def skip(self, subset: str, count: int = 1, reason: str = MISSING_IMAGE,
             example: str = "") -> None:
        """Count `count` records of `subset` as not scored, for `reason` (SKIP_REASONS)."""
        if reason not in SKIP_REASONS:
            raise ValueError(f"unknown skip reason {reason!r}")
        self.skip_counts[(subset, reason)] = self.skip_counts.get((subset, reason), 0) + count
        if example and reason in IMAGE_SKIPS and len(self.skip_examples) < MAX_EXAMPLES:
            self.skip_examples.append(example)

    def resolve(self, subset: str, folder: ImageFolder, *relatives: str) -> tuple[str, ...] | None:
        """The URIs of a record's images (added to `images`), or None after counting the
        record as skipped: missing_image when one is not in `folder`, unreadable_image
        when one is an empty file."""
        refs = []
        for relative in relatives:
            ref, reason = folder.lookup(relative)
            if ref is None or reason is not None:
                self.skip(subset, reason=reason or MISSING_IMAGE,
                          example=ref or join(folder.root, relative))
                return None
            refs.append(ref)
        self.images.update({r: r for r in refs})
        return tuple(refs)

    @property
    def skipped(self) -> dict[str, int]:
        """Records not scored per subset, all reasons together."""
        out: dict[str, int] = {}
        for (subset, _), count in self.skip_counts.items():
            out[subset] = out.get(subset, 0) + count
        return out

    def scored(self) -> dict[str, int]:
        """Items per subset (a pair is one item)."""
        out: dict[str, int] = {}
        for item in (*self.text_choices, *self.image_choices, *self.pairs):
            out[item.subset] = out.get(item.subset, 0) + 1
        return out

    def read(self) -> dict[str, int]:
        """Records read per subset: every one is scored or skipped with a reason (after
        limit(): the whole files' count)."""
        if self.records_read is not None:
            return dict(self.records_read)
        scored, skipped = self.scored(), self.skipped
        return {s: scored.get(s, 0) + skipped.get(s, 0) for s in self.subsets()}

    def image_skips(self) -> dict[str, int]:
        """Per subset, the records skipped because an image is missing or unreadable."""
        out: dict[str, int] = {}
        for (subset, reason), count in self.skip_counts.items():
            if reason in IMAGE_SKIPS:
                out[subset] = out.get(subset, 0) + count
        return out

    def accounting(self) -> str:
        """`<benchmark>: <subset> read N = scored S + skipped K (reason n, ...); ...`."""
        scored, read, skipped = self.scored(), self.read(), self.skipped
        parts = []
        for subset in self.subsets():
            reasons = ", ".join(f"{r} {n}" for (s, r), n in self.skip_counts.items() if s == subset)
            parts.append(f"{subset} read {read.get(subset, 0)} = scored {scored.get(subset, 0)} + "
                         f"skipped {skipped.get(subset, 0)}" + (f" ({reasons})" if reasons else ""))
        return f"{self.benchmark}: " + "; ".join(parts)

    def subsets(self) -> list[str]:
        names = [i.subset for i in self.text_choices] + [i.subset for i in self.image_choices]
        names += [p.subset for p in self.pairs]
        return list(dict.fromkeys(names + [s for s, _ in self.skip_counts]))

    def texts(self) -> list[str]:
        out = [t for i in self.text_choices for t in i.texts]
        out += [i.text for i in self.image_choices]
        out += [t for p in self.pairs for t in (p.caption_0, p.caption_1)]
        return out

    def limit(self, max_per_subset: int | None) -> SuiteData:
        """The first `max_per_subset` items of each subset (and only their images)."""
        if max_per_subset is None:
            return self
        seen: dict[tuple[str, str], int] = {}

        def keep(kind: str, item) -> bool:
            seen[(kind, item.subset)] = seen.get((kind, item.subset), 0) + 1
            return seen[(kind, item.subset)] <= max_per_subset

        out = SuiteData(self.benchmark, self.tie_rule, skip_counts=dict(self.skip_counts),
                        macro=self.macro, pooled=self.pooled, layout=self.layout,
                        root=self.root, skip_examples=list(self.skip_examples),
                        records_read=self.read(), scorer=self.scorer,
                        breakdown=self.breakdown, average=self.average)
        out.text_choices = [i for i in self.text_choices if keep("t", i)]
        out.image_choices = [i for i in self.image_choices if keep("i", i)]
        out.pairs = [p for p in self.pairs if keep("p", p)]
        used = {i.image for i in out.text_choices} | {k for i in out.image_choices for k in i.images}
        used |= {k for p in out.pairs for k in (p.image_0, p.image_1)}
        used |= {k for i in out.text_choices for k in getattr(i, "frames", ())}  # a video's
        out.images = {k: v for k, v in self.images.items() if k in used}
        return out


# ---------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------

def choice_correct(scores: np.ndarray, true_indices: Sequence[int], rule: TieRule) -> bool:
    """Whether a candidate list's scores pick the true candidate(s).

    strict: every true candidate scores strictly above every other one.
    argmax_first: np.argmax (the first maximum) is a true candidate.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if rule == "argmax_first":
        return int(np.argmax(scores)) in true_indices
    is_true = np.zeros(len(scores), dtype=bool)
    is_true[list(true_indices)] = True
    if is_true.all():
        raise ValueError("a choice item needs at least one wrong candidate")
    return bool(scores[is_true].min() > scores[~is_true].max())


def pair_correct(s00: float, s01: float, s10: float, s11: float) -> tuple[bool, bool]:
    """Winoground's text and image scores of one pair from s(I_i, C_j) = s_ij (strict:
    its official code compares with >, so a tie is wrong)."""
    text_ok = s00 > s01 and s11 > s10  # each image prefers its own caption
    image_ok = s00 > s10 and s11 > s01  # each caption prefers its own image
    return text_ok, image_ok


def macro_accuracy(correct: np.ndarray, categories: Sequence[str], rule: MacroRule) -> float:
    """Mean per-category accuracy over categories with at least rule.min_count items,
    leaving out rule.excluded; NaN when no category qualifies."""
    cats = np.asarray(categories)
    values = [float(correct[cats == c].mean()) for c in sorted(set(categories))
              if c not in rule.excluded and (cats == c).sum() >= rule.min_count]
    return float(np.mean(values)) if values else float("nan")


# ---------------------------------------------------------------------------------------
# Scoring
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SubsetScores:
    """One subset's accuracies in percent (None: that direction has no items)."""

    i2t: float | None
    t2i: float | None
    group: float | None
    num_items: int  # items scored: text choices + image choices + pairs


def _mean(values: list[bool]) -> float | None:
    return 100.0 * float(np.mean(values)) if values else None


def score_subsets(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """Per-subset I2T (text choices, pairs' text score), T2I (image choices, pairs' image
    score) and Group (pairs) accuracy."""
    i2t: dict[str, list[bool]] = {}
    t2i: dict[str, list[bool]] = {}
    group: dict[str, list[bool]] = {}
    categories: dict[str, list[str]] = {}
    for item in data.text_choices:
        scores = features.similarity([item.image] * len(item.texts), list(item.texts))
        i2t.setdefault(item.subset, []).append(choice_correct(scores, item.true_indices,
                                                              data.tie_rule))
        categories.setdefault(item.subset, []).append(item.category)
    for item in data.image_choices:
        scores = features.similarity(list(item.images), [item.text] * len(item.images))
        t2i.setdefault(item.subset, []).append(choice_correct(scores, (item.true_index,),
                                                              data.tie_rule))
    for pair in data.pairs:
        s = features.similarity([pair.image_0, pair.image_0, pair.image_1, pair.image_1],
                                [pair.caption_0, pair.caption_1, pair.caption_0, pair.caption_1])
        text_ok, image_ok = pair_correct(*s)
        i2t.setdefault(pair.subset, []).append(text_ok)
        t2i.setdefault(pair.subset, []).append(image_ok)
        group.setdefault(pair.subset, []).append(text_ok and image_ok)
    out = {}
    items = data.scored()
    for subset in data.subsets():
        correct = i2t.get(subset, [])
        i2t_value = _mean(correct)
        if subset in data.macro and correct:
            i2t_value = 100.0 * macro_accuracy(np.array(correct), categories[subset],
                                               data.macro[subset])
        out[subset] = SubsetScores(i2t_value, _mean(t2i.get(subset, [])),
                                   _mean(group.get(subset, [])), items.get(subset, 0))
    return out


def suite_metrics(benchmark: str, subsets: Mapping[str, SubsetScores],
                  skipped: Mapping[str, int], pooled: bool = False,
                  skip_counts: Mapping[tuple[str, str], int] | None = None,
                  read: Mapping[str, int] | None = None,
                  breakdown: Collection[str] = (),
                  average: Callable[[Mapping[str, SubsetScores], str], float | None] | None
                  = None) -> dict[str, float]:
    """`<benchmark>_<subset>_{i2t,t2i,group}`, `<benchmark>_{i2t,t2i,group}` (unweighted
    mean over the subsets that measured it, `breakdown` subsets left out; pooled:
    weighted by their items; `average(subsets, direction)` instead where it gives one), and the
    accounting per subset: `_read` (= `_num` scored + `_skipped`), `_skipped_<reason>`
    for each reason that occurred. A direction no subset measured gets no key."""
    metrics: dict[str, float] = {}
    for direction in ("i2t", "t2i", "group"):
        values, weights = [], []
        for subset, scores in subsets.items():
            value = getattr(scores, direction)
            if value is not None and np.isfinite(value):
                metrics[f"{benchmark}_{subset}_{direction}"] = value
                if subset in breakdown:
                    continue
                values.append(value)
                weights.append(scores.num_items if pooled else 1)
        own = average(subsets, direction) if average is not None else None
        if own is not None:
            metrics[f"{benchmark}_{direction}"] = float(own)
        elif values:
            metrics[f"{benchmark}_{direction}"] = float(np.average(values, weights=weights))
    for subset, scores in subsets.items():
        metrics[f"{benchmark}_{subset}_num"] = float(scores.num_items)
        metrics[f"{benchmark}_{subset}_skipped"] = float(skipped.get(subset, 0))
        records = (read or {}).get(subset, scores.num_items + skipped.get(subset, 0))
        metrics[f"{benchmark}_{subset}_read"] = float(records)
    for (subset, reason), count in (skip_counts or {}).items():
        if subset in subsets and count:
            metrics[f"{benchmark}_{subset}_skipped_{reason}"] = float(count)
    return metrics


def evaluate_suite_data(encoder: Encoder, data: SuiteData) -> tuple[dict[str, float],
                                                                    dict[str, SubsetScores]]:
    """Encode a loaded benchmark through `encoder` and score it: (metrics, per subset)."""
    features = encoder.features(data.texts(), data.images)
    subsets = (data.scorer or score_subsets)(features, data)
    return suite_metrics(data.benchmark, subsets, data.skipped, data.pooled,
                         data.skip_counts, data.read(), data.breakdown, data.average), subsets


# ---------------------------------------------------------------------------------------
# Reading files (local or s3://)
# ---------------------------------------------------------------------------------------

def join(root: str, *parts: str) -> str:
    return posixpath.join(root, *[p for p in parts if p])


def exists(uri: str) -> bool:
    filesystem, path = filesystem_for(uri)
    return storage.exists(filesystem, path)


def first_existing(root: str, *names: str) -> str | None:
    """The first of root/name that exists, or None."""
    for name in names:
        if exists(join(root, name)):
            return join(root, name)
    return None


def read_json(uri: str) -> object:
    """A JSON (or, for *.jsonl, a list of JSON lines) file; malformed content is a
    DataError naming the file."""
    filesystem, path = filesystem_for(uri)
    text = read_bytes(filesystem, path).decode("utf-8")
    try:
        if uri.endswith(".jsonl"):
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{uri}: not valid JSON ({err})") from err


def expect(condition: bool, uri: str, what: str) -> None:
    """Raise DataError naming the file when its content is not in the expected format."""
    if not condition:
        raise DataError(f"{uri}: not in the published format ({what})")


class ImageFolder:
    """The files under an image folder (or the first of several folders that has the
    file: a benchmark's published layout and ours), listed once per directory with their
    sizes, so a missing or empty image is a counted skip, not an error mid-encoding."""

    def __init__(self, root: str, *alternatives: str, strip: tuple[str, ...] = ()) -> None:
        self.root = root
        self.roots = tuple(dict.fromkeys((root, *alternatives)))
        self.strip = strip  # prefixes a record's path may carry that a root already has
        self._listed: dict[str, dict[str, int]] = {}

    def _names(self, directory: str) -> dict[str, int]:
        if directory not in self._listed:
            filesystem, path = filesystem_for(directory)
            infos = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
            self._listed[directory] = {i.path.rsplit("/", 1)[-1]: int(i.size or 0)
                                       for i in infos if i.type == pafs.FileType.File}
        return self._listed[directory]

    def lookup(self, relative: str) -> tuple[str | None, str | None]:
        """(URI, None) for an image that is there; (URI, "unreadable_image") for an
        empty file; (None, "missing_image") when no root has it. A path that leaves the
        folder (absolute, a URI, or `..` above it) is never read: no root has it."""
        variants = [v for v in [relative] + [relative[len(p):] for p in self.strip
                                             if relative.startswith(p)] if inside_folder(v)]
        for root in self.roots:
            for variant in variants:
                uri = join(root, variant)
                directory, name = posixpath.split(uri)
                names = self._names(directory)
                if name in names:
                    return uri, (None if names[name] > 0 else UNREADABLE_IMAGE)
        return None, MISSING_IMAGE

    def ref(self, relative: str) -> str | None:
        """The URI of a readable image, or None."""
        uri, reason = self.lookup(relative)
        return uri if reason is None else None


def listing(root: str, limit: int = 8) -> str:
    """The first entries directly under `root` ("a.json, images/, ..."), for error lines."""
    filesystem, path = filesystem_for(root)
    infos = filesystem.get_file_info(pafs.FileSelector(path, allow_not_found=True))
    names = sorted(i.path.rsplit("/", 1)[-1] + ("/" if i.type == pafs.FileType.Directory else "")
                   for i in infos)
    if not names:
        return "nothing"
    return ", ".join(names[:limit]) + (f", ... ({len(names)} entries)" if len(names) > limit else "")


def check_complete(data: SuiteData, allow_partial: bool = False) -> None:
    """Raise IncompleteBenchmark (one line: how many records lack their image, examples,
    the layout expected and what is under the root) when any image is missing or
    unreadable, unless allow_partial (then they stay counted skips). A subset none of
    whose records is well formed is the wrong file: a DataError either way."""
    scored = data.scored()
    for subset, read in data.read().items():
        if read and not scored.get(subset) and data.skip_counts.get((subset, MALFORMED_RECORD)) == read:
            raise DataError(f"{data.benchmark} {subset}: none of its {read} records is in the "
                            f"published format; expects {data.layout or 'docs/evaluation.md'}")
    image_skips = data.image_skips()
    total = sum(image_skips.values())
    if not total or allow_partial:
        return
    read = sum(data.read().values())
    per_subset = ", ".join(f"{s} {n}" for s, n in image_skips.items())
    found = [f"under {data.root}: {listing(data.root)}"] if data.root else []
    if data.skip_examples:  # the folder the first missing image was looked for in
        folder = posixpath.dirname(data.skip_examples[0])
        if folder != data.root:
            found.append(f"in {folder}: {listing(folder)}")
    raise IncompleteBenchmark(
        f"{data.benchmark}: {total} of {read} records name an image that is missing or "
        f"unreadable ({per_subset}"
        f"{'; e.g. ' + ', '.join(data.skip_examples) if data.skip_examples else ''}); expects "
        f"{data.layout or 'its published layout (docs/evaluation.md)'}; found "
        f"{'; '.join(found) or 'no root'}; fix the folder, or pass --allow-partial "
        "(suites.allow_partial=true) to score the rest")


def crop_ref(uri: str, x: float, y: float, w: float, h: float) -> str:
    """An image source naming a crop of `uri` (read and cropped when encoded)."""
    return f"{uri}#crop={int(x)},{int(y)},{int(w)},{int(h)}"


Loader = Callable[[str], SuiteData]

"""SPEC §4 half-truth benchmark: construction from a units table (seeded, deterministic),
the shareable benchmark table (Parquet / CSV) and the metrics (Acc_HT, Δ, win rate,
consistency, bootstrap CIs; image-side top-1 / MRR / margin), and its scoring from an
Encoder's features. Every half-truth condition is defined here and nowhere else. Pure: no
ray."""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from csclip.config import StrictModel
from csclip.errors import DataError
from csclip.eval.encoder import FeatureTables, ImageSource, image_sources
from csclip.units import ChangeType, Foil, Unit, UnitsRecord, normalize_text

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Condition:
    """One SPEC §4 condition: `slug` names it in metric keys, `label` in tables."""

    slug: str
    label: str
    group: str  # "entity" | "relation"


CONDITIONS: tuple[Condition, ...] = (
    Condition("obj", "+Obj", "entity"),
    Condition("attr", "+Attr", "entity"),
    Condition("rand", "+Rand", "entity"),
    Condition("rel_attr", "Rel:Attr", "relation"),
    Condition("rel_obj", "Rel:Obj", "relation"),
    Condition("ant", "Ant", "relation"),
    Condition("swap", "Swap", "relation"),
    Condition("subj", "Subj", "relation"),
)
CONDITION_BY_SLUG: dict[str, Condition] = {c.slug: c for c in CONDITIONS}
GROUPS: tuple[str, ...] = ("entity", "relation")


class SkipReason(StrEnum):
    """Why an image yields no item for a condition (counted per (condition, reason))."""

    MISSING_IMAGE = "missing_image"
    NO_ENTITY_PAIR = "no_entity_pair"
    NO_ENTITY_FOIL = "no_entity_foil"
    NO_RANDOM_ENTITY = "no_random_entity"
    NO_RELATION = "no_relation"
    NO_RELATION_WITH_TWO_FOILS = "no_relation_with_two_foils"
    RELATION_LACKS_FOIL = "relation_lacks_foil"


@dataclass(frozen=True)
class HalfTruthItem:
    """One benchmark row: anchor A, truthful completion A+ and half-truth A- for an image."""

    image_id: str
    sample_id: str
    condition: str  # a Condition slug
    group: str  # "entity" | "relation"
    anchor: str
    completion: str
    half_truth: str


@dataclass(frozen=True)
class HalfTruthBenchmark:
    """The items plus the accounting: for every condition, items + skips == num_images."""

    items: tuple[HalfTruthItem, ...]
    skipped: Mapping[tuple[str, str], int]  # (condition slug, SkipReason) -> images
    num_images: int
    num_records: int

    def num_skipped(self, condition: str) -> int:
        return sum(n for (slug, _), n in self.skipped.items() if slug == condition)


# ---------------------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------------------


def stable_rng(seed: int, *keys: str) -> random.Random:
    """A random.Random seeded from a stable hash of (seed, keys): independent of Python's
    hash randomisation, of input order and of the other images."""
    digest = hashlib.sha256(":".join([str(seed), *keys]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def build_benchmark(records: Iterable[UnitsRecord], seed: int = 0) -> list[HalfTruthItem]:
    """The SPEC §4 items for `records` (see build_half_truth_benchmark for the skips)."""
    return list(build_half_truth_benchmark(records, seed).items)


def build_half_truth_benchmark(records: Iterable[UnitsRecord], seed: int = 0) -> HalfTruthBenchmark:
    """Build the eight-condition benchmark, one caption per image, seeded and deterministic.

    Records are grouped by image_id and sorted; every random choice comes from
    stable_rng(seed, image_id, ...), so the same records in any order give the same items.
    Raises DataError when there are no records.
    """
    by_image: dict[str, list[UnitsRecord]] = defaultdict(list)
    num_records = 0
    for record in records:
        by_image[record.image_id].append(record)
        num_records += 1
    if not by_image:
        raise DataError(
            "half-truth benchmark: the units table has no records; "
            "pass the validation split of a non-empty units table"
        )
    chosen: dict[str, UnitsRecord] = {}
    for image_id in sorted(by_image):
        candidates = sorted(by_image[image_id], key=lambda r: r.sample_id)
        chosen[image_id] = stable_rng(seed, image_id, "caption").choice(candidates)
    # +Rand draws X from other images: a sorted pool of (image_id, entity text).
    pool = [
        (image_id, unit.text) for image_id, record in chosen.items() for unit in record.entities
    ]
    # Entities of every caption of an image: X must contradict all of them, not just the chosen one.
    image_entities = {
        image_id: [u.text for r in rs for u in r.entities] for image_id, rs in by_image.items()
    }
    items: list[HalfTruthItem] = []
    skipped: Counter[tuple[str, str]] = Counter()
    for image_id, record in chosen.items():
        if record.image_bytes is None and not record.image_path:
            for condition in CONDITIONS:
                skipped[(condition.slug, SkipReason.MISSING_IMAGE.value)] += 1
            continue
        outcomes = _entity_items(record, seed, pool, image_entities[image_id])
        outcomes += _relation_items(record, seed)
        for slug, outcome in outcomes:
            if isinstance(outcome, SkipReason):
                skipped[(slug, outcome.value)] += 1
            else:
                items.append(outcome)
    return HalfTruthBenchmark(tuple(items), dict(sorted(skipped.items())), len(chosen), num_records)


def _item(
    record: UnitsRecord, slug: str, anchor: str, completion: str, half_truth: str
) -> HalfTruthItem:
    condition = CONDITION_BY_SLUG[slug]
    return HalfTruthItem(
        record.image_id, record.sample_id, slug, condition.group, anchor, completion, half_truth
    )


def _and(first: str, second: str) -> str:
    return f"{first} and {second}"


def _usable_entity_foils(
    unit: Unit, change_type: ChangeType, caption_entities: Sequence[str]
) -> list[Foil]:
    # A foil naming an entity the caption contains would be true (SPEC §2), even if the
    # extractor let it through.
    named = {normalize_text(e) for e in caption_entities}
    return [f for f in unit.foils_of(change_type) if normalize_text(f.text) not in named]


def _entity_items(
    record: UnitsRecord, seed: int, pool: Sequence[tuple[str, str]], image_entities: Sequence[str]
) -> list[tuple[str, HalfTruthItem | SkipReason]]:
    """+Obj, +Attr, +Rand: ordered pair (A, B), A != B, B has the foil the condition needs."""
    entities = list(record.entities)
    texts = [e.text for e in entities]
    out: list[tuple[str, HalfTruthItem | SkipReason]] = []
    for slug, change_type in (
        ("obj", ChangeType.OBJECT_CHANGE),
        ("attr", ChangeType.ATTRIBUTE_CHANGE),
        ("rand", None),
    ):
        if len({normalize_text(t) for t in texts}) < 2:
            out.append((slug, SkipReason.NO_ENTITY_PAIR))
            continue
        rng = stable_rng(seed, record.image_id, slug)
        needed = (
            (change_type,)
            if change_type
            else (ChangeType.OBJECT_CHANGE, ChangeType.ATTRIBUTE_CHANGE)
        )
        pairs = [
            (a, b)
            for a in entities
            for b in entities
            if normalize_text(a.text) != normalize_text(b.text)
            and any(_usable_entity_foils(b, c, texts) for c in needed)
        ]
        if not pairs:
            out.append((slug, SkipReason.NO_ENTITY_FOIL))
            continue
        first, second = rng.choice(pairs)
        if change_type is not None:
            wrong = rng.choice(_usable_entity_foils(second, change_type, texts)).text
        else:
            wrong = _random_entity(rng, record.image_id, pool, image_entities)
            if wrong is None:
                out.append((slug, SkipReason.NO_RANDOM_ENTITY))
                continue
        completion = _and(first.text, second.text)
        out.append((slug, _item(record, slug, first.text, completion, _and(first.text, wrong))))
    return out


def _random_entity(
    rng: random.Random,
    image_id: str,
    pool: Sequence[tuple[str, str]],
    image_entities: Sequence[str],
    tries: int = 32,
) -> str | None:
    # Rejection sampling keeps this O(1) per image instead of filtering the whole pool.
    for _ in range(tries if pool else 0):
        source, text = rng.choice(pool)
        if source != image_id and not entity_may_hold(text, image_entities):
            return text
    return None


def entity_may_hold(text: str, entities: Sequence[str]) -> bool:
    """The +Rand entity-equality rule: could entity `text` describe one of `entities`?

    True when some entity has the same head noun and one word set contains the other
    ("circle" vs "red circle", "large red circle" vs "red circle"): such an X may be
    true of the image, so it cannot serve as a half-truth.
    """
    words = normalize_text(text).split()
    if not words:
        return True
    for entity in entities:
        other = normalize_text(entity).split()
        if (
            other
            and other[-1] == words[-1]
            and (set(words) <= set(other) or set(other) <= set(words))
        ):
            return True
    return False


def _find_entity(entities: Sequence[Unit], name: str | None) -> Unit | None:
    """The entity a relation argument names: the same text, else the entity whose head
    noun phrase it is ("horse" -> "brown horse")."""
    target = normalize_text(name or "")
    if not target:
        return None
    for unit in entities:
        if normalize_text(unit.text) == target:
            return unit
    for unit in entities:
        if normalize_text(unit.text).endswith(" " + target):
            return unit
    return None


def _relation_half_truths(record: UnitsRecord, relation: Unit) -> dict[str, list[str]]:
    """Candidate half-truths of each relation condition for one relation (SPEC §4)."""
    s, r, o = relation.subject or "", relation.predicate or "", relation.object or ""
    texts = [e.text for e in record.entities]
    subject, obj = _find_entity(record.entities, s), _find_entity(record.entities, o)
    candidates: dict[str, list[str]] = {
        "rel_attr": [
            f"{s} {r} {f.text}"
            for f in (_usable_entity_foils(obj, ChangeType.ATTRIBUTE_CHANGE, texts) if obj else [])
        ],
        "rel_obj": [
            f"{s} {r} {f.text}"
            for f in (_usable_entity_foils(obj, ChangeType.OBJECT_CHANGE, texts) if obj else [])
        ],
        # The antonym keeps s and o; take them from the relation, not the foil, so A- differs
        # from A+ by the predicate only.
        "ant": [
            f"{s} {f.predicate} {o}" if f.predicate else f.text
            for f in relation.foils_of(ChangeType.ANTONYM)
        ],
        # Swap `o r s` only where the extractor kept a swap foil: a symmetric predicate
        # ("is next to") makes the swapped text true, and such swaps are rejected upstream.
        "swap": [f"{o} {r} {s}" for _ in relation.foils_of(ChangeType.SUBJECT_OBJECT_SWAP)][:1],
        "subj": [
            f"{f.text} {r} {o}"
            for f in (
                _usable_entity_foils(subject, ChangeType.OBJECT_CHANGE, texts) if subject else []
            )
        ],
    }
    unit_text = normalize_text(relation.text)
    return {
        slug: sorted({c for c in texts_ if normalize_text(c) != unit_text})
        for slug, texts_ in candidates.items()
    }


RELATION_SLUGS: tuple[str, ...] = tuple(c.slug for c in CONDITIONS if c.group == "relation")


def _relation_items(record: UnitsRecord, seed: int) -> list[tuple[str, HalfTruthItem | SkipReason]]:
    """Rel:Attr, Rel:Obj, Ant, Swap, Subj from one relation with at least two usable foils."""
    if not record.relations:
        return [(slug, SkipReason.NO_RELATION) for slug in RELATION_SLUGS]
    usable = []
    for relation in record.relations:
        candidates = _relation_half_truths(record, relation)
        if sum(bool(v) for v in candidates.values()) >= 2:
            usable.append((relation, candidates))
    if not usable:
        return [(slug, SkipReason.NO_RELATION_WITH_TWO_FOILS) for slug in RELATION_SLUGS]
    relation, candidates = stable_rng(seed, record.image_id, "relation").choice(usable)
    anchor = relation.subject or ""
    out: list[tuple[str, HalfTruthItem | SkipReason]] = []
    for slug in RELATION_SLUGS:
        if not candidates[slug]:
            out.append((slug, SkipReason.RELATION_LACKS_FOIL))
            continue
        half_truth = stable_rng(seed, record.image_id, slug).choice(candidates[slug])
        out.append((slug, _item(record, slug, anchor, relation.text, half_truth)))
    return out


# ---------------------------------------------------------------------------------------
# The benchmark table (shareable, rescorable)
# ---------------------------------------------------------------------------------------

BENCHMARK_SCHEMA = pa.schema(
    [
        pa.field(name, pa.string(), nullable=False)
        for name in (
            "image_id",
            "sample_id",
            "condition",
            "group",
            "anchor",
            "completion",
            "half_truth",
        )
    ]
)


def items_to_table(items: Sequence[HalfTruthItem]) -> pa.Table:
    rows = [{name: getattr(item, name) for name in BENCHMARK_SCHEMA.names} for item in items]
    return pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA)


def table_to_items(table: pa.Table, origin: str = "benchmark table") -> list[HalfTruthItem]:
    """Items from a benchmark table, checking columns and condition names."""
    missing = [n for n in BENCHMARK_SCHEMA.names if n not in table.column_names]
    if missing:
        raise DataError(f"{origin}: missing columns {missing}; expected {BENCHMARK_SCHEMA.names}")
    items = [
        HalfTruthItem(**{n: str(row[n]) for n in BENCHMARK_SCHEMA.names})
        for row in table.select(BENCHMARK_SCHEMA.names).to_pylist()
    ]
    for item in items:
        condition = CONDITION_BY_SLUG.get(item.condition)
        if condition is None or condition.group != item.group:
            raise DataError(
                f"{origin}: row for image {item.image_id!r} has condition "
                f"{item.condition!r} / group {item.group!r}; conditions are "
                f"{[(c.slug, c.group) for c in CONDITIONS]}"
            )
    return items


def save_benchmark(items: Sequence[HalfTruthItem], path: str | Path) -> Path:
    """Write items as Parquet (`.parquet`) or CSV (`.csv`)."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = items_to_table(items)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix == ".csv":
        pacsv.write_csv(table, path)
    else:
        raise DataError(f"benchmark path {path}: use a .parquet or .csv file name")
    return path


def load_benchmark(path: str | Path) -> list[HalfTruthItem]:
    """Read items written by save_benchmark."""
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise DataError(f"benchmark table not found: {path}")
    if path.suffix == ".parquet":
        table = pq.read_table(path)
    elif path.suffix == ".csv":
        # Every column is text: stop pyarrow from guessing numbers in ids.
        options = pacsv.ConvertOptions(
            column_types={n: pa.string() for n in BENCHMARK_SCHEMA.names}
        )
        table = pacsv.read_csv(path, convert_options=options)
    else:
        raise DataError(f"benchmark path {path}: use a .parquet or .csv file name")
    return table_to_items(table, origin=str(path))


# ---------------------------------------------------------------------------------------
# Metrics (strict comparisons: a tie is a failure)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemScores:
    """Cosine similarities of each item's image with its three texts, shape (num_items,)."""

    anchor: np.ndarray
    completion: np.ndarray
    half_truth: np.ndarray

    def __post_init__(self) -> None:
        arrays = [
            np.asarray(a, dtype=np.float64) for a in (self.anchor, self.completion, self.half_truth)
        ]
        if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
            raise ValueError(f"ItemScores: shapes differ {[a.shape for a in arrays]}")
        for name, array in zip(("anchor", "completion", "half_truth"), arrays, strict=True):
            object.__setattr__(self, name, array)


def bootstrap_ci(
    values: np.ndarray, num_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (resampling items with replacement)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or num_resamples <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples)
    # Chunks keep the (resamples, n) index matrix near 4M entries for large benchmarks.
    chunk = max(1, 4_000_000 // values.size)
    for start in range(0, num_resamples, chunk):
        stop = min(num_resamples, start + chunk)
        means[start:stop] = values[rng.integers(0, values.size, (stop - start, values.size))].mean(
            1
        )
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def half_truth_metrics(
    items: Sequence[HalfTruthItem], scores: ItemScores, num_bootstrap: int = 1000, seed: int = 0
) -> dict[str, float]:
    """SPEC §4 metrics, micro-averaged over items; accuracies in percent.

    Keys, for scope in all / entity / relation / each condition slug:
      ht_<scope>            Acc_HT = 100 * mean[s(A) > s(A-)]
      ht_gap_<scope>        Δ = mean[s(A) - s(A-)]   (`ht_gap` for all)
      winrate_<scope>       100 * mean[s(A+) > s(A-)]   (Table 7)
      consistency_<scope>   100 * mean[s(A+) > s(A)]
      <metric>_ci_low / _ci_high   bootstrap 95% CI of ht, ht_gap and winrate
      num_items_<scope>
    A scope without items has only num_items_<scope> = 0.
    """
    if len(items) != scores.anchor.shape[0]:
        raise ValueError(f"{len(items)} items but {scores.anchor.shape[0]} scores")
    conditions = np.array([item.condition for item in items])
    groups = np.array([item.group for item in items])
    correct = (scores.anchor > scores.half_truth).astype(np.float64) * 100
    gap = scores.anchor - scores.half_truth
    wins = (scores.completion > scores.half_truth).astype(np.float64) * 100
    consistent = (scores.completion > scores.anchor).astype(np.float64) * 100
    scopes = [("all", np.ones(len(items), dtype=bool))]
    scopes += [(g, groups == g) for g in GROUPS] + [
        (c.slug, conditions == c.slug) for c in CONDITIONS
    ]
    metrics: dict[str, float] = {}
    for offset, (scope, mask) in enumerate(scopes):
        metrics[f"num_items_{scope}"] = float(mask.sum())
        if not mask.any():
            continue
        gap_key = "ht_gap" if scope == "all" else f"ht_gap_{scope}"
        for index, (key, values) in enumerate(
            ((f"ht_{scope}", correct[mask]), (gap_key, gap[mask]), (f"winrate_{scope}", wins[mask]))
        ):
            metrics[key] = float(values.mean())
            low, high = bootstrap_ci(values, num_bootstrap, seed=seed + 10 * offset + index)
            metrics[f"{key}_ci_low"], metrics[f"{key}_ci_high"] = low, high
        metrics[f"consistency_{scope}"] = float(consistent[mask].mean())
    return metrics


# ---------------------------------------------------------------------------------------
# Image-side half-truth (SPEC §4): a text must rank its image above distractors
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ImageSideItem:
    """Text "{shared} and {distinct}" with its target image and 2-5 distractor images that
    show the shared entity but not the distinct one."""

    image_id: str
    text: str
    shared: str
    distinct: str
    distractors: tuple[str, ...] = field(default_factory=tuple)


def build_image_side_benchmark(
    records: Iterable[UnitsRecord],
    seed: int = 0,
    min_distractors: int = 2,
    max_distractors: int = 5,
) -> list[ImageSideItem]:
    """One item per image where some entity pair has at least `min_distractors` images
    sharing the first entity and lacking the second; seeded and deterministic."""
    entities: dict[str, set[str]] = defaultdict(set)
    has_image: dict[str, bool] = {}
    for record in records:
        entities[record.image_id].update(normalize_text(u.text) for u in record.entities)
        has_image[record.image_id] = has_image.get(record.image_id, False) or bool(
            record.image_bytes is not None or record.image_path
        )
    if not entities:
        raise DataError("image-side benchmark: no records; pass a non-empty units table")
    images_with: dict[str, set[str]] = defaultdict(set)
    for image_id, texts in entities.items():
        if has_image[image_id]:
            for text in texts:
                images_with[text].add(image_id)
    with_head: dict[str, set[str]] = defaultdict(set)
    for image_id, texts in entities.items():
        for text in texts:
            with_head[text.split()[-1] if text else ""].add(image_id)
    blocked: dict[str, set[str]] = {}
    pools: dict[tuple[str, str], set[str]] = {}

    def pool(shared: str, distinct: str) -> set[str]:
        if (shared, distinct) not in pools:
            pools[(shared, distinct)] = _pool(shared, distinct)
        return pools[(shared, distinct)]

    def _pool(shared: str, distinct: str) -> set[str]:
        # Images showing `shared` where `distinct` may not hold. Which images block a
        # distinct entity does not depend on the target image: computed once per text,
        # only over images with the same head noun (linear, not quadratic, in images).
        if distinct not in blocked:
            head = distinct.split()[-1] if distinct else ""
            blocked[distinct] = {
                other
                for other in with_head[head]
                if entity_may_hold(distinct, sorted(entities[other]))
            }
        return images_with[shared] - blocked[distinct]

    items = []
    for image_id in sorted(entities):
        if not has_image[image_id]:
            continue
        options = [
            (shared, distinct)
            for shared in sorted(entities[image_id])
            for distinct in sorted(entities[image_id] - {shared})
            # The image itself shows `distinct`, so it is never in its own pool.
            if len(pool(shared, distinct)) >= min_distractors
        ]
        if options:
            rng = stable_rng(seed, image_id, "image_side")
            shared, distinct = rng.choice(options)
            candidates = sorted(pool(shared, distinct))
            chosen = rng.sample(candidates, min(max_distractors, len(candidates)))
            items.append(
                ImageSideItem(
                    image_id, _and(shared, distinct), shared, distinct, tuple(sorted(chosen))
                )
            )
    return items


def image_side_metrics(target: np.ndarray, distractors: Sequence[np.ndarray]) -> dict[str, float]:
    """Top-1 accuracy (percent), MRR and mean margin s(target) - max s(distractor).

    target: (num_items,) scores of each text with its own image; distractors[i]: scores of
    item i's text with its distractor images. Ties rank the target below (strict).
    """
    if len(distractors) != len(target):
        raise ValueError(f"{len(target)} targets but {len(distractors)} distractor lists")
    if len(target) == 0:
        return {"image_side_num_items": 0.0}
    ranks = np.array(
        [1 + int((np.asarray(d) >= t).sum()) for t, d in zip(target, distractors, strict=True)]
    )
    margins = np.array([t - float(np.max(d)) for t, d in zip(target, distractors, strict=True)])
    return {
        "image_side_top1": float((ranks == 1).mean() * 100),
        "image_side_mrr": float((1.0 / ranks).mean()),
        "image_side_margin": float(margins.mean()),
        "image_side_num_items": float(len(target)),
    }


# ---------------------------------------------------------------------------------------
# The prepared benchmark and its scores
# ---------------------------------------------------------------------------------------

class BenchmarkConfig(StrictModel):
    """How the half-truth benchmark is built and bootstrapped. The seed lives here only."""

    seed: int = 0  # every choice of the builder is seeded from (seed, image_id)
    num_bootstrap: int = Field(1000, ge=0)  # SPEC §4: 1000 resamples
    image_side: bool = True
    min_distractors: int = Field(2, ge=1)
    max_distractors: int = Field(5, ge=1)
    # A saved benchmark table (.parquet / .csv from a previous run) to rescore instead of
    # building one; its images still come from the units table.
    table_uri: str | None = None

    @model_validator(mode="after")
    def _distractor_range(self) -> BenchmarkConfig:
        if self.max_distractors < self.min_distractors:
            raise ValueError(
                f"max_distractors ({self.max_distractors}) must be >= "
                f"min_distractors ({self.min_distractors})"
            )
        return self


@dataclass(frozen=True)
class PreparedBenchmark:
    """A benchmark with the image bytes it needs: built once, scored by many models."""

    benchmark: HalfTruthBenchmark
    image_side: tuple[ImageSideItem, ...]
    images: dict[str, ImageSource]  # bytes, or a URI read when encoded

    @property
    def texts(self) -> list[str]:
        return benchmark_texts(self.benchmark.items, self.image_side)


def prepare_benchmark(
    records: Sequence[UnitsRecord], config: BenchmarkConfig | None = None
) -> PreparedBenchmark:
    """Build the half-truth (and image-side) benchmark, or load config.table_uri, and
    collect its image sources.

    Raises DataError for no records, no usable items, or an image missing from `records`.
    """
    config = config or BenchmarkConfig()
    seed = config.seed
    if config.table_uri:
        items = tuple(load_benchmark(config.table_uri))
        num_images = len({item.image_id for item in items})
        benchmark = HalfTruthBenchmark(items, {}, num_images, len(records))
    else:
        benchmark = build_half_truth_benchmark(records, seed)
    if not benchmark.items:
        reasons = ", ".join(f"{c}/{r}: {n}" for (c, r), n in benchmark.skipped.items())
        raise DataError(
            f"half-truth benchmark: {benchmark.num_images} images gave no items "
            f"(skips: {reasons}); units need foils and images"
        )
    side: list[ImageSideItem] = []
    if config.image_side:
        side = build_image_side_benchmark(
            records, seed, config.min_distractors, config.max_distractors
        )
    image_ids = [i.image_id for i in benchmark.items]
    image_ids += [image_id for item in side for image_id in (item.image_id, *item.distractors)]
    images = image_sources(records, image_ids)
    log.info(
        "half-truth benchmark: %d images, %d items, %d image-side items, skips %s",
        benchmark.num_images,
        len(benchmark.items),
        len(side),
        dict(benchmark.skipped),
    )
    return PreparedBenchmark(benchmark, tuple(side), images)


def benchmark_texts(
    items: Sequence[HalfTruthItem], image_side: Sequence[ImageSideItem] = ()
) -> list[str]:
    texts = [t for item in items for t in (item.anchor, item.completion, item.half_truth)]
    return texts + [item.text for item in image_side]


def score_items(features: FeatureTables, items: Sequence[HalfTruthItem]) -> ItemScores:
    """s(I, A), s(I, A+), s(I, A-) of every item from precomputed features."""
    image_ids = [item.image_id for item in items]
    return ItemScores(
        features.similarity(image_ids, [i.anchor for i in items]),
        features.similarity(image_ids, [i.completion for i in items]),
        features.similarity(image_ids, [i.half_truth for i in items]),
    )


def score_image_side(
    features: FeatureTables, items: Sequence[ImageSideItem]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Scores of each image-side text with its target image and with its distractors."""
    target = features.similarity([i.image_id for i in items], [i.text for i in items])
    distractors = [
        features.similarity(list(i.distractors), [i.text] * len(i.distractors)) for i in items
    ]
    return target, distractors

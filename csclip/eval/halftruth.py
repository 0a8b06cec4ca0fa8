"""SPEC §4 half-truth benchmark: its construction under two protocols (`paper`: the
authors' builder item for item; `csclip`: ours, seeded per image), the shareable benchmark
table (Parquet / CSV) and the metrics (Acc_HT, Δ, win rate, consistency, bootstrap CIs;
image-side top-1 / MRR / margin), and its scoring from an Encoder's features. Every
half-truth condition is defined here and nowhere else. Pure: no ray."""

from __future__ import annotations

import hashlib
import logging
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from csclip.authors import VerbatimRecord, VerbatimRelation, VerbatimTriple
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
# Neg (the predicate negated) is built by the authors' builder but left out of the paper's
# tables: reported apart, never in the entity / relation / overall averages.
EXTRA_CONDITIONS: tuple[Condition, ...] = (Condition("neg", "Neg", "negation"),)
ALL_CONDITIONS: tuple[Condition, ...] = CONDITIONS + EXTRA_CONDITIONS
CONDITION_BY_SLUG: dict[str, Condition] = {c.slug: c for c in ALL_CONDITIONS}
GROUPS: tuple[str, ...] = ("entity", "relation")


class Protocol(StrEnum):
    """How the items are chosen from the units (docs/evaluation.md, "Protocols")."""

    PAPER = "paper"  # the authors' builder, item for item (kargibora/CS-CLIP@2325a1c)
    CSCLIP = "csclip"  # ours: every caption's pairs and foils, seeded per image


class SkipReason(StrEnum):
    """Why an image yields no item for a condition (counted per (condition, reason))."""

    MISSING_IMAGE = "missing_image"
    NO_ENTITY_PAIR = "no_entity_pair"
    NO_ENTITY_FOIL = "no_entity_foil"
    NO_RANDOM_ENTITY = "no_random_entity"
    NO_RELATION = "no_relation"
    NO_RELATION_WITH_TWO_FOILS = "no_relation_with_two_foils"
    RELATION_LACKS_FOIL = "relation_lacks_foil"
    # paper protocol only
    OVER_NUM_SAMPLES = "over_num_samples"  # the pass had num_samples images before this one
    ANCHOR_NOT_VALID = (
        "anchor_not_valid"  # their scorer drops a sample whose anchor fails is_valid_caption
    )


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
    unit: str = ""  # provenance: the unit the foil edits (B, or the relation "s r o")
    foil: str = ""  # provenance: the foil put in its place (B', X, o', s' or "s r' o")


@dataclass(frozen=True)
class HalfTruthBenchmark:
    """The items plus the accounting: for every condition the protocol builds,
    items + skips == num_images."""

    items: tuple[HalfTruthItem, ...]
    skipped: Mapping[tuple[str, str], int]  # (condition slug, SkipReason) -> images
    num_images: int
    num_records: int
    protocol: str = Protocol.CSCLIP.value

    def num_skipped(self, condition: str) -> int:
        return sum(n for (slug, _), n in self.skipped.items() if slug == condition)

    @property
    def content_hash(self) -> str:
        return benchmark_hash(self.items, self.protocol)


def benchmark_hash(items: Sequence[HalfTruthItem], protocol: str) -> str:
    """ "sha256:<hex>" of the protocol and every item's fields in order: two benchmarks
    with the same hash score any model identically."""
    import json

    payload = json.dumps(
        {"protocol": protocol, "items": [list(astuple(i)) for i in items]},
        ensure_ascii=False,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


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
    return HalfTruthBenchmark(
        tuple(items), dict(sorted(skipped.items())), len(chosen), num_records, Protocol.CSCLIP.value
    )


def _item(
    record: UnitsRecord | VerbatimRecord,
    slug: str,
    anchor: str,
    completion: str,
    half_truth: str,
    unit: str,
    foil: str,
) -> HalfTruthItem:
    condition = CONDITION_BY_SLUG[slug]
    return HalfTruthItem(
        record.image_id,
        record.sample_id,
        slug,
        condition.group,
        anchor,
        completion,
        half_truth,
        unit,
        foil,
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
        half_truth = _and(first.text, wrong)
        out.append(
            (slug, _item(record, slug, first.text, completion, half_truth, second.text, wrong))
        )
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
        out.append(
            (
                slug,
                _item(record, slug, anchor, relation.text, half_truth, relation.text, half_truth),
            )
        )
    return out


# ---------------------------------------------------------------------------------------
# Construction, protocol `paper`: the authors' builder, item for item
# ---------------------------------------------------------------------------------------
# Our reading of HalfTruthSampleGenerator in kargibora/CS-CLIP@2325a1c,
# experiments/half_truth_vulnerability.py (run by run_half_truth.sh with --num_samples 1000
# --seed 42), and of the filters its HalfTruthEvaluator applies before scoring. Written
# from that file, checked item for item against its output (tests/test_halftruth_paper.py).
# Where it looks wrong we keep it, because the paper's numbers come from it; what csclip
# does instead is the `csclip` protocol above (docs/evaluation.md, "Protocols").

PAPER_NUM_SAMPLES = 1000  # run_half_truth.sh --num_samples: images per pass (entity, relation)
PAPER_SEED = 42  # run_half_truth.sh --seed: random.seed before the +Rand draws
_CONNECTOR_WORDS = frozenset({"and", "the", "a", "an", "on", "in", "at", "to", "of"})


def is_valid_caption(text: str) -> bool:
    """Their filter on every text and foil part: some word longer than two letters that is
    not a connector. So "is on", "is in", "a" and "" are not valid (an antonym predicate
    "is on" is dropped; so is an anchor "it")."""
    return any(len(w) > 2 and w.lower() not in _CONNECTOR_WORDS for w in text.split())


@dataclass(frozen=True)
class _EntitySample:
    record: VerbatimRecord
    anchor: str  # A, lower-cased and stripped
    second: str  # B, lower-cased and stripped
    object_foil: str  # B' (object_change), lower-cased; "" when B has none
    attribute_foil: str  # B' (attribute_change), lower-cased; "" when B has none


@dataclass(frozen=True)
class _RelationSample:
    record: VerbatimRecord
    subject: str
    full_truth: str  # "s r o"
    half_truths: dict[str, str]  # condition slug -> text; "" when not built


def verbatim_from_units(record: UnitsRecord) -> VerbatimRecord:
    """A units-table record as the authors' builder would read it: entity texts and their
    foils as components and negatives, relation foils as stored triples."""
    negatives = {
        e.text: tuple((f.text, f.change_type.value) for f in e.foils)
        for e in record.entities
        if e.foils
    }
    relations = tuple(
        VerbatimRelation(
            r.subject or "",
            r.predicate or "",
            r.object or "",
            tuple(
                VerbatimTriple(f.subject or "", f.predicate or "", f.object or "", f.change_type)
                for f in r.foils
            ),
        )
        for r in record.relations
    )
    return VerbatimRecord(
        sample_id=record.sample_id,
        image_id=record.image_id,
        image_key=record.sample_id,
        image_path=record.image_path,
        caption=record.caption,
        components=tuple(e.text for e in record.entities),
        component_negatives=negatives,
        relations=relations,
        negative_relations=(),
        dedup_key=record.image_id,
        image_bytes=record.image_bytes,
    )


def _has_image(record: VerbatimRecord) -> bool:
    # Their builder also skips a record whose image file does not exist; we keep it, and
    # the evaluation refuses a missing image by name (never a silent drop).
    return bool(record.image_path) or record.image_bytes is not None


def _first_entity_pair(record: VerbatimRecord) -> _EntitySample | None:
    """The first ordered pair (A, B), i != j in component order, where B has a valid
    object_change or attribute_change negative; the first valid one of each type."""
    negatives = record.component_negatives
    for i, first in enumerate(record.components):
        for j, second in enumerate(record.components):
            if i == j or not negatives.get(second):
                continue
            object_foil = attribute_foil = ""
            for text, change_type in negatives[second]:
                # Exact names: their builder does not lower-case entity change types.
                if change_type == "object_change" and not object_foil and is_valid_caption(text):
                    object_foil = text
                elif (
                    change_type == "attribute_change"
                    and not attribute_foil
                    and is_valid_caption(text)
                ):
                    attribute_foil = text
            if not object_foil and not attribute_foil:
                continue
            anchor, truth = first.lower().strip(), second.lower().strip()
            if not is_valid_caption(anchor) or not is_valid_caption(truth):
                continue
            return _EntitySample(record, anchor, truth, object_foil.lower(), attribute_foil.lower())
    return None


def _predicate_foils(
    relation: VerbatimRelation, record: VerbatimRecord, s: str, o: str
) -> tuple[str, str]:
    """(antonym, negation) texts: the first valid stored triple of each, from the relation's
    `negatives` (any arguments), then its `negative_relations` or else the record's
    top-level ones (same subject and object only; relation_opposite is a negation when its
    predicate contains "not")."""
    antonym = negation = ""

    def parts(triple: VerbatimTriple) -> tuple[str, str, str] | None:
        found = tuple(
            p.lower().strip() for p in (triple.subject, triple.relation_type, triple.object)
        )
        return found if all(is_valid_caption(p) for p in found) else None

    for triple in relation.negatives:
        change, found = triple.change_type.lower(), parts(triple)
        if found is None:
            continue
        if change == "antonym" and not antonym:
            antonym = " ".join(found)
        elif change == "negation" and not negation:
            negation = " ".join(found)
    for triple in relation.negative_relations or record.negative_relations:
        change, found = triple.change_type.lower(), parts(triple)
        if found is None or (found[0], found[2]) != (s, o):
            continue
        text = " ".join(found)
        if change == "relation_opposite":
            if "not" in found[1]:
                negation = negation or text
            else:
                antonym = antonym or text
        elif change == "antonym" and not antonym:
            antonym = text
        elif change == "negation" and not negation:
            negation = text
        # A stored subject_object_swap is never used: their swap text is always built.
    return antonym, negation


def _argument_negatives(record: VerbatimRecord, argument: str) -> tuple[tuple[str, str], ...]:
    """Negatives of a relation argument: its own key, else those of the first component
    that contains it as a substring ("horse" -> "brown horse", also "man" -> "woman")."""
    found = record.component_negatives.get(argument, ())
    if not found:
        for component in record.components:
            if argument in component.lower():
                return record.component_negatives.get(component, ())
    return found


def _first_of(negatives: Sequence[tuple[str, str]], change_type: str) -> str:
    return next((t.lower() for t, c in negatives if c == change_type and is_valid_caption(t)), "")


def _first_relation(record: VerbatimRecord) -> _RelationSample | None:
    """The first relation in list order with at least two valid foils among Swap, Ant,
    Neg, Rel:Obj and Subj (Swap, "o r s", is valid for nearly every relation, so in effect
    one more); Rel:Attr is built but not counted."""
    for relation in record.relations:
        s, r, o = (
            p.lower().strip() for p in (relation.subject, relation.relation_type, relation.object)
        )
        if not (s and r and o):
            continue
        antonym, negation = _predicate_foils(relation, record, s, o)
        object_negatives = _argument_negatives(record, o)
        subject_foil = _first_of(_argument_negatives(record, s), "object_change")
        half_truths = {
            "swap": f"{o} {r} {s}",
            "ant": antonym,
            "neg": negation,
            "rel_obj": f"{s} {r} {foil}"
            if (foil := _first_of(object_negatives, "object_change"))
            else "",
            "subj": f"{subject_foil} {r} {o}" if subject_foil else "",
            "rel_attr": f"{s} {r} {foil}"
            if (foil := _first_of(object_negatives, "attribute_change"))
            else "",
        }
        counted = ("swap", "ant", "neg", "rel_obj", "subj")
        if sum(is_valid_caption(half_truths[slug]) for slug in counted) >= 2:
            return _RelationSample(record, s, f"{s} {r} {o}", half_truths)
    return None


_ENTITY_SLUGS = ("obj", "attr", "rand")
# Their scorer's order of the relation conditions (HalfTruthEvaluator.evaluate_relation_sample).
_PAPER_RELATION_SLUGS = ("swap", "ant", "neg", "rel_obj", "subj", "rel_attr")


@dataclass
class _Pass:
    """One pass over the records (entity or relation side): the samples in order, and why
    each image without one has none."""

    samples: list = field(default_factory=list)
    reasons: dict[str, SkipReason] = field(default_factory=dict)  # dedup key -> best reason
    stopped_at: int | None = None  # index of the record after which num_samples was reached

    def note(self, key: str, reason: SkipReason) -> None:
        # An image's reason is the furthest any of its captions got.
        order = _REASON_ORDER
        if key not in self.reasons or order.index(reason) > order.index(self.reasons[key]):
            self.reasons[key] = reason


_REASON_ORDER = (
    SkipReason.NO_ENTITY_PAIR,
    SkipReason.NO_RELATION,
    SkipReason.MISSING_IMAGE,
    SkipReason.NO_ENTITY_FOIL,
    SkipReason.NO_RELATION_WITH_TWO_FOILS,
)


def _paper_pass(records: Sequence[VerbatimRecord], side: str, num_samples: int | None) -> _Pass:
    """Their generate_component_samples / generate_relation_samples: records in file order,
    one sample per dedup key (the first caption that qualifies, so each side may pick a
    different caption), stopping once num_samples samples exist (None: never)."""
    state = _Pass()
    used: set[str] = set()
    for index, record in enumerate(records):
        key = record.dedup_key
        if side == "entity":
            if len(record.components) < 2 or not record.component_negatives:
                state.note(key, SkipReason.NO_ENTITY_PAIR)
                continue
        elif not record.relations or not record.components:
            state.note(key, SkipReason.NO_RELATION)
            continue
        if not _has_image(record):
            state.note(key, SkipReason.MISSING_IMAGE)
            continue
        if key in used:
            continue
        sample = _first_entity_pair(record) if side == "entity" else _first_relation(record)
        if sample is None:
            state.note(
                key,
                SkipReason.NO_ENTITY_FOIL
                if side == "entity"
                else SkipReason.NO_RELATION_WITH_TWO_FOILS,
            )
        else:
            state.samples.append(sample)
            used.add(key)
        # Their check sits after every record that got this far, sample or not.
        if num_samples is not None and len(state.samples) >= num_samples:
            state.stopped_at = index
            break
    return state


def _random_foils(samples: Sequence[_EntitySample], seed: int) -> list[tuple[str, str] | None]:
    """Their add_random_component_foils: random.seed(seed), then for each sample in order
    random.choice over the pool of every sample's B whose sample_id differs. The pool is the
    capped entity samples, so X can still be true of the image (another image's "man")."""
    pool = [(s.second, s.record.image_key) for s in samples if is_valid_caption(s.second)]
    if len(pool) < 2:
        return [None] * len(samples)
    positions: dict[str, list[int]] = defaultdict(list)
    for position, (_, key) in enumerate(pool):
        positions[key].append(position)
    rng = random.Random(seed)
    drawn: list[tuple[str, str] | None] = []
    for sample in samples:
        own = positions.get(sample.record.image_key, [])
        size = len(pool) - len(own)
        if size == 0:
            drawn.append(None)
            continue
        # rng.choice(others) without building `others` for every sample: the same draw
        # (one _randbelow(len(others))), mapped back past this sample's own entries.
        index = rng.choice(range(size))
        for position in own:
            if position <= index:
                index += 1
        drawn.append(pool[index])
    return drawn


def build_paper_benchmark(
    records: Iterable[VerbatimRecord],
    num_samples: int | None = PAPER_NUM_SAMPLES,
    seed: int = PAPER_SEED,
) -> HalfTruthBenchmark:
    """The authors' items for `records` (in file order): +Obj, +Attr, +Rand from one entity
    pair per image, Rel:Attr, Rel:Obj, Ant, Swap, Subj and Neg from one relation per image.

    num_samples: images per pass, as their --num_samples (None: all; their -1 gives one
    image, a bug we do not copy); seed: their --seed, for +Rand. Items appear in their
    order: entity samples (obj, attr, rand each), then relation samples. Raises DataError
    when there are no records.
    """
    records = list(records)
    if not records:
        raise DataError(
            "half-truth benchmark: no records; pass the validation split of a non-empty "
            "units table or unit file"
        )
    entity = _paper_pass(records, "entity", num_samples)
    relation = _paper_pass(records, "relation", num_samples)
    keys = list(dict.fromkeys(r.dedup_key for r in records))
    items: list[HalfTruthItem] = []
    made: dict[str, set[str]] = defaultdict(set)  # slug -> dedup keys with an item
    for sample, rand in zip(entity.samples, _random_foils(entity.samples, seed), strict=True):
        completion = _and(sample.anchor, sample.second)
        for slug, foil in (
            ("obj", sample.object_foil),
            ("attr", sample.attribute_foil),
            ("rand", rand[0] if rand else ""),
        ):
            if foil:
                items.append(
                    _item(
                        sample.record,
                        slug,
                        sample.anchor,
                        completion,
                        _and(sample.anchor, foil),
                        sample.second,
                        foil,
                    )
                )
                made[slug].add(sample.record.dedup_key)
    invalid_anchor: set[str] = set()
    for sample in relation.samples:
        # Their scorer skips a sample whose anchor or full truth fails is_valid_caption.
        if not (is_valid_caption(sample.subject) and is_valid_caption(sample.full_truth)):
            invalid_anchor.add(sample.record.dedup_key)
            continue
        for slug in _PAPER_RELATION_SLUGS:
            text = sample.half_truths[slug]
            if is_valid_caption(text):
                items.append(
                    _item(
                        sample.record,
                        slug,
                        sample.subject,
                        sample.full_truth,
                        text,
                        sample.full_truth,
                        text,
                    )
                )
                made[slug].add(sample.record.dedup_key)
    skipped = _paper_skips(records, keys, made, entity, relation, invalid_anchor)
    return HalfTruthBenchmark(tuple(items), skipped, len(keys), len(records), Protocol.PAPER.value)


def _paper_skips(
    records: Sequence[VerbatimRecord],
    keys: Sequence[str],
    made: Mapping[str, set[str]],
    entity: _Pass,
    relation: _Pass,
    invalid_anchor: set[str],
) -> dict[tuple[str, str], int]:
    """(condition, reason) -> images, so that items + skips == images for each condition."""
    last_index = {r.dedup_key: i for i, r in enumerate(records)}
    sampled = {
        "entity": {s.record.dedup_key for s in entity.samples},
        "relation": {s.record.dedup_key for s in relation.samples},
    }
    skipped: Counter[tuple[str, str]] = Counter()
    for slug in _ENTITY_SLUGS + _PAPER_RELATION_SLUGS:
        side, state = ("entity", entity) if slug in _ENTITY_SLUGS else ("relation", relation)
        for key in keys:
            if key in made[slug]:
                continue
            if key in sampled[side]:
                reason = (
                    SkipReason.ANCHOR_NOT_VALID
                    if side == "relation" and key in invalid_anchor
                    else SkipReason.NO_RANDOM_ENTITY
                    if slug == "rand"
                    else SkipReason.NO_ENTITY_FOIL
                    if side == "entity"
                    else SkipReason.RELATION_LACKS_FOIL
                )
            elif state.stopped_at is not None and last_index[key] > state.stopped_at:
                reason = SkipReason.OVER_NUM_SAMPLES
            else:
                reason = state.reasons[key]
            skipped[(slug, reason.value)] += 1
    return dict(sorted(skipped.items()))


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
            "unit",
            "foil",
        )
    ]
)
# Tables written before the provenance columns existed lack these two: read as "".
_OPTIONAL_COLUMNS = ("unit", "foil")


def items_to_table(items: Sequence[HalfTruthItem]) -> pa.Table:
    rows = [{name: getattr(item, name) for name in BENCHMARK_SCHEMA.names} for item in items]
    return pa.Table.from_pylist(rows, schema=BENCHMARK_SCHEMA)


def table_to_items(table: pa.Table, origin: str = "benchmark table") -> list[HalfTruthItem]:
    """Items from a benchmark table, checking columns and condition names."""
    missing = [
        n
        for n in BENCHMARK_SCHEMA.names
        if n not in table.column_names and n not in _OPTIONAL_COLUMNS
    ]
    if missing:
        raise DataError(f"{origin}: missing columns {missing}; expected {BENCHMARK_SCHEMA.names}")
    names = [n for n in BENCHMARK_SCHEMA.names if n in table.column_names]
    items = [
        HalfTruthItem(**{n: "" if row[n] is None else str(row[n]) for n in names})
        for row in table.select(names).to_pylist()
    ]
    for item in items:
        condition = CONDITION_BY_SLUG.get(item.condition)
        if condition is None or condition.group != item.group:
            raise DataError(
                f"{origin}: row for image {item.image_id!r} has condition "
                f"{item.condition!r} / group {item.group!r}; conditions are "
                f"{[(c.slug, c.group) for c in ALL_CONDITIONS]}"
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
            column_types={n: pa.string() for n in BENCHMARK_SCHEMA.names},
            strings_can_be_null=False,
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

    Keys, for scope in all (the paper's eight conditions) / entity / relation / each
    condition slug (neg included, outside every average):
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
    # "all" is the paper's eight conditions: Neg (group "negation") only on its own.
    scopes = [("all", np.isin(groups, GROUPS))]
    scopes += [(g, groups == g) for g in GROUPS] + [
        (c.slug, conditions == c.slug) for c in ALL_CONDITIONS
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
    """How the half-truth benchmark is built and bootstrapped. The seeds live here only."""

    # paper: the authors' builder item for item; csclip: ours; auto: paper for real data,
    # csclip for the synthetic world (records with source "gold"). docs/evaluation.md.
    protocol: Literal["auto", "paper", "csclip"] = "auto"
    seed: int = 0  # csclip: every choice is seeded from (seed, image_id); also the bootstrap's
    # paper: images per pass (their --num_samples 1000); null: every image
    num_samples: int | None = Field(PAPER_NUM_SAMPLES, ge=1)
    paper_seed: int = PAPER_SEED  # paper: their --seed, for the +Rand draws
    num_bootstrap: int = Field(1000, ge=0)  # SPEC §4: 1000 resamples
    image_side: bool = True
    min_distractors: int = Field(2, ge=1)
    max_distractors: int = Field(5, ge=1)
    # A saved benchmark table (.parquet / .csv from a previous run) to rescore instead of
    # building one; its images still come from the units table.
    table_uri: str | None = None
    # A frozen benchmark file (`csclip benchmark build`, csclip.eval.benchmark_file): score
    # exactly its items, its images from the paths it holds (relative ones under image_root).
    file: str | None = None
    image_root: str | None = None

    @model_validator(mode="after")
    def _one_source_of_items(self) -> BenchmarkConfig:
        if self.file and self.table_uri:
            raise ValueError("set benchmark.file or benchmark.table_uri, not both")
        return self

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
        protocol = resolve_protocol(config.protocol, records)
        benchmark = HalfTruthBenchmark(items, {}, num_images, len(records), protocol)
    else:
        benchmark = build_for_protocol(records, config)
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
        "half-truth benchmark (protocol %s, %s): %d images, %d items, %d image-side items, "
        "skips %s",
        benchmark.protocol,
        benchmark.content_hash,
        benchmark.num_images,
        len(benchmark.items),
        len(side),
        dict(benchmark.skipped),
    )
    return PreparedBenchmark(benchmark, tuple(side), images)


def resolve_protocol(protocol: str, records: Sequence[UnitsRecord]) -> str:
    """`auto` -> csclip when every record is the synthetic world's (source "gold"), else
    paper; `paper` and `csclip` as given."""
    if protocol != "auto":
        return Protocol(protocol).value
    is_world = bool(records) and all(r.source == "gold" for r in records)
    return (Protocol.CSCLIP if is_world else Protocol.PAPER).value


def build_for_protocol(
    records: Sequence[UnitsRecord], config: BenchmarkConfig
) -> HalfTruthBenchmark:
    """The half-truth benchmark of `records` under config.protocol (resolved)."""
    if resolve_protocol(config.protocol, records) == Protocol.PAPER:
        return build_paper_benchmark(
            [verbatim_from_units(r) for r in records], config.num_samples, config.paper_seed
        )
    return build_half_truth_benchmark(records, config.seed)


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

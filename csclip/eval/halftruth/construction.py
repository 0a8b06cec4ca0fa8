"""Construction, protocol `csclip` (ours): one caption per image, every random choice seeded
per image, so the same records in any order give the same items (SPEC §4)."""

from __future__ import annotations

import hashlib
import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from csclip.authors import VerbatimRecord
from csclip.errors import DataError
from csclip.eval.halftruth.items import (
    CONDITION_BY_SLUG,
    CONDITIONS,
    HalfTruthBenchmark,
    HalfTruthItem,
    Protocol,
    SkipReason,
)
from csclip.progress import progress
from csclip.units import ChangeType, Foil, Unit, UnitsRecord, normalize_text


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
    for image_id, record in progress(chosen.items(), desc="half-truth items", unit="image"):
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


def make_item(
    record: UnitsRecord | VerbatimRecord,
    slug: str,
    anchor: str,
    completion: str,
    half_truth: str,
    unit: str,
    foil: str,
) -> HalfTruthItem:
    """The item of `record` for the condition `slug` (both protocols build their items so)."""
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


def joined(first: str, second: str) -> str:
    """Two parts of a caption joined as every half-truth joins them: "<first> and <second>"."""
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
        completion = joined(first.text, second.text)
        half_truth = joined(first.text, wrong)
        out.append(
            (slug, make_item(record, slug, first.text, completion, half_truth, second.text, wrong))
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
                make_item(record, slug, anchor, relation.text, half_truth, relation.text, half_truth),
            )
        )
    return out

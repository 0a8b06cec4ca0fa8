"""Construction, protocol `paper`: the authors' builder, item for item."""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from csclip.authors import VerbatimRecord, VerbatimRelation, VerbatimTriple, entity_foil_names
from csclip.config.eval import PAPER_NUM_SAMPLES, PAPER_SEED
from csclip.errors import DataError
from csclip.eval.halftruth.construction import joined, make_item
from csclip.eval.halftruth.items import HalfTruthBenchmark, HalfTruthItem, Protocol, SkipReason
from csclip.progress import progress
from csclip.units import UnitsRecord

# Our reading of HalfTruthSampleGenerator in kargibora/CS-CLIP@2325a1c,
# experiments/half_truth_vulnerability.py (run per model by run_half_truth_batch.sh with
# NUM_SAMPLES=5000, its own --num_samples default, and --seed 42), and of the filters its
# HalfTruthEvaluator applies before scoring. Written
# from that file, checked item for item against its output (tests/test_halftruth_paper.py).
# Where it looks wrong we keep it, because the paper's numbers come from it; what csclip
# does instead is the `csclip` protocol, construction.py (docs/evaluation.md, "Protocols").

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
    foils as components and negatives, relation foils as stored triples. An entity foil
    keeps the change-type name its unit file wrote (csclip.authors.entity_foil_names):
    an `entity_change` foil (their generator's name for "woman -> man") is not an
    object_change to their builder, whether the units came from their files or from
    `--prompts authors`."""
    negatives = entity_foil_names(record)
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
    # The total is every record; a pass that reaches num_samples stops before.
    for index, record in enumerate(progress(records, desc=f"half-truth {side} pass",
                                            unit="caption")):
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
        completion = joined(sample.anchor, sample.second)
        for slug, foil in (
            ("obj", sample.object_foil),
            ("attr", sample.attribute_foil),
            ("rand", rand[0] if rand else ""),
        ):
            if foil:
                items.append(
                    make_item(
                        sample.record,
                        slug,
                        sample.anchor,
                        completion,
                        joined(sample.anchor, foil),
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
                    make_item(
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

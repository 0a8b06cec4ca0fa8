"""SPEC §3 text-slot sampler: for each training sample, the caption with a caption-level
negative (slot 0) and N unit/foil pairs (slots 1..N), seeded per (seed, sample, epoch) so
any worker in any process draws the same texts. It draws what the authors' released
sampler (utils/sampler.py) draws; docs/training.md shows the measured shares."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from csclip.config.train import SamplingConfig
from csclip.shuffles import permute_positions, shuffle_trigrams, shuffle_within_trigrams
from csclip.units import (
    ChangeType,
    Unit,
    UnitsRecord,
    normalize_text,
    record_from_row,
    render_relation,
    stored_shuffles,
)


@dataclass(frozen=True)
class SampleTexts:
    """The texts of one training sample. len(units) == len(foils) == N. When has_units is
    False the unit/foil entries are placeholders (the caption and its negative) that the
    loss masks out of L_unit; when has_negative is False the caption negative is a
    placeholder (the caption itself) that the loss leaves out of L_full's negative
    columns. Placeholders must never be trained on."""

    caption: str
    caption_negative: str
    units: tuple[str, ...]
    foils: tuple[str, ...]
    has_units: bool
    has_negative: bool = True


class NegativeKind(StrEnum):
    """Which rule of SPEC §3 produced the caption-level negative."""

    SHUFFLE = "shuffle"                        # rule 1: NegCLIP word-order shuffle
    INPLACE = "inplace"                        # rule 2: one entity replaced by its foil, in place
    RELATION_COMPOSITE = "relation_composite"  # rule 3a: "A and B where s r' o"
    ENTITY_COMPOSITE = "entity_composite"      # rule 3b: other entities and one foil, " and "
    NONE = "none"                              # nothing can be built: left out of L_full's negatives


@dataclass(frozen=True)
class CaptionNegative:
    """A caption-level negative; for NegativeKind.NONE `text` is the caption itself, a
    placeholder the loss must mask (SampleTexts.has_negative)."""

    text: str
    kind: NegativeKind


@dataclass(frozen=True)
class UnitChoice:
    """One filled unit slot: the unit text, its foil, the kind of unit drawn and the kind
    of edit of the foil (a ChangeType value)."""

    unit: str
    foil: str
    kind: str  # "entity" | "relation"
    change_type: str = ""


# ---------------------------------------------------------------------------------------
# Seeding
# ---------------------------------------------------------------------------------------

def sample_rng(seed: int, sample_id: str, epoch: int) -> random.Random:
    """A Random seeded from a stable hash of (seed, sample_id, epoch). Python's hash() is
    salted per process, so it would give each Ray worker different texts."""
    key = f"{seed}\x1f{sample_id}\x1f{epoch}".encode()
    return random.Random(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big"))


# ---------------------------------------------------------------------------------------
# Foil candidates
# ---------------------------------------------------------------------------------------

def _dedupe(unit_text: str, texts: Iterable[str], forbidden: Iterable[str] = ()) -> list[str]:
    # Keep order (so draws are reproducible), drop duplicates, the unit itself and texts
    # that are true of the sample (e.g. another of its own relation units).
    seen = {normalize_text(unit_text)} | {normalize_text(t) for t in forbidden}
    kept = []
    for text in texts:
        key = normalize_text(text)
        if key and key not in seen:
            seen.add(key)
            kept.append(text)
    return kept


def entity_foil_candidates(entity: Unit) -> list[str]:
    """An entity's usable foil texts (attribute and object changes), deduplicated."""
    return _dedupe(entity.text, (f.text for f in entity.foils
                                 if f.change_type in (ChangeType.ATTRIBUTE_CHANGE,
                                                      ChangeType.OBJECT_CHANGE)))


@dataclass(frozen=True)
class FoilCandidate:
    """One candidate of a relation's foil draw: its change type and the texts it stands
    for (one for a stored foil; a subject/object replacement stands for every foil of
    that entity, one of which is drawn when the candidate is)."""

    change_type: ChangeType
    texts: tuple[str, ...]


_STORED_RELATION_FOILS = (ChangeType.ANTONYM, ChangeType.NEGATION, ChangeType.SUBJECT_OBJECT_SWAP)


def relation_foil_candidates(relation: Unit, record: UnitsRecord,
                             use_negation: bool = True) -> list[FoilCandidate]:
    """A relation's foil candidates as the authors' sampler builds them (SPEC §3); the
    caller draws one candidate uniformly, then one of its texts:

    - one candidate per stored antonym, negation (when use_negation) and
      subject_object_swap foil. A swap is never built here: for a symmetric predicate
      ("is next to") it would be true, and only extraction knows (SPEC §2: "swap when
      visually different");
    - ONE subject replacement: the subject with one of its entity's foils (the entity
      whose text equals the subject after normalisation; a bare head noun is not matched,
      because a foil of "brown horse" does not make "horse ..." false), plus any stored
      subject_replace foil; ONE object replacement likewise.

    So with an antonym, a negation, a swap and both replacements each type is drawn 20%
    of the time, however many entity foils the arguments have. Candidates equal to the
    unit are skipped. Our guard beyond the authors': a text equal to another relation of
    the sample is true of the image, so it is dropped too; it only removes true "foils"
    and leaves the draw over the others as the authors make it.
    """
    forbidden = [r.text for r in record.relations if r is not relation]
    candidates = _stored_candidates(relation, forbidden, use_negation)
    entities = {normalize_text(e.text): e for e in record.entities}
    subject, predicate, obj = relation.subject or "", relation.predicate or "", relation.object or ""
    for change_type, argument in ((ChangeType.SUBJECT_REPLACE, subject),
                                  (ChangeType.OBJECT_REPLACE, obj)):
        entity = entities.get(normalize_text(argument))
        built = [render_relation(f, predicate, obj) if change_type == ChangeType.SUBJECT_REPLACE
                 else render_relation(subject, predicate, f)
                 for f in (entity_foil_candidates(entity) if entity is not None else ())]
        texts = _dedupe(relation.text, [f.text for f in relation.foils_of(change_type)] + built,
                        forbidden)
        if texts:
            candidates.append(FoilCandidate(change_type, tuple(texts)))
    return candidates


def _stored_candidates(relation: Unit, forbidden: Sequence[str],
                       use_negation: bool) -> list[FoilCandidate]:
    # One candidate per stored antonym / negation / swap text (deduplicated; not the unit,
    # not another relation of the sample).
    wanted = [c for c in _STORED_RELATION_FOILS if use_negation or c != ChangeType.NEGATION]
    stored = _dedupe(relation.text, (f.text for f in relation.foils if f.change_type in wanted),
                     forbidden)
    by_text: dict[str, ChangeType] = {}
    for f in relation.foils:
        by_text.setdefault(normalize_text(f.text), f.change_type)
    return [FoilCandidate(by_text[normalize_text(t)], (t,)) for t in stored]


# ---------------------------------------------------------------------------------------
# Unit slots
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pools:
    """Units that can fill a slot, each with its foil candidates."""

    relations: tuple[tuple[Unit, tuple[FoilCandidate, ...]], ...]
    entities: tuple[tuple[Unit, tuple[str, ...]], ...]


def _pools(record: UnitsRecord, config: SamplingConfig) -> _Pools:
    relations = tuple((r, tuple(c)) for r in record.relations
                      if (c := relation_foil_candidates(r, record, config.use_negation)))
    entities = tuple((e, tuple(c)) for e in record.entities if (c := entity_foil_candidates(e)))
    return _Pools(relations, entities)


def _relation_choice(relation: Unit, candidates: Sequence[FoilCandidate],
                     rng: random.Random, weights: Mapping[ChangeType, float]) -> UnitChoice:
    shares = [weights.get(c.change_type, 1.0) for c in candidates] if weights else []
    # Without weights, rng.choice as before: the same seed draws the same foils.
    candidate = (rng.choices(candidates, weights=shares)[0] if sum(shares) > 0
                 else rng.choice(candidates))
    return UnitChoice(relation.text, rng.choice(candidate.texts), "relation",
                      candidate.change_type.value)


def _entity_choice(entity: Unit, foils: Sequence[str], record: UnitsRecord,
                   config: SamplingConfig, rng: random.Random) -> UnitChoice:
    foil = rng.choice(foils)
    change_type = next((f.change_type.value for f in entity.foils if f.text == foil), "")
    # With entity_context_prob, one other entity of the sample rides along as context:
    # "A and C" vs "A' and C" (SPEC §3). C must not be the foil itself (that would be true).
    contexts = [e.text for e in record.entities
                if normalize_text(e.text) not in (normalize_text(entity.text), normalize_text(foil))]
    if contexts and rng.random() < config.entity_context_prob:
        context = rng.choice(contexts)
        # The authors shuffle the order of the parts, independently for the unit and the
        # foil, so the position of the edited entity carries no signal.
        return UnitChoice(_joined_shuffled([entity.text, context], rng),
                          _joined_shuffled([foil, context], rng), "entity", change_type)
    return UnitChoice(entity.text, foil, "entity", change_type)


def _joined_shuffled(parts: list[str], rng: random.Random) -> str:
    rng.shuffle(parts)
    return " and ".join(parts)


def draw_unit_slots(record: UnitsRecord, config: SamplingConfig,
                    rng: random.Random) -> list[UnitChoice]:
    """Fill the N unit slots of one sample (SPEC §3), each slot independently and with
    replacement (two slots may carry the same unit), as the authors' sampler does: with
    probability relation_prob a slot takes a relation, falling back to an entity only
    when the sample has no relation with a foil; otherwise an entity, falling back to a
    relation. So relation_prob is the share of relation slots wherever both kinds exist.
    Returns [] when no unit has a foil (the sample is then masked out of L_unit)."""
    pools = _pools(record, config)
    if not pools.relations and not pools.entities:
        return []
    slots = []
    for _ in range(config.num_unit_slots):
        wants_relation = rng.random() < config.relation_prob
        if pools.relations and (wants_relation or not pools.entities):
            relation, candidates = rng.choice(pools.relations)
            slots.append(_relation_choice(relation, candidates, rng,
                                          config.relation_foil_weights))
        else:
            entity, foils = rng.choice(pools.entities)
            slots.append(_entity_choice(entity, foils, record, config, rng))
    return slots


# ---------------------------------------------------------------------------------------
# Caption-level negative (slot 0)
# ---------------------------------------------------------------------------------------

# NegCLIP's shuffles need nouns and adjectives; spaCy models cannot be downloaded here, so
# a word counts as noun/adjective when it occurs in one of the sample's entity units (an
# entity is an object with its attributes) or in this small lexicon of caption words.
# Approximation: verbs that double as nouns ("ride") and unlisted words count as "other".
_LEXICON = frozenset("""
red orange yellow green blue purple pink brown black white gray grey silver gold golden
dark light bright colorful large small big little tiny huge tall short long wide narrow
old young new wooden metal plastic glass stone wet dry empty full open closed round
square circle triangle cross star diamond shape object
man woman men women person people boy girl child children kid kids baby player group crowd
dog dogs cat cats horse horses cow cows sheep bird birds elephant elephants giraffe zebra bear
car cars bus truck train plane airplane boat bike bicycle motorcycle street road sidewalk
table chair couch bed desk room kitchen bathroom window door wall floor building house
tree trees grass field water beach ocean sky snow hill mountain park
pizza sandwich plate bowl cup food cake banana apple bread phone laptop computer tv
umbrella kite frisbee ball skateboard surfboard skis board sign clock light bench fence
""".split())
_FUNCTION_WORDS = frozenset("a an the of and or with in on at to is are there some one two three "
                            "four five several many this that".split())


def _noun_or_adjective_words(record: UnitsRecord) -> frozenset[str]:
    words = {w for e in record.entities for w in normalize_text(e.text).split()}
    return frozenset((words | _LEXICON) - _FUNCTION_WORDS)


def shuffle_caption(caption: str, noun_adj_words: frozenset[str],
                    rng: random.Random) -> str | None:
    """A NegCLIP word-order shuffle of `caption` (Yuksekgonul et al. 2023, ARO): one of
    shuffle nouns and adjectives / shuffle all but nouns and adjectives / shuffle within
    trigrams / shuffle trigrams, tried in random order until the word order changes.
    Returns None when no shuffle changes the caption (e.g. a single word)."""
    tokens = caption.strip().rstrip(".").split()
    is_content = [normalize_text(t) in noun_adj_words for t in tokens]
    content = [i for i, c in enumerate(is_content) if c]
    other = [i for i, c in enumerate(is_content) if not c]
    shuffles: list[Callable[[], list[str]]] = [
        lambda: permute_positions(tokens, content, rng),
        lambda: permute_positions(tokens, other, rng),
        lambda: shuffle_within_trigrams(tokens, rng),
        lambda: shuffle_trigrams(tokens, rng),
    ]
    rng.shuffle(shuffles)
    original = normalize_text(caption)
    for shuffle in shuffles:
        for _ in range(3):  # a random permutation may be the identity; retry a little
            text = " ".join(shuffle())
            if normalize_text(text) != original:
                return text
    return None


def _entity_pattern(entity: str) -> re.Pattern[str]:
    # SPEC §3: caption.replace(entity, foil, 1) on an exact substring. We also require word
    # boundaries, so "cat" is not replaced inside "catch".
    return re.compile(rf"(?<!\w){re.escape(entity)}(?!\w)")


def _stored_relation_foils(record: UnitsRecord, use_negation: bool) -> list[str]:
    # Every stored antonym / negation / swap foil of the sample, for the "where" composite
    # (the authors' composite uses stored relation foils only, never built replacements).
    texts: list[str] = []
    for relation in record.relations:
        forbidden = [r.text for r in record.relations if r is not relation]
        texts += [c.texts[0] for c in _stored_candidates(relation, forbidden, use_negation)]
    return texts


def _random_subset(items: Sequence[str], minimum: int, rng: random.Random) -> list[str]:
    # A subset of random size in [minimum, len(items)], in random order (the authors'
    # random.sample(items, random.randint(minimum, len(items)))).
    return rng.sample(list(items), rng.randint(minimum, len(items))) if items else []


def draw_caption_negative(record: UnitsRecord, config: SamplingConfig,
                          rng: random.Random) -> CaptionNegative:
    """The caption-level negative of slot 0 (SPEC §3), first rule that applies:
    1. with swap_prob, a NegCLIP word-order shuffle: one of the units' precomputed shuffles
       (the authors' swap_negatives) when the record has them, else one drawn here (ours);
    2. with inplace_prob, one entity of the caption replaced by its foil, in place;
    3. a composite: with relation_negative_prob, when the sample has a stored relation
       foil, a non-empty random subset of its entities joined by " and ", then " where ",
       then one relation foil; else the other entities (a random subset) and one entity
       foil, shuffled, joined with " and ".
    When none applies the kind is NONE and the text the caption itself: the loss leaves
    that sample out of L_full's negative columns (the authors drop it), never pairs it
    with itself. NegativeKind tells which rule applied, so callers can count them."""
    caption = record.caption
    if rng.random() < config.swap_prob:
        if stored := stored_shuffles(record):
            # The units' precomputed shuffles (the authors' swap_negatives), drawn as their
            # sampler draws them: an unusable entry ("") falls through to rule 2.
            if text := rng.choice(stored):
                return CaptionNegative(text, NegativeKind.SHUFFLE)
        elif (text := shuffle_caption(caption, _noun_or_adjective_words(record), rng)) is not None:
            return CaptionNegative(text, NegativeKind.SHUFFLE)
    entities = [(e, foils) for e in record.entities if (foils := entity_foil_candidates(e))]
    if rng.random() < config.inplace_prob:
        in_caption = [(e, foils) for e, foils in entities if _entity_pattern(e.text).search(caption)]
        if in_caption:
            entity, foils = rng.choice(in_caption)
            foil = rng.choice(foils)
            text = _entity_pattern(entity.text).sub(lambda _: foil, caption, count=1)
            return CaptionNegative(text, NegativeKind.INPLACE)
    relation_foils = _stored_relation_foils(record, config.use_negation)
    if relation_foils and rng.random() < config.relation_negative_prob:
        foil = rng.choice(relation_foils)
        subset = _random_subset([e.text for e in record.entities], 1, rng)
        text = f"{' and '.join(subset)} where {foil}" if subset else foil
        return CaptionNegative(text, NegativeKind.RELATION_COMPOSITE)
    if entities:
        entity, foils = rng.choice(entities)
        foil = rng.choice(foils)
        # Other entities that equal the foil would make the composite true; validated
        # records never have one (FOIL_IN_CAPTION), so this guard changes no draw.
        others = [e.text for e in record.entities
                  if e is not entity and normalize_text(e.text) != normalize_text(foil)]
        parts = _random_subset(others, 0, rng) + [foil]
        return CaptionNegative(_joined_shuffled(parts, rng), NegativeKind.ENTITY_COMPOSITE)
    return CaptionNegative(caption, NegativeKind.NONE)


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------

def sample_texts(record: UnitsRecord, config: SamplingConfig, seed: int, epoch: int) -> SampleTexts:
    """Draw the 1 + N positive texts and their foils for one sample at one epoch.
    Deterministic in (seed, record.sample_id, epoch), on any worker."""
    rng = sample_rng(seed, record.sample_id, epoch)
    slots = draw_unit_slots(record, config, rng)
    negative = draw_caption_negative(record, config, rng)
    has_negative = negative.kind != NegativeKind.NONE
    if not slots:
        # Placeholders keep the batch rectangular; the loss masks this sample out of L_unit.
        placeholder_units = (record.caption,) * config.num_unit_slots
        placeholder_foils = (negative.text,) * config.num_unit_slots
        return SampleTexts(record.caption, negative.text, placeholder_units, placeholder_foils,
                           False, has_negative)
    return SampleTexts(record.caption, negative.text, tuple(s.unit for s in slots),
                       tuple(s.foil for s in slots), True, has_negative)


def sample_text_columns(records: Iterable[UnitsRecord | Mapping[str, Any]], config: SamplingConfig,
                        seed: int, epoch: int) -> dict[str, list]:
    """Text columns for a batch (e.g. inside Ray Data map_batches): `caption`,
    `caption_negative`, `unit_{k}` and `foil_{k}` for k in 0..N-1, `unit_mask` (bool,
    False where the unit columns are placeholders) and `negative_mask` (bool, False where
    no caption negative could be built). Accepts records or row dicts."""
    num = config.num_unit_slots
    columns: dict[str, list] = {"caption": [], "caption_negative": []}
    for k in range(num):
        columns[f"unit_{k}"], columns[f"foil_{k}"] = [], []
    columns["unit_mask"], columns["negative_mask"] = [], []
    for record in records:
        if not isinstance(record, UnitsRecord):
            record = record_from_row(_row_defaults(record))
        texts = sample_texts(record, config, seed, epoch)
        columns["caption"].append(texts.caption)
        columns["caption_negative"].append(texts.caption_negative)
        for k in range(num):
            columns[f"unit_{k}"].append(texts.units[k])
            columns[f"foil_{k}"].append(texts.foils[k])
        columns["unit_mask"].append(texts.has_units)
        columns["negative_mask"].append(texts.has_negative)
    return columns


def _row_defaults(row: Mapping[str, Any]) -> dict[str, Any]:
    row = {key: _plain(value) for key, value in row.items() if key != "image_bytes"}
    row.setdefault("image_id", row.get("sample_id", ""))
    row.setdefault("split", "")
    return row


def _plain(value: Any) -> Any:
    # numpy arrays -> lists, numpy scalars -> Python scalars, recursively through dicts.
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value

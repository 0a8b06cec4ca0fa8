"""SPEC §3 text-slot sampler: for each training sample, the caption with a caption-level
negative (slot 0) and N unit/foil pairs (slots 1..N), seeded per (seed, sample, epoch) so
any worker in any process draws the same texts."""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import Field

from csclip.config import StrictModel
from csclip.units import (
    ChangeType,
    Unit,
    UnitsRecord,
    normalize_text,
    record_from_row,
    render_relation,
)


class SamplingConfig(StrictModel):
    """How the text slots of a training sample are drawn (SPEC §3)."""

    num_unit_slots: int = Field(2, ge=1, le=16)      # N (paper: 2; ablated 1..4)
    relation_prob: float = Field(1.0, ge=0, le=1)    # P(slot takes a relation unit) (paper: 1.0)
    # Caption-level negative, first that applies: shuffle with swap_prob, else in-place foil
    # with inplace_prob, else the composite "other entities and a foil". The paper ablates
    # the swap-foil fraction over 0..1 without naming its default, and the authors' code is
    # not available to us: 0.5 sits mid-grid and gives word-order and content negatives
    # equal weight; inplace_prob 0.5 then splits the rest evenly between the in-place
    # caption edit (NegCLIP-like) and the composite, so each content form is seen often.
    swap_prob: float = Field(0.5, ge=0, le=1)
    inplace_prob: float = Field(0.5, ge=0, le=1)
    entity_context_prob: float = Field(0.5, ge=0, le=1)  # "A and C" vs "A' and C" (SPEC: 0.5)
    # Negation foils ("is not above") are kept in the data but the paper's tables do not
    # train on them (SPEC §2); set True to add them to a relation's foil candidates.
    use_negation: bool = False


@dataclass(frozen=True)
class SampleTexts:
    """The texts of one training sample. len(units) == len(foils) == N. When has_units is
    False the unit/foil entries are placeholders (the caption and its negative) that the
    loss masks out; they must never be trained on."""

    caption: str
    caption_negative: str
    units: tuple[str, ...]
    foils: tuple[str, ...]
    has_units: bool


class NegativeKind(StrEnum):
    """Which rule of SPEC §3 produced the caption-level negative."""

    SHUFFLE = "shuffle"          # rule 1: NegCLIP word-order shuffle
    INPLACE = "inplace"          # rule 2: one entity replaced by its foil, in place
    COMPOSITE = "composite"      # rule 3: other entities and one foil, joined with " and "
    FORCED_SHUFFLE = "forced_shuffle"  # no foil anywhere: a shuffle even past swap_prob
    IDENTITY = "identity"        # nothing can differ (e.g. a one-word caption, no foils)


@dataclass(frozen=True)
class CaptionNegative:
    text: str
    kind: NegativeKind


@dataclass(frozen=True)
class UnitChoice:
    """One filled unit slot: the unit text, its foil, and the kind of unit drawn."""

    unit: str
    foil: str
    kind: str  # "entity" | "relation"


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


def relation_foil_candidates(relation: Unit, record: UnitsRecord,
                             use_negation: bool = False) -> list[str]:
    """A relation's foil candidates (SPEC §3), deduplicated, drawn from uniformly:

    - its own antonym foils (and negation foils when use_negation);
    - its stored subject_object_swap foil. A swap is never built here: for a symmetric
      predicate ("is next to") it would be true, and only extraction knows (SPEC §2:
      "swap when visually different");
    - subject/object replacements: stored subject_replace/object_replace foils, plus ones
      built from the entity foils of the entity whose text equals the subject/object
      (exact match after normalisation; a bare head noun is not matched, because a foil of
      "brown horse" does not make "horse ..." false).
    """
    wanted = {ChangeType.ANTONYM, ChangeType.SUBJECT_OBJECT_SWAP, ChangeType.SUBJECT_REPLACE,
              ChangeType.OBJECT_REPLACE} | ({ChangeType.NEGATION} if use_negation else set())
    texts = [f.text for f in relation.foils if f.change_type in wanted]
    entities = {normalize_text(e.text): e for e in record.entities}
    subject, predicate, obj = relation.subject or "", relation.predicate or "", relation.object or ""
    subject_entity, object_entity = entities.get(normalize_text(subject)), entities.get(normalize_text(obj))
    if subject_entity is not None:
        texts += [render_relation(f, predicate, obj) for f in entity_foil_candidates(subject_entity)]
    if object_entity is not None:
        texts += [render_relation(subject, predicate, f) for f in entity_foil_candidates(object_entity)]
    other_relations = [r.text for r in record.relations if r is not relation]
    return _dedupe(relation.text, texts, forbidden=other_relations)


# ---------------------------------------------------------------------------------------
# Unit slots
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Pools:
    """Units that can fill a slot, each with its foil candidates."""

    relations: tuple[tuple[Unit, tuple[str, ...]], ...]
    entities: tuple[tuple[Unit, tuple[str, ...]], ...]


def _pools(record: UnitsRecord, config: SamplingConfig) -> _Pools:
    relations = tuple((r, tuple(c)) for r in record.relations
                      if (c := relation_foil_candidates(r, record, config.use_negation)))
    entities = tuple((e, tuple(c)) for e in record.entities if (c := entity_foil_candidates(e)))
    return _Pools(relations, entities)


def _entity_choice(entity: Unit, foils: Sequence[str], record: UnitsRecord,
                   config: SamplingConfig, rng: random.Random) -> UnitChoice:
    foil = rng.choice(foils)
    # With entity_context_prob, one other entity of the sample rides along as context:
    # "A and C" vs "A' and C" (SPEC §3). C must not be the foil itself (that would be true).
    contexts = [e.text for e in record.entities
                if normalize_text(e.text) not in (normalize_text(entity.text), normalize_text(foil))]
    if contexts and rng.random() < config.entity_context_prob:
        context = rng.choice(contexts)
        return UnitChoice(f"{entity.text} and {context}", f"{foil} and {context}", "entity")
    return UnitChoice(entity.text, foil, "entity")


def draw_unit_slots(record: UnitsRecord, config: SamplingConfig,
                    rng: random.Random) -> list[UnitChoice]:
    """Fill the N unit slots of one sample (SPEC §3). Units are drawn without replacement
    within a sample, so the slots carry different units while the sample has enough; a
    slot that cannot be filled copies another filled slot. A relation slot falls back to an
    entity, never the other way (SPEC §3), so relation_prob = 0 never trains on relations.
    Returns [] when no slot can be filled (the sample is then masked out of L_unit)."""
    pools = _pools(record, config)
    used: set[int] = set()
    slots: list[UnitChoice | None] = []
    for _ in range(config.num_unit_slots):
        # Draw the relation coin for every slot, so a slot's draws do not depend on
        # which pools happen to be empty.
        wants_relation = rng.random() < config.relation_prob
        relations = [p for p in pools.relations if id(p[0]) not in used]
        entities = [p for p in pools.entities if id(p[0]) not in used]
        if wants_relation and relations:
            unit, foils = rng.choice(relations)
            slots.append(UnitChoice(unit.text, rng.choice(foils), "relation"))
        elif entities:  # relation not wanted, or none left: fall back to an entity unit
            unit, foils = rng.choice(entities)
            slots.append(_entity_choice(unit, foils, record, config, rng))
        else:
            slots.append(None)
            continue
        used.add(id(unit))
    filled = [s for s in slots if s is not None]
    if not filled:
        return []
    return [s if s is not None else rng.choice(filled) for s in slots]


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


def _shuffle_positions(tokens: list[str], positions: list[int], rng: random.Random) -> list[str]:
    values = [tokens[i] for i in positions]
    rng.shuffle(values)
    out = list(tokens)
    for i, value in zip(positions, values, strict=True):
        out[i] = value
    return out


def _trigrams(tokens: list[str]) -> list[list[str]]:
    return [tokens[i:i + 3] for i in range(0, len(tokens), 3)]


def _shuffle_within_trigrams(tokens: list[str], rng: random.Random) -> list[str]:
    return [t for tri in _trigrams(tokens) for t in rng.sample(tri, len(tri))]


def _shuffle_trigrams(tokens: list[str], rng: random.Random) -> list[str]:
    trigrams = _trigrams(tokens)
    rng.shuffle(trigrams)
    return [t for tri in trigrams for t in tri]


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
        lambda: _shuffle_positions(tokens, content, rng),
        lambda: _shuffle_positions(tokens, other, rng),
        lambda: _shuffle_within_trigrams(tokens, rng),
        lambda: _shuffle_trigrams(tokens, rng),
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


def draw_caption_negative(record: UnitsRecord, config: SamplingConfig,
                          rng: random.Random) -> CaptionNegative:
    """The caption-level negative of slot 0 (SPEC §3), first rule that applies:
    1. with swap_prob, a NegCLIP word-order shuffle;
    2. with inplace_prob, one entity of the caption replaced by its foil, in place;
    3. otherwise the other entities plus one foil, shuffled, joined with " and ".
    A sample without any foil falls back to a shuffle, and a caption nothing can change
    to itself (NegativeKind tells which rule applied, so callers can count them)."""
    caption = record.caption
    noun_adj = _noun_or_adjective_words(record)
    if rng.random() < config.swap_prob:
        if (text := shuffle_caption(caption, noun_adj, rng)) is not None:
            return CaptionNegative(text, NegativeKind.SHUFFLE)
    entities = [(e, foils) for e in record.entities if (foils := entity_foil_candidates(e))]
    if rng.random() < config.inplace_prob:
        in_caption = [(e, foils) for e, foils in entities if _entity_pattern(e.text).search(caption)]
        if in_caption:
            entity, foils = rng.choice(in_caption)
            foil = rng.choice(foils)
            text = _entity_pattern(entity.text).sub(lambda _: foil, caption, count=1)
            return CaptionNegative(text, NegativeKind.INPLACE)
    if entities:
        entity, foils = rng.choice(entities)
        parts = [e.text for e in record.entities if e is not entity] + [rng.choice(foils)]
        rng.shuffle(parts)
        return CaptionNegative(" and ".join(parts), NegativeKind.COMPOSITE)
    relations = [(r, c) for r in record.relations
                 if (c := relation_foil_candidates(r, record, config.use_negation))]
    if relations:  # no entity foil: the composite carries a relation foil instead
        _, foils = rng.choice(relations)
        parts = [e.text for e in record.entities] + [rng.choice(foils)]
        rng.shuffle(parts)
        return CaptionNegative(" and ".join(parts), NegativeKind.COMPOSITE)
    if (text := shuffle_caption(caption, noun_adj, rng)) is not None:
        return CaptionNegative(text, NegativeKind.FORCED_SHUFFLE)
    return CaptionNegative(caption, NegativeKind.IDENTITY)


# ---------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------

def sample_texts(record: UnitsRecord, config: SamplingConfig, seed: int, epoch: int) -> SampleTexts:
    """Draw the 1 + N positive texts and their foils for one sample at one epoch.
    Deterministic in (seed, record.sample_id, epoch), on any worker."""
    rng = sample_rng(seed, record.sample_id, epoch)
    slots = draw_unit_slots(record, config, rng)
    negative = draw_caption_negative(record, config, rng)
    if not slots:
        # Placeholders keep the batch rectangular; the loss masks this sample out of L_unit.
        placeholder_units = (record.caption,) * config.num_unit_slots
        placeholder_foils = (negative.text,) * config.num_unit_slots
        return SampleTexts(record.caption, negative.text, placeholder_units, placeholder_foils, False)
    return SampleTexts(record.caption, negative.text, tuple(s.unit for s in slots),
                       tuple(s.foil for s in slots), True)


def sample_text_columns(records: Iterable[UnitsRecord | Mapping[str, Any]], config: SamplingConfig,
                        seed: int, epoch: int) -> dict[str, list]:
    """Text columns for a batch (e.g. inside Ray Data map_batches): `caption`,
    `caption_negative`, `unit_{k}` and `foil_{k}` for k in 0..N-1, and `unit_mask` (bool,
    False where the unit columns are placeholders). Accepts records or row dicts."""
    num = config.num_unit_slots
    columns: dict[str, list] = {"caption": [], "caption_negative": []}
    for k in range(num):
        columns[f"unit_{k}"], columns[f"foil_{k}"] = [], []
    columns["unit_mask"] = []
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
    return columns


_SAMPLING_COLUMNS = ("sample_id", "image_id", "caption", "split", "entities", "relations")


def records_from_batch(batch: Mapping[str, Sequence]) -> list[UnitsRecord]:
    """Rebuild the records of a columnar batch (Ray Data's "numpy" or "pandas" format, or
    a dict of lists) with just what sampling needs: ids, caption, entities, relations.
    Ray gives nested list<struct> columns as numpy object arrays; they are made plain."""
    present = [c for c in _SAMPLING_COLUMNS if c in batch]
    num_rows = len(batch["sample_id"])
    rows = ({c: _plain(batch[c][i]) for c in present} for i in range(num_rows))
    return [record_from_row(_row_defaults(row)) for row in rows]


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

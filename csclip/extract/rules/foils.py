"""Units and foils: the entity and relation units of a reading, each with foils that pass
`foil_rejection`, checked per caption by `FoilCheck` (seeded by the caption's hash)."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import NamedTuple

from csclip.extract import lexicon as lx
from csclip.extract.rules.base import (
    MAX_ENTITY_FOILS,
    Parse,
    Phrase,
    PredicateForms,
    predicate_forms,
)
from csclip.units import (
    ENTITY_CHANGES,
    GENERIC_WORDS,
    MAX_ENTITIES,
    MAX_RELATIONS,
    RELATION_CHANGES,
    SYNONYMS_OF,
    ChangeType,
    Foil,
    Rejection,
    RejectReason,
    Unit,
    is_placeholder,
    normalize_text,
    stem_word,
)


def stable_seed(text: str) -> int:
    """A 64-bit seed from `text`, the same in every process."""
    # Not hash(): Python salts str hashes per process, and foils must not change between runs.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


# The same entity texts ("man", "table") recur across captions; their hash need not.
_phrase_seed = functools.lru_cache(maxsize=1 << 14)(stable_seed)


# A foil candidate as plain data, the fields of `Foil` in its order: (text, change_type,
# subject, predicate, object). Candidates are built and judged as tuples (equal exactly
# when the `Foil`s would be); only the kept ones become `Foil`s.
_Candidate = tuple[str, ChangeType, str | None, str | None, str | None]
# A candidate with the reading of its text, joined from its pieces' readings (see
# `_join_readings`): a relation foil's text is new in nearly every caption, its pieces are not.
_Judged = tuple[_Candidate, "_Reading"]

# The change types as module constants: in Python 3.11 `ChangeType.X` goes through the enum
# class's attribute lookup (~200 ns, as long as a third of a candidate's whole check).
_ATTRIBUTE_CHANGE = ChangeType.ATTRIBUTE_CHANGE
_OBJECT_CHANGE = ChangeType.OBJECT_CHANGE
_ANTONYM = ChangeType.ANTONYM
_NEGATION = ChangeType.NEGATION
_SWAP = ChangeType.SUBJECT_OBJECT_SWAP
_SUBJECT_REPLACE = ChangeType.SUBJECT_REPLACE
_OBJECT_REPLACE = ChangeType.OBJECT_REPLACE

_new_instance = object.__new__
_set_attribute = object.__setattr__


def _make_foils(kept: Sequence[_Judged]) -> tuple[Foil, ...]:
    """`Foil(text, change_type, subject, predicate, object_)` of each kept candidate, the
    same objects, built without the frozen dataclass's five guarded setattr calls and its
    `__post_init__` (whose only work, turning a string into a ChangeType, is not needed: the
    extractor only passes ChangeTypes). ~10 foils a caption made `Foil()` a tenth of the
    extractor's time; tests/test_rules.py checks the two agree field for field."""
    foils = []
    for (text, change_type, subject, predicate, object_), _ in kept:
        foil = _new_instance(Foil)
        _set_attribute(foil, "__dict__", {"text": text, "change_type": change_type,
                                          "subject": subject, "predicate": predicate,
                                          "object": object_})
        foils.append(foil)
    return tuple(foils)


def _make_unit(kind: str, text: str, foils: tuple[Foil, ...], subject: str | None = None,
               predicate: str | None = None, object_: str | None = None) -> Unit:
    """`Unit(kind, text, foils, subject, predicate, object_)`, built as `_make_foils` builds foils."""
    unit = _new_instance(Unit)
    _set_attribute(unit, "__dict__", {"kind": kind, "text": text, "foils": foils,
                                      "subject": subject, "predicate": predicate,
                                      "object": object_})
    return unit


def entity_units(phrases: list[Phrase], caption: str, tokens: list[str], seed: int,
                  rejections: list[Rejection]
                  ) -> tuple[dict[str, Unit], dict[str, tuple[str, _Reading]], FoilCheck]:
    """Entity units keyed by text (first mention wins), with validated foils; each entity's
    first foil with its reading, by entity text (the relations' subject and object
    replacements); and the caption's foil check (the relations' foils are checked against
    the same entities)."""
    texts = list(dict.fromkeys(p.text for p in phrases))
    if len(texts) > MAX_ENTITIES:
        rejections.append(Rejection(RejectReason.TOO_MANY_UNITS,
                                    f"{len(texts)} entities, kept {MAX_ENTITIES}"))
        texts = texts[:MAX_ENTITIES]
    caption_words = set(tokens)
    # Nouns no object foil may use: the caption's own, their synonyms and hypernyms.
    taboo = frozenset().union(*[_taboo_of(p.head.singular) for p in phrases])
    units: dict[str, Unit] = {}
    first_foils: dict[str, tuple[str, _Reading]] = {}
    check = FoilCheck(caption, texts)
    for phrase in phrases:
        text = phrase.text
        if text in units or text not in texts:
            continue
        salt = seed ^ _phrase_seed(text)
        # SPEC §2 asks for 2-3 foils: an entity without attributes gets two object changes.
        max_object = 1 if phrase.attributes else 2
        # Object changes first, then attribute changes; both built lazily, only as many as
        # are kept (a rejected candidate's back-up comes next).
        reading = _read_piece(text)
        kept = check.valid_foils("entity", text, reading, (None, None),
                                 _object_foil_candidates(phrase, taboo, caption_words, salt),
                                 rejections, max_object, limit=max_object)
        if phrase.attributes and len(kept) < MAX_ENTITY_FOILS:  # else there are none to add
            kept += check.valid_foils("entity", text, reading, (None, None),
                                      _attribute_foil_candidates(phrase, caption_words, salt),
                                      rejections, limit=MAX_ENTITY_FOILS - len(kept))
        if kept:
            # Object changes first: "woman is riding horse" is the SPEC's subject_replace
            # example.
            first_candidate, first_reading = kept[0]
            first_foils[text] = (first_candidate[0], first_reading)
        units[text] = _make_unit("entity", text, _make_foils(kept))
    return units, first_foils, check


@functools.lru_cache(maxsize=1 << 12)
def _taboo_of(singular: str) -> frozenset[str]:
    """A noun with its synonyms and hypernyms: no object foil of a caption naming it."""
    return frozenset({singular}).union(lx.SAME_THING_GROUPS.get(singular, ()))


def _object_foil_candidates(phrase: Phrase, taboo: frozenset[str],
                            caption_words: set[str], salt: int) -> Iterator[_Judged]:
    """Object changes: the head noun replaced by one of its category (not in the caption),
    at most three."""
    plan = _object_foil_plan(phrase.words, phrase.head_start, phrase.attributes,
                             phrase.is_plural)
    if plan is None:
        return
    entries, prefix, kept_reading, plural_form, age_bound = plan
    num_nouns = len(entries) // 2
    found = 0
    # Walk the category once from a seeded start and stop at three usable nouns: checking
    # every noun of the category for every phrase was most of the extractor's time.
    for (singular, plural, last_singular, last_plural, is_age_bound, singular_reading,
         plural_reading) in islice(entries, salt % num_nouns, salt % num_nouns + num_nouns):
        if singular in taboo:
            continue
        # "cats" in the caption rules out "cat" and "cats"; "cell phone" is ruled out by "phone".
        if (last_singular not in caption_words and last_plural not in caption_words
                and (age_bound is None or is_age_bound == age_bound)):
            form, reading = (plural, plural_reading) if plural_form else (
                singular, singular_reading)
            if prefix:
                reading = _join_readings(kept_reading, reading)
            yield (prefix + form, _OBJECT_CHANGE, None, None, None), reading
            found += 1
            if found == 3:
                return


def _attribute_foil_candidates(phrase: Phrase, caption_words: set[str],
                               salt: int) -> Iterator[_Judged]:
    """Up to two attribute changes per attribute word: color -> another color, size/state
    -> its opposite, count -> the next count, material -> another material."""
    words = list(phrase.words)
    for index, kind in phrase.attributes:
        after = f" {words[index + 1]}" if index + 1 < len(words) else ""
        before_reading = _read_piece(" ".join(words[:index]))
        after_reading = _read_piece(" ".join(words[index + 1 :]))
        taken = 0
        for value in _attribute_values(words[index], kind, caption_words, salt >> (8 + index)):
            if value + after in lx.NOUNS:
                continue  # never "cold dog" -> "hot dog"
            edited = words[:index] + [value] + words[index + 1 :]
            reading = _join_three(before_reading, _read_piece(value), after_reading)
            yield (" ".join(edited), _ATTRIBUTE_CHANGE, None, None, None), reading
            taken += 1
            if taken == 2:
                break


class _ObjectFoilPlan(NamedTuple):
    """What every object foil of a noun phrase shares, in any caption."""

    entries: tuple  # the category's `_CATEGORY_ENTRIES`
    prefix: str  # the modifiers kept before the new noun, with a space; or ""
    kept_reading: _Reading  # the reading of the kept modifiers
    plural_form: bool  # whether the new noun takes its plural form
    age_bound: bool | None  # None: no age word; else whether the new noun must carry an age


@functools.lru_cache(maxsize=1 << 14)
def _object_foil_plan(words: tuple[str, ...], head_start: int,
                      attributes: tuple[tuple[int, str], ...],
                      is_plural: bool) -> _ObjectFoilPlan | None:
    """The plan of a noun phrase's object foils, None when its category has no foils. A
    function of the phrase's words, head and attributes only, and the same phrases recur
    caption after caption, so it is remembered."""
    head_text = " ".join(words[head_start:])
    head = lx.NOUNS[head_text]  # the phrase's head noun: its words end the phrase
    entries = _CATEGORY_ENTRIES.get(foil_category(head))
    if not entries:
        return None
    kept = _object_foil_modifiers(words, head_start, attributes)
    # The new noun takes the old one's number: "group of small children" -> "group of
    # small teenagers" (the group is one, its members many).
    if head.plural != head.singular:
        plural_form = head_text == head.plural
    elif "of" in words[:head_start]:  # "herd of sheep" are many, "plate of rice" is not
        collective = words[words.index("of") - 1]
        plural_form = (collective in lx.GROUP_COLLECTIVES
                       or head.category in ("animal", "person_other"))
    else:
        plural_form = is_plural
    # "young man" -> "young woman", never "young boy": with an age word, the new noun must
    # say as much about age as the old one.
    age_bound = (head.singular in lx.AGE_BOUND_NOUNS
                 if not lx.AGE_WORDS.isdisjoint(words[:head_start]) else None)
    kept_text = " ".join(kept)
    return _ObjectFoilPlan(entries, kept_text + " " if kept else "", _read_piece(kept_text),
                           plural_form, age_bound)


def _object_foil_modifiers(words: tuple[str, ...], head_start: int,
                           attributes: tuple[tuple[int, str], ...]) -> list[str]:
    """The words an object foil keeps before its new noun: attributes (color, size, count,
    ...), adjectives that fit any noun, collectives ("group of"). Noun modifiers, unknown
    words, possessives and adjectives bound to the old noun go with it: "tennis player" ->
    "chef", never "tennis chef"; "polar bear" -> "zebra", never "polar zebra"."""
    attribute_at = {index for index, _ in attributes}
    kept = []
    for index, word in enumerate(words[:head_start]):
        if index in attribute_at or word in lx.QUANTITIES or word in lx.INTENSIFIERS or (
                word in lx.OTHER_ADJECTIVES and word not in lx.HEAD_BOUND_ADJECTIVES):
            kept.append(word)
        elif word in ("of", "and") or word in lx.COLLECTIVES:
            kept.append(word)
    while kept and kept[-1] == "and":
        kept.pop()
    return kept


def foil_category(noun: lx.Noun) -> str:
    """The category an object foil of `noun` is drawn from (its own, or animals for a
    person noun so vague that any other person might be true of it)."""
    return lx.FOIL_CATEGORY_OF_GENERIC.get(noun.singular, noun.category)


def _attribute_values(word: str, kind: str, caption_words: set[str],
                      salt: int) -> list[str]:
    if word in lx.ATTRIBUTE_ANTONYMS and kind in ("size", "state"):
        return [lx.ATTRIBUTE_ANTONYMS[word]]
    if kind == "count":
        index = lx.COUNTS.index(word)
        return [lx.COUNTS[index + 1] if index + 1 < len(lx.COUNTS) else lx.COUNTS[index - 1]]
    values = [v for v in _attribute_pool(word, kind) if v not in caption_words]
    if values:  # a seeded rotation: as varied as a shuffle, without a generator per phrase
        turn = salt % len(values)
        values = values[turn:] + values[:turn]
    return values


@functools.lru_cache(maxsize=1 << 12)
def _attribute_pool(word: str, kind: str) -> tuple[str, ...]:
    """The values an attribute word may change to, before the caption's own words are
    taken out: another color (not a synonym of it) or material."""
    pool = {"color": lx.COLORS, "material": lx.MATERIALS}.get(kind, ())
    synonyms = lx.COLOR_SYNONYMS.get(word, frozenset())
    return tuple(v for v in pool if v != word and v not in synonyms
                 and word not in lx.COLOR_SYNONYMS.get(v, frozenset()))


# What `foil_rejection` reads of a text: its normal form, its words, their stems (without
# articles and "is"/"are"), as `normalize_text`, `.split()` and `units._stems` give them.
_Reading = tuple[str, tuple[str, ...], tuple[str, ...]]


@functools.lru_cache(maxsize=1 << 15)
def _read_piece(text: str) -> _Reading:
    norm = normalize_text(text)
    words = tuple(norm.split())
    return norm, words, tuple(stem_word(w) for w in words if w not in _UNSTEMMED)


def _join_readings(first: _Reading, second: _Reading) -> _Reading:
    """The reading of two texts joined by a space, from theirs. Exact: a word never spans a
    space, so the normal form of the joined text is the two normal forms joined (an empty
    one left out), and its words and stems are theirs in order (an empty normal form has no
    words and no stems)."""
    if not first[0]:
        return second
    if not second[0]:
        return first
    return f"{first[0]} {second[0]}", first[1] + second[1], first[2] + second[2]


def _join_three(first: _Reading, second: _Reading, third: _Reading) -> _Reading:
    """`_join_readings` of three readings, in one step when none is empty (a relation's
    subject, predicate and object never are)."""
    if first[0] and second[0] and third[0]:
        return (f"{first[0]} {second[0]} {third[0]}", first[1] + second[1] + third[1],
                first[2] + second[2] + third[2])
    return _join_readings(_join_readings(first, second), third)


_UNSTEMMED = frozenset({"a", "an", "the", "is", "are"})
_SYNONYM_WORDS = frozenset(SYNONYMS_OF)


def _build_category_nouns() -> dict[str, list[lx.Noun]]:
    by_category: dict[str, list[lx.Noun]] = {}
    for noun in dict.fromkeys(lx.NOUNS.values()):
        if noun.singular not in lx.NOT_FOILS:  # generic nouns are never foils
            by_category.setdefault(noun.category, []).append(noun)
    return by_category


_LAST_WORDS = {noun.singular: (noun.singular.split()[-1], noun.plural.split()[-1])
               for noun in lx.NOUNS.values()}


_CATEGORY_NOUNS = _build_category_nouns()
# Per category, what an object foil reads of each noun: (singular, plural, last word of
# each, whether it carries an age, the readings of singular and plural), the list twice so
# that a walk from any start is one slice.
_CATEGORY_ENTRIES = {
    category: tuple((n.singular, n.plural, *_LAST_WORDS[n.singular],
                     n.singular in lx.AGE_BOUND_NOUNS, _read_piece(n.singular),
                     _read_piece(n.plural)) for n in nouns) * 2
    for category, nouns in _CATEGORY_NOUNS.items()}


class FoilCheck:
    """`foil_rejection` for one caption's foil candidates: the same reason, checked in the
    same order, with the caption and its entity texts normalised once instead of once per
    foil, and unit and foil texts read by their pieces (entity texts, predicates,
    modifiers), whose readings are remembered (see `_join_readings`). The extractor calls it ~10 times a
    caption; the generic `foil_rejection` stays the reference (tests/test_rules.py runs
    both on every candidate of the SugarCrepe captions and wants the same answer)."""

    __slots__ = ("padded_caption", "entity_norms", "_entity_heads")

    def __init__(self, caption: str, entity_texts: Sequence[str]) -> None:
        self.padded_caption = f" {normalize_text(caption)} "
        self.entity_norms = frozenset(map(normalize_text, entity_texts))
        self._entity_heads: frozenset[str] | None = None

    def entity_heads(self) -> frozenset[str]:
        """The last words of the entity texts, made when first asked: only a swap whose
        argument is no entity text asks (the extractor's relations never do)."""
        if self._entity_heads is None:
            self._entity_heads = frozenset(n.split()[-1] for n in self.entity_norms if n)
        return self._entity_heads

    def rejection(self, unit: Unit, foil: Foil) -> RejectReason | None:
        """Why `foil` is no foil of `unit` in this caption, as `foil_rejection` says."""
        return self.candidate_rejection(
            unit.kind, unit.text, _read_piece(unit.text), (unit.subject, unit.object),
            (foil.text, foil.change_type, foil.subject, foil.predicate, foil.object),
            _read_piece(foil.text))

    def candidate_rejection(self, kind: str, unit_text: str, unit_reading: _Reading,
                            unit_arguments: tuple[str | None, str | None],
                            candidate: _Candidate, reading: _Reading) -> RejectReason | None:
        """`rejection` of a unit and a foil given as plain data: the unit's kind, text,
        reading (`_read_piece`) and, for a relation, subject and object; the foil's fields
        and the reading of its text."""
        text, change_type, subject, predicate, object_ = candidate
        stripped = text.strip()
        if not stripped:
            return RejectReason.EMPTY_FOIL
        # is_placeholder(text), whose regex takes ~3,000 instructions, not asked of a text with
        # a space that ends in a letter (every placeholder form with a space in it ends in a
        # digit, "_" or a bracket): of the extractor's foils, only one-word ones are asked,
        # and their few texts are cached. (A relation foil's text is new in nearly every
        # caption, and would only churn the cache.)
        may_be_placeholder = " " not in stripped or not stripped[-1].isalpha()
        if (may_be_placeholder and is_placeholder(stripped)) or (
                subject is not None and is_placeholder(subject)) or (
                predicate is not None and is_placeholder(predicate)) or (
                object_ is not None and is_placeholder(object_)):
            return RejectReason.PLACEHOLDER
        is_entity = kind == "entity"
        # Membership in a tuple of the enum's members: by identity, without hashing an Enum
        # (a Python-level __hash__).
        if (change_type in _ENTITY_CHANGES) is not is_entity:
            return RejectReason.CHANGE_TYPE_MISMATCH
        unit_norm, unit_words, unit_stems = unit_reading
        foil_norm, foil_words, foil_stems = reading
        if foil_norm == unit_norm:
            return RejectReason.FOIL_EQUALS_UNIT
        if kind == "relation" and change_type is _SWAP:
            for argument in unit_arguments:
                argument_norm = normalize_text(argument or "")
                if (argument_norm not in self.entity_norms
                        and argument_norm not in self.entity_heads()):
                    return RejectReason.SWAP_ARGUMENT_NOT_ENTITY
            return None
        # A synonym: some word changed, and every changed word to a synonym of it (so both
        # texts have a word of the synonym sets; most foils do not, and skip the loop).
        if len(unit_words) == len(foil_words) and not _SYNONYM_WORDS.isdisjoint(foil_words) and (
                not _SYNONYM_WORDS.isdisjoint(unit_words)):
            is_synonym = False
            for unit_word, foil_word in zip(unit_words, foil_words):  # noqa: B905 (same length)
                if unit_word != foil_word:
                    if foil_word not in SYNONYMS_OF.get(unit_word, ()):
                        is_synonym = False
                        break
                    is_synonym = True
            if is_synonym:
                return RejectReason.FOIL_IS_SYNONYM
        if unit_stems == foil_stems:
            return RejectReason.FOIL_ONLY_INFLECTION
        # Only new words that are all generic reject; a foil without any generic word (nearly
        # all) cannot have them, and needs no set built.
        if not GENERIC_WORDS.isdisjoint(foil_words):
            new_words = set(foil_words).difference(unit_words)
            if new_words and new_words <= GENERIC_WORDS:
                return RejectReason.FOIL_GENERIC_WORD
        # foil_norm differs from unit_norm here, so "another entity of the caption" is any.
        if (foil_norm and f" {foil_norm} " in self.padded_caption) or (
                is_entity and foil_norm in self.entity_norms):
            return RejectReason.FOIL_IN_CAPTION
        return None

    def valid_foils(self, kind: str, unit_text: str, unit_reading: _Reading,
                    unit_arguments: tuple[str | None, str | None],
                    candidates: Iterable[_Judged], rejections: list[Rejection],
                    max_object_changes: int = 1, limit: int | None = None) -> list[_Judged]:
        """The candidates that pass (with their readings), recording the rejected ones, up to
        `limit`. Object changes beyond `max_object_changes` were back-ups and are skipped."""
        kept: list[_Judged] = []
        object_changes = 0
        is_entity = kind == "entity"
        for judged in candidates:
            if limit is not None and len(kept) == limit:
                break
            candidate, reading = judged
            is_object_change = is_entity and candidate[1] is _OBJECT_CHANGE
            if is_object_change and object_changes >= max_object_changes:
                continue
            if judged in kept:  # equal candidates have equal readings
                continue
            reason = self.candidate_rejection(kind, unit_text, unit_reading, unit_arguments,
                                              candidate, reading)
            if reason is None:
                kept.append(judged)
                object_changes += is_object_change
            else:
                rejections.append(Rejection(
                    reason, f"{kind} {unit_text!r} -> {candidate[0]!r} ({candidate[1]})"))
        return kept


# Every change type is an entity's or a relation's (units.RELATION_CHANGES is the rest).
_ENTITY_CHANGES = tuple(ENTITY_CHANGES)
assert RELATION_CHANGES == frozenset(ChangeType) - ENTITY_CHANGES


def relation_units(parse: Parse, entities: dict[str, Unit],
                    first_foils: dict[str, tuple[str, _Reading]], check: FoilCheck,
                    rejections: list[Rejection]) -> list[Unit]:
    """Relation units over caption entities: antonym, negation, swap (not for symmetric
    predicates, where it would be true) and subject/object replacement foils."""
    units: dict[str, Unit] = {}
    phrases = parse.phrases
    for s, predicate, o in parse.relations:
        subject, obj = phrases[s], phrases[o]
        s_text, o_text = subject.text, obj.text
        if s_text == o_text or s_text not in entities or o_text not in entities:
            continue
        forms = predicate_forms(predicate)
        rendered = forms.plain[subject.is_plural]
        text = f"{s_text} {rendered} {o_text}"  # render_relation's text (see _relation_candidate)
        if text in units:
            continue
        s_reading, o_reading = _read_piece(s_text), _read_piece(o_text)
        candidates = _relation_foil_candidates(subject, s_reading, forms, obj, o_reading,
                                               rendered, first_foils)
        unit_reading = _join_three(s_reading, _read_piece(rendered), o_reading)
        kept = check.valid_foils("relation", text, unit_reading, (s_text, o_text), candidates,
                                 rejections)
        units[text] = _make_unit("relation", text, _make_foils(kept),
                                 s_text, rendered, o_text)
    if len(units) > MAX_RELATIONS:
        rejections.append(Rejection(RejectReason.TOO_MANY_UNITS,
                                    f"{len(units)} relations, kept {MAX_RELATIONS}"))
    return list(units.values())[:MAX_RELATIONS]


def _relation_foil_candidates(subject: Phrase, s_reading: _Reading, forms: PredicateForms,
                              obj: Phrase, o_reading: _Reading, rendered: str,
                              first_foils: dict[str, tuple[str, _Reading]]) -> list[_Judged]:
    s, o = subject.text, obj.text
    candidates = []
    if forms.antonym is not None:
        candidates.append(_relation_candidate(s, s_reading, forms.antonym[subject.is_plural],
                                              o, o_reading, _ANTONYM))
    candidates.append(_relation_candidate(s, s_reading, forms.negated[subject.is_plural],
                                          o, o_reading, _NEGATION))
    if not forms.is_symmetric:
        candidates.append(_relation_candidate(o, o_reading, forms.plain[obj.is_plural],
                                              s, s_reading, _SWAP))
    subject_foil = first_foils.get(s)
    if subject_foil is not None:
        foil_text, foil_reading = subject_foil
        # The new subject may differ in number ("cake" -> "chips"): the verb agrees with it.
        agreeing = forms.plain[_is_plural_text(foil_text, subject.is_plural)]
        candidates.append(_relation_candidate(foil_text, foil_reading, agreeing, o, o_reading,
                                              _SUBJECT_REPLACE))
    object_foil = first_foils.get(o)
    if object_foil is not None:
        foil_text, foil_reading = object_foil
        candidates.append(_relation_candidate(s, s_reading, rendered, foil_text, foil_reading,
                                              _OBJECT_REPLACE))
    return candidates


def _relation_candidate(subject: str, subject_reading: _Reading, predicate: str, object_: str,
                        object_reading: _Reading, change_type: ChangeType) -> _Judged:
    # As `Foil.relation` would build it; its text is made of the three. Entity texts and
    # predicates are words joined by single spaces, never empty, so `render_relation`'s
    # stripping and dropping of empty parts has nothing to do.
    return ((f"{subject} {predicate} {object_}", change_type, subject, predicate, object_),
            _join_three(subject_reading, _read_piece(predicate), object_reading))


@functools.lru_cache(maxsize=1 << 14)
def _is_plural_form(text: str) -> bool | None:
    """Whether an entity text's head noun is plural, by its lexicon form (None when the
    form says nothing, as for "sheep")."""
    words = text.split()
    if "of" in words[1:-1]:
        # "group of roosters is": the collective's number, not its members'.
        collective = words[words.index("of") - 1]
        if collective in lx.COLLECTIVES:
            return collective in lx.PLURAL_COLLECTIVES or collective not in lx.COLLECTIVE_BASES
    for n in range(min(lx.MAX_NOUN_WORDS, len(words)), 0, -1):
        noun = lx.NOUNS.get(" ".join(words[-n:]))
        if noun is not None and noun.singular != noun.plural:
            return " ".join(words[-n:]) == noun.plural
    return None


def _is_plural_text(text: str, default: bool) -> bool:
    """Whether an entity text's head noun is plural, by its lexicon form (`default` when
    the form says nothing, as for "sheep")."""
    is_plural = _is_plural_form(text)
    return default if is_plural is None else is_plural

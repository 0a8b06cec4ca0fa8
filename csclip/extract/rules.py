"""The rules backend: entity and relation units with foils from caption
English, by lexicon lookup and a few patterns, on CPU, with no model.

It only claims what its lexicon covers. An object noun it does not know, a verb it does not
know, or a connecting phrase it cannot read gives a `Rejection` with the reason instead of
a guess. What the caption says is absent ("no passengers", "without a kite") is never a
unit: it is cut out before reading and kept in `RulesResult.absent`. Same caption, same
output: foil choices are seeded from a hash of the caption.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import NamedTuple

from csclip.errors import DataError
from csclip.extract import lexicon as lx
from csclip.units import (
    _SYNONYMS_OF,
    ENTITY_CHANGES,
    GENERIC_WORDS,
    MAX_ENTITIES,
    MAX_RELATIONS,
    RELATION_CHANGES,
    ChangeType,
    Foil,
    Rejection,
    RejectReason,
    Unit,
    UnitsRecord,
    _stem,
    is_placeholder,
    normalize_text,
)

# Words, with inner hyphens/apostrophes kept ("close-up", "elephant's"), and the
# punctuation that separates phrases and sentences.
_TOKEN = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*|[.,;:!?]")
_SENTENCE_END = frozenset(".;:!?")
_COORDINATORS = frozenset({",", "and", "or", "plus", "also"})
# Words after which the next noun phrase starts a new clause ("... while a girl plays").
_CLAUSE_OPENERS = frozenset({"while", "whilst", "as", "and", "but", "when", "where", ",",
                             "because", "so"})
_REL_PRONOUNS = frozenset({"that", "which", "who"})
_SUBORDINATORS = frozenset({"while", "whilst", "and", ","})
_PRONOUNS = frozenset({"it", "them"})
# "to its left" style phrases: the relation points back at the phrase before.
_POSSESSIVE_DIRECTIONS = {("to", "its", "left"): "left of", ("to", "its", "right"): "right of",
                          ("on", "its", "left"): "left of", ("on", "its", "right"): "right of"}
# One spelling per spatial relation, so "to the left of" and "left of" give one predicate.
_CANONICAL_PREPOSITION = {"to the left of": "left of", "to the right of": "right of",
                          "inside of": "inside", "outside of": "outside",
                          "towards": "toward", "underneath": "under", "beneath": "under"}
_MAX_ENTITY_FOILS = 3
# The record's meta key for what the caption says is absent: a JSON list of entity texts.
ABSENT_META_KEY = "absent"
# Prepositions that say nothing spatial on their own ("holding a slice to her face").
_NEEDS_VERB = frozenset({"to", "for", "from", "up", "down", "off", "of"})


@dataclass(frozen=True)
class RulesResult:
    """What the rules backend read from one caption.

    `rejections` lists everything it did not turn into a unit or foil (an unknown noun, an
    unreadable connecting phrase, a foil that failed `foil_rejection`), each with a reason.
    A caption is usable when `entities` is non-empty; otherwise `rejections` says why not.
    """

    entities: tuple[Unit, ...]
    relations: tuple[Unit, ...]
    rejections: tuple[Rejection, ...]
    # What the caption says is not there ("no passengers", "without a kite", "shirtless"):
    # never an entity or a relation argument; kept so a sampler can use it as a true negative.
    absent: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        """Whether the caption gave no unit at all (the record goes to the rejects table)."""
        return not self.entities


@dataclass(slots=True)
class _Phrase:
    """A noun phrase: token span [start, end) of the entity text (determiners excluded),
    its head noun and the attribute words with their kinds."""

    start: int
    end: int
    lead: int  # first token of the phrase including its determiners
    words: tuple[str, ...]
    head_start: int  # index in `words` where the head noun begins
    head: lx.Noun
    attributes: tuple[tuple[int, str], ...]  # (index in words, kind)
    is_plural: bool
    # " ".join(words), made once: read ~30 times a caption, and `words` never changes.
    text: str


class _Predicate(NamedTuple):
    """A relation predicate as read from the caption: an optional verb ("riding", "filled",
    "has") and an optional preposition ("on", "left of"). A tuple: it keys the caches of
    its renderings, and a tuple hashes in C."""

    verb: str | None
    preposition: str | None

    def render(self, is_plural: bool, negated: bool = False) -> str:
        forms = _predicate_forms(self)
        return (forms.negated if negated else forms.plain)[is_plural]

    def _render(self, is_plural: bool, negated: bool) -> str:
        if self.verb in ("has", "have"):
            # Possession ("a man with a hat" -> "man has hat") has no auxiliary.
            if negated:
                return "do not have" if is_plural else "does not have"
            return "have" if is_plural else "has"
        words = ["are" if is_plural else "is"]
        if negated:
            words.append("not")
        words += [w for w in (self.verb, self.preposition) if w]
        return " ".join(words)

    def antonym(self) -> _Predicate | None:
        if self.preposition and lx.PREPOSITION_ANTONYMS.get(self.preposition):
            opposite = lx.PREPOSITION_ANTONYMS[self.preposition]
            return _Predicate(self.verb, _CANONICAL_PREPOSITION.get(opposite, opposite))
        if self.verb in lx.VERB_ANTONYMS:
            return _Predicate(lx.VERB_ANTONYMS[self.verb], self.preposition)
        return None

    @property
    def is_symmetric(self) -> bool:
        return self.preposition in lx.SYMMETRIC_PREPOSITIONS


class _PredicateForms(NamedTuple):
    """A predicate's renderings, each a (singular subject, plural subject) pair."""

    plain: tuple[str, str]
    negated: tuple[str, str]
    antonym: tuple[str, str] | None  # None: the predicate has no antonym
    is_symmetric: bool


@functools.lru_cache(maxsize=1 << 14)
def _predicate_forms(predicate: _Predicate) -> _PredicateForms:
    # A few hundred predicates, each rendered ~5 times a relation (unit and foils).
    antonym = predicate.antonym()
    return _PredicateForms(
        (predicate._render(False, False), predicate._render(True, False)),
        (predicate._render(False, True), predicate._render(True, True)),
        None if antonym is None else (antonym._render(False, False),
                                      antonym._render(True, False)),
        predicate.is_symmetric)


@dataclass
class _Connector:
    """The words between two noun phrases, read as a predicate."""

    predicate: _Predicate
    is_relative: bool = False  # "that is ...": attaches to the phrase just before
    aux_plural: bool | None = None  # number the caption's own auxiliary gives the subject
    is_bare_with: bool = False
    needs_verb: bool = False  # "from a bottle": only as part of the verb before it
    is_passive: bool = False  # "pulled by a horse": the next phrase is the subject


@dataclass
class _Parse:
    phrases: list[_Phrase] = field(default_factory=list)
    relations: list[tuple[int, _Predicate, int]] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


# ------------------------------------------------------------------------------------------
# Public API
# ------------------------------------------------------------------------------------------

def extract_units(caption: str) -> RulesResult:
    """Entity and relation units, with validated foils, of one caption.

    Entity texts are noun phrases without determiners ("brown horse", "three dogs");
    relation predicates keep their auxiliary ("is riding", "is left of"), and their subject
    and object are entity texts of the caption. Every foil passed `foil_rejection`.
    """
    if not caption or not caption.strip():
        return RulesResult((), (), (Rejection(RejectReason.EMPTY_CAPTION, "caption is empty"),))
    tokens, absent = _cut_absent(tokenize(caption))
    parse = _parse(tokens)
    if not parse.phrases:
        reason = "no known object noun" + _unknown_hint(tokens)
        return RulesResult((), (), (*parse.rejections, Rejection(RejectReason.UNPARSED, reason)),
                           absent)
    rng_seed = _stable_seed(normalize_text(caption))
    rejections = list(parse.rejections)
    entities, first_foils, check = _entity_units(parse.phrases, caption, tokens, rng_seed,
                                                 rejections)
    relations = _relation_units(parse, entities, first_foils, check, rejections)
    return RulesResult(tuple(entities.values()), tuple(relations), tuple(rejections), absent)


def extract_record(record: UnitsRecord) -> tuple[UnitsRecord, tuple[Rejection, ...]]:
    """A copy of `record` whose units are the rules backend's reading of its caption
    (`source="rules"`, image and meta kept), and the rejections of that reading."""
    result = extract_units(record.caption)
    meta = dict(record.meta)
    if result.absent:
        meta[ABSENT_META_KEY] = json.dumps(list(result.absent))
    return replace(record, entities=result.entities, relations=result.relations,
                   source="rules", meta=meta), result.rejections


def tokenize(caption: str) -> list[str]:
    """Lower-case word and punctuation tokens of a caption."""
    return _TOKEN.findall(caption.lower())


# ------------------------------------------------------------------------------------------
# Absence: "no X", "without X", "missing (its) X", "not ... any X", "X-less"
# ------------------------------------------------------------------------------------------

def _cut_absent(tokens: list[str]) -> tuple[list[str], tuple[str, ...]]:
    """`tokens` with what the caption says is absent cut out (with the word that says so),
    and the absent noun phrases' texts.

    The rest is then read as if the absent things had never been written: "a young girl
    without a green jacket eating pizza" is "a young girl eating pizza", "a bathroom with no
    toilets and a red bucket" is "a bathroom with a red bucket".
    """
    # Most captions have no "-less" word and no negation: C-level set tests say so first.
    absent: list[str] = [] if lx.LESS_ADJECTIVES.keys().isdisjoint(tokens) else [
        lx.LESS_ADJECTIVES[t] for t in tokens if t in lx.LESS_ADJECTIVES]
    if _NEGATION_CUES.isdisjoint(tokens) and not (
            "n't" in " ".join(tokens) and any(t.endswith("n't") for t in tokens)):
        return tokens, tuple(dict.fromkeys(absent))
    cut: set[int] = set()
    for i, word in enumerate(tokens):
        if i in cut:
            continue
        span = None
        if word == "no":
            span = _cut_after_no(tokens, i, absent)
        elif word == "without":
            span = _cut_after_without(tokens, i, absent)
        elif word == "missing":
            span = _cut_missing(tokens, i, absent)
        elif word in _NOT_WORDS or word.endswith("n't"):
            span = _cut_not_any(tokens, i, absent)
        if span is not None:
            cut.update(range(*span))
    if not cut:
        return tokens, tuple(dict.fromkeys(absent))
    return [t for i, t in enumerate(tokens) if i not in cut], tuple(dict.fromkeys(absent))


def _absent_phrase(tokens: list[str], i: int) -> _Phrase | None:
    phrase, _, _ = _match_phrase(tokens, i)
    return phrase


def _absent_span(tokens: list[str], i: int, absent: list[str]) -> int | None:
    """Record the noun phrase at i (after its determiners) as absent and return where it
    ends, or None when no noun phrase starts there. A phrase the lexicon cannot read
    ("euro money sign", "older style furnishings") runs to the next known noun phrase or
    to its last unknown word; a noun followed by a participle and another phrase ("a wall
    mounted sink") is that phrase's modifier."""
    j = i
    while j < len(tokens) and tokens[j] in lx.DETERMINERS:
        j += 1
    k = j
    while k < len(tokens) and k - j < 4:
        phrase = _absent_phrase(tokens, k)
        if phrase is not None and phrase.start == k or (
                phrase is not None and k == j and phrase.lead == k):
            end = phrase.end
            if end + 1 < len(tokens) and (tokens[end] in lx.PARTICIPLES or (
                    tokens[end].endswith("ed") and _is_unknown_word(tokens[end]))):
                following = _absent_phrase(tokens, end + 1)
                if following is not None and following.lead == end + 1:
                    absent.append(" ".join(tokens[phrase.start : following.end]))
                    return following.end
                last = end + 1
                while last < len(tokens) and _is_unknown_word(tokens[last]):
                    last += 1
                if last > end + 1:  # "orange decorated wallpaper": an unknown head
                    absent.append(" ".join(tokens[phrase.start : last]))
                    return last
            return _record_absent(phrase, absent)
        if not (_is_unknown_word(tokens[k]) or tokens[k] in lx.OTHER_ADJECTIVES
                or tokens[k] in lx.ATTRIBUTE_KIND or tokens[k].endswith(("ed", "ing"))):
            break
        k += 1
    if k > j and _is_unknown_word(tokens[k - 1]):
        absent.append(" ".join(tokens[j:k]))  # "face piercings": an unknown noun
        return k
    return None


def _coordinated_absent(tokens: list[str], end: int, absent: list[str],
                        own_determiner_stops: bool) -> int:
    """Extend an absent phrase ending at `end` over the phrases coordinated with it ("no
    bicycles, skates or skateboards"). After "no", a conjunct with its own determiner is
    not negated ("no toilets and a red bucket"); after "without", every conjunct is."""
    while end < len(tokens) and tokens[end] in (",", "and", "or"):
        j = end
        while j < len(tokens) and tokens[j] in (",", "and", "or"):
            j += 1
        if j >= len(tokens) or (own_determiner_stops and tokens[j] in lx.DETERMINERS):
            break
        before = len(absent)
        span_end = _absent_span(tokens, j, absent)
        if span_end is None and j < len(tokens) and tokens[j].isalpha() and (
                tokens[j] not in _FUNCTION_WORDS and tokens[j] not in _PREPOSITION_WORDS):
            # "skates" reads as a verb, but between commas after "no" it is a noun.
            absent.append(tokens[j])
            span_end = j + 1
        if span_end is None:
            break
        end = span_end
        if len(absent) > before and absent[-1] != " ".join(tokens[j:end]).strip() and (
                end < len(tokens) and tokens[end] in lx.SIGN_NOUNS):
            break  # a sign's name: the sign itself is there
    return end


def _record_absent(phrase: _Phrase, absent: list[str]) -> int:
    """Record `phrase` as absent and return where the cut ends: a sign named by what it
    forbids ("a no bicycles sign") is itself there, so only its modifiers are absent."""
    if phrase.head.singular in lx.SIGN_NOUNS and phrase.head_start > 0:
        absent.append(" ".join(phrase.words[: phrase.head_start]))
        return phrase.start + phrase.head_start
    absent.append(phrase.text)
    return phrase.end


def _cut_after_no(tokens: list[str], i: int, absent: list[str]) -> tuple[int, int] | None:
    if i + 1 >= len(tokens) or tokens[i + 1] in ("one", "longer", "doubt"):
        return None
    phrase = _absent_phrase(tokens, i + 1)
    if phrase is None or phrase.lead != i + 1:
        return None  # "no parking sign": the sign is there
    end = _coordinated_absent(tokens, _record_absent(phrase, absent), absent, True)
    start = i
    before = tokens[i - 1] if i else ""
    if before in ("and", ",") or _verb_ing(before) or before in ("has", "have", "had"):
        start = i - 1  # "paddles and no passengers", "wearing no shoes"
    elif before == "with":
        following = tokens[end + 1] if end + 1 < len(tokens) else ""
        if end < len(tokens) and tokens[end] in ("and", ",") and (
                following in lx.DETERMINERS or _absent_phrase(tokens, end + 1) is not None):
            end += 1  # "with no toilets and a red bucket": the bucket is with it
        else:
            start = i - 1
    return start, end


def _cut_after_without(tokens: list[str], i: int, absent: list[str]) -> tuple[int, int] | None:
    if i >= 2 and tokens[i - 1] == "and" and tokens[i - 2] == "with":
        return None  # "plates, with and without food": there is food
    phrase = _absent_phrase(tokens, i + 1)
    if phrase is not None and any(w in lx.QUANTITY_PREFIXES or w == "much"
                                  for w in tokens[i + 1 : phrase.start]):
        return i, phrase.end  # "without a lot of broth": some broth, so neither
    end = _absent_span(tokens, i + 1, absent)
    if end is None:
        return i, i + 1
    return i, _coordinated_absent(tokens, end, absent, False)


def _cut_missing(tokens: list[str], i: int, absent: list[str]) -> tuple[int, int] | None:
    phrase = _absent_phrase(tokens, i + 1) if i + 1 < len(tokens) else None
    if phrase is not None and phrase.lead == i + 1:
        return i, _record_absent(phrase, absent)  # "missing its tail"
    for start in range(max(0, i - 6), i):  # "a pizza with a slice missing"
        phrase = _absent_phrase(tokens, start)
        if phrase is not None and phrase.end == i and phrase.lead == start:
            _record_absent(phrase, absent)
            return (start - 1 if start and tokens[start - 1] == "with" else start), i + 1
    return None


def _cut_not_any(tokens: list[str], i: int, absent: list[str]) -> tuple[int, int] | None:
    for j in range(i + 1, min(i + 5, len(tokens))):
        if tokens[j] in _SENTENCE_END or tokens[j] == ",":
            return None
        if tokens[j] == "any":
            end = _absent_span(tokens, j, absent)
            if end is None:
                return None
            return i, _coordinated_absent(tokens, end, absent, False)
    return None


_NOT_WORDS = frozenset({"not", "never", "doesnt", "dont", "isnt", "arent", "hasnt", "havent"})
_NEGATION_CUES = frozenset({"no", "without", "missing"}) | _NOT_WORDS


# ------------------------------------------------------------------------------------------
# Noun phrases
# ------------------------------------------------------------------------------------------

def _parse(tokens: list[str]) -> _Parse:
    parse = _Parse()
    spans = _find_phrases(tokens, parse.rejections)
    parse.phrases = spans
    if spans:
        _check_leftover(_skip_frames(tokens[: spans[0].lead]), None, parse.rejections,
                        leading=True)
        _read_relations(tokens, parse)
    return parse


def _find_phrases(tokens: list[str], rejections: list[Rejection]) -> list[_Phrase]:
    phrases: list[_Phrase] = []
    i = 0
    has_frames = not _FRAME_CUES.isdisjoint(tokens)
    while i < len(tokens):
        skip = _frame_length(tokens, i) if has_frames else 0
        if skip:
            i += skip
            continue
        if tokens[i] not in _PHRASE_STARTS or _is_not_an_entity(tokens, i):
            i += 1  # most tokens (verbs, prepositions) cannot start a noun phrase
            continue
        phrase, next_i, rejected = _match_phrase(tokens, i)
        if rejected:
            rejections.append(Rejection(RejectReason.UNPARSED, rejected))
        if phrase is not None:
            if phrase.head.category == "sport" and len(phrase.words) == 1 + phrase.head_start:
                # "playing soccer", "the baseball game": an activity, not a thing in view.
                i = max(next_i, i + 1)
                continue
            phrases.append(phrase)
        i = max(next_i, i + 1)
    return phrases


def _is_not_an_entity(tokens: list[str], i: int) -> bool:
    """Nouns that name no thing in view: "in the back of" (a preposition), "can be seen"
    (a verb), "to take a picture" (an act)."""
    while i + 1 < len(tokens) and tokens[i] in lx.DETERMINERS:
        i += 1  # the phrase's noun, after its determiners
    word = tokens[i]
    if word in lx.PREPOSITION_NOUNS and 2 <= i and tokens[i - 1] == "the" and (
            i + 1 < len(tokens) and tokens[i + 1] == "of"):
        return f"{tokens[i - 2]} the {word} of" in lx.PREPOSITION_ANTONYMS
    if word == "can" and i + 1 < len(tokens) and tokens[i + 1] in ("be", "see", "not"):
        return True
    if word in lx.FRAME_WORDS and i >= 2 and tokens[i - 1] in ("a", "the") and tokens[i - 2] in (
            "take", "taking", "takes", "for"):
        return True
    return False


def _is_inner_modifier(tokens: list[str], j: int) -> bool:
    """Whether token j, after a determiner or an attribute, is a modifier of the noun right
    after it: an unknown word, a possessive of a known noun ("man's"), or an -ing / -ed
    word that is not a verb of the lexicon."""
    if j + 1 >= len(tokens) or _noun_at(tokens, j + 1) is None:
        return False
    word = tokens[j]
    if word.endswith("'s"):
        return word[:-2] in lx.NOUNS
    if not word.isalpha() or word in _FUNCTION_WORDS or word in _PREPOSITION_WORDS:
        return False
    return word not in lx.NOUNS and _verb_ing(word) is None and word not in lx.PARTICIPLES


def _skip_frames(tokens: list[str]) -> list[str]:
    """`tokens` without framing phrases ("a close up of")."""
    if _FRAME_CUES.isdisjoint(tokens):
        return tokens
    kept, i = [], 0
    while i < len(tokens):
        skip = _frame_length(tokens, i)
        if skip:
            i += skip
        else:
            kept.append(tokens[i])
            i += 1
    return kept


def _frame_length(tokens: list[str], i: int) -> int:
    """Tokens of a framing phrase at i ("a close up of", "an image of"), else 0."""
    if tokens[i] not in _FRAME_STARTS:
        return 0  # most tokens: no frame can start here
    j = i
    while j < len(tokens) and tokens[j] in ("a", "an", "the"):
        j += 1
    # "a black and white photo of": the photo's own adjectives belong to the frame.
    k = j
    while k < len(tokens) and (tokens[k] in lx.ATTRIBUTE_KIND or tokens[k] == "and"
                               or tokens[k] in lx.OTHER_ADJECTIVES):
        k += 1
    if k > j and k + 1 < len(tokens) and tokens[k] in lx.FRAME_WORDS and tokens[k + 1] == "of":
        return k + 2 - i
    for words in _FRAME_PHRASE_WORDS:
        if tokens[j : j + len(words)] == words:
            return j + len(words) - i
    if j + 1 < len(tokens) and tokens[j] in lx.FRAME_WORDS and tokens[j + 1] == "of":
        return j + 2 - i
    return 0


def _noun_at(tokens: list[str], i: int) -> tuple[str, lx.Noun] | None:
    """The longest lexicon noun starting at token i."""
    if tokens[i] not in _MULTIWORD_NOUN_STARTS:
        noun = lx.NOUNS.get(tokens[i])
        return (tokens[i], noun) if noun is not None else None
    for n in range(min(lx.MAX_NOUN_WORDS, len(tokens) - i), 0, -1):
        form = " ".join(tokens[i : i + n])
        if form in lx.NOUNS:
            return form, lx.NOUNS[form]
    return None


# A frame needs one of these words ("photo", "close", "view", ...).
_FRAME_PHRASE_WORDS = tuple(p.split() for p in lx.FRAME_PHRASES)
_FRAME_CUES = lx.FRAME_WORDS | frozenset(w for p in lx.FRAME_PHRASES for w in p.split()
                                         if w not in ("of", "with", "up"))
_MULTIWORD_NOUN_STARTS = frozenset(form.split()[0] for form in lx.NOUNS if " " in form)
_FRAME_STARTS = (frozenset({"a", "an", "the", "and"}) | frozenset(lx.ATTRIBUTE_KIND)
                 | lx.OTHER_ADJECTIVES | lx.FRAME_WORDS
                 | frozenset(p.split()[0] for p in lx.FRAME_PHRASES))


# The words `_match_phrase` can find a phrase at: anything else gives (None, i + 1, None).
_PHRASE_STARTS = (lx.DETERMINERS | lx.INTENSIFIERS | frozenset(lx.QUANTITY_PREFIXES)
                  | frozenset(lx.COLLECTIVES) | frozenset(lx.ATTRIBUTE_KIND)
                  | lx.OTHER_ADJECTIVES | frozenset(lx.NOUNS) | _MULTIWORD_NOUN_STARTS)


def _match_phrase(tokens: list[str], i: int) -> tuple[_Phrase | None, int, str | None]:
    """The noun phrase starting at token i (after determiners), the index after it, and a
    rejection detail when a phrase was seen but cannot be read."""
    j = i
    while j < len(tokens) and tokens[j] in lx.DETERMINERS:
        j += 1
    while j < len(tokens) and tokens[j] in lx.INTENSIFIERS:
        j += 1
    is_counted = False
    collective: str | None = None
    if j + 1 < len(tokens) and tokens[j] in lx.QUANTITY_PREFIXES and tokens[j + 1] == "of":
        j, is_counted = j + 2, True  # "a lot of girls" is "girls"
        while j < len(tokens) and tokens[j] in lx.DETERMINERS:
            j += 1
    start = j
    attributes: list[tuple[int, str]] = []
    head: tuple[int, str, lx.Noun] | None = None  # (token index, form, noun)
    while j < len(tokens):
        word = tokens[j]
        noun = _noun_at(tokens, j)
        if head is not None:
            # After a noun only more nouns may follow ("park bench", "baby elephant").
            if noun is None or _reads_as_verb(tokens, j, noun[0]):
                break
            head = (j, *noun)
            j += len(noun[0].split())
            continue
        if word in lx.COLLECTIVES and j + 1 < len(tokens) and tokens[j + 1] == "of":
            collective = word
            j += 2
            continue
        is_modifier = word in lx.ATTRIBUTE_KIND or word in lx.OTHER_ADJECTIVES
        if is_modifier and (noun is None or (" " not in noun[0]
                                             and _starts_phrase_body(tokens, j + 1))):
            # "orange cat": a color here, not the fruit; but "hot dog" is a noun.
            # "orange cat": a color here, not the fruit.
            kind = lx.ATTRIBUTE_KIND.get(word)
            if kind is not None:
                attributes.append((j - start, kind))
            is_counted |= kind == "count" or word in lx.QUANTITIES
            j += 1
            if (j + 1 < len(tokens) and tokens[j] == "and" and kind == "color"
                    and lx.ATTRIBUTE_KIND.get(tokens[j + 1]) == "color"):
                j += 1  # "white and yellow vase"
            continue
        if noun is None and j > i and _is_inner_modifier(tokens, j):
            # "a wedding cake", "an old rusty blender", "the man's lap": a modifier the
            # lexicon does not know, kept in the text (it gets no foil).
            j += 1
            continue
        if noun is not None:
            if (j == i and i > 0 and tokens[i - 1] in lx.NOUNS
                    and tokens[i - 1] not in _OPENS_PHRASE
                    and _reads_as_verb(tokens, j, noun[0])):
                break  # "a sheep with short hair stands under a fence": a verb
            head = (j, *noun)
            j += len(noun[0].split())
            continue
        break
    if head is None:
        return None, i + 1, None
    head_index, form, noun = head
    end = head_index + len(form.split())
    words = tuple(tokens[start:end])
    follower = tokens[end] if end < len(tokens) else ""
    after = tokens[end + 1] if end + 1 < len(tokens) else ""
    # A base verb after a singular noun is a compound head ("toilet brush"), unless the noun
    # is the second of two subjects ("a man and woman sit").
    is_singular = (form == noun.singular and noun.singular != noun.plural
                   and (i == 0 or tokens[i - 1] not in ("and", ",")))
    if _is_unknown_noun(follower, after) or (is_singular and _is_bare_verb_noun(follower)):
        # "toilet seat", "living area": the real head is a noun we do not know.
        return None, end + 1, f"head noun of {' '.join(words + (follower,))!r} not in lexicon"
    if collective is not None:
        # "a plate of noodles" is one plate, "a couple of dogs" two dogs.
        is_plural = collective in lx.PLURAL_COLLECTIVES or collective not in lx.COLLECTIVE_BASES
    elif noun.plural == noun.singular:
        is_plural = is_counted  # "two sheep"
    else:
        is_plural = form == noun.plural
    if attributes:
        attributes = [(k, kind) for k, kind in attributes if k < head_index - start]
    return (_Phrase(start, end, i, words, head_index - start, noun, tuple(attributes),
                    is_plural, " ".join(words)), end, None)


def _starts_phrase_body(tokens: list[str], i: int) -> bool:
    """Whether a modifier or noun can follow at i (so the word before is a modifier)."""
    if i >= len(tokens):
        return False
    word = tokens[i]
    return (_noun_at(tokens, i) is not None or word in lx.ATTRIBUTE_KIND
            or word in lx.OTHER_ADJECTIVES or word == "and")


def _reads_as_verb(tokens: list[str], i: int, form: str) -> bool:
    """A plural noun after a noun that is also a verb form ("a man skateboards down"),
    followed by a preposition or determiner, is the verb."""
    if _verb_ing(form) is None or " " in form:
        return False
    after = tokens[i + 1] if i + 1 < len(tokens) else ""
    return after in lx.DETERMINERS or after in _PREPOSITION_WORDS


_FUNCTION_WORDS = (
    lx.DETERMINERS | lx.AUXILIARIES | lx.RELATIVE_WORDS | lx.SKIPPABLE_ADVERBS
    | lx.INTENSIFIERS | lx.QUANTITIES | lx.OTHER_ADJECTIVES | lx.PARTICIPLES | _CLAUSE_OPENERS
    | _PRONOUNS | frozenset({"of", "not", "its", "there", "here", "has", "have", "had",
                             "plus", "also", "their", "his", "her", "one", "each", "other",
                             "about", "like", "than", "what", "how", "only", "too", "during",
                             "until", "since", "per", "via", "despite", "except", "if", "or",
                             "nor", "yet", "such", "then", "him", "them", "they", "he", "she",
                             "we", "you", "i", "me", "us", "himself", "herself", "themselves",
                             "itself", "someone", "something", "everyone", "anyone"})
)
_PREPOSITION_WORDS = frozenset(w for p in lx.PREPOSITIONS for w in p.split())
# Words after which a noun starts a phrase even when it could be a verb ("with paddles").
_OPENS_PHRASE = lx.DETERMINERS | _PREPOSITION_WORDS | frozenset({",", "and", "or", "of"})


def _is_bare_verb_noun(word: str) -> bool:
    """A verb's base form right after a singular noun cannot be its verb ("a cat brush"
    is not a cat brushing): it is the head of a compound ("toilet brush")."""
    return word in lx.VERB_ING and word not in lx.NOUNS and word not in lx.PARTICIPLES


def _is_unknown_noun(word: str, after: str) -> bool:
    """Whether `word`, right after a noun, is likely the real (unknown) head noun: an
    unknown word that does not look like a verb form ("swats at" is a verb, "seat" and
    "dwellers walk" are nouns)."""
    if not word or not word.isalpha() or word in _FUNCTION_WORDS or word in _PREPOSITION_WORDS:
        return False
    if word in lx.NOUNS or word in lx.ATTRIBUTE_KIND or _verb_ing(word) is not None:
        return False
    if word.endswith(("ing", "ed")):
        return False
    if word.endswith("s") and not word.endswith("ss"):
        # A verb in the third person is followed by its object or a preposition.
        return not (not after or not after.isalpha() or after in lx.DETERMINERS
                    or after in _PREPOSITION_WORDS or after in _COORDINATORS
                    or after in lx.SKIPPABLE_ADVERBS)
    return True


# ------------------------------------------------------------------------------------------
# Relations between noun phrases
# ------------------------------------------------------------------------------------------

def _read_relations(tokens: list[str], parse: _Parse) -> None:
    """Walk the gaps between consecutive noun phrases, reading each as a predicate, a
    coordination ("and"), a sentence break, or nothing (with a rejection).

    A predicate attaches to the clause's subject (the first phrase of the sentence), or to
    the phrase just before it after "that"/"which"/"who" or after a "with" object. When the
    subject cannot be read (unknown words before the first phrase, or an unreadable gap),
    later predicates are dropped rather than pinned on the wrong phrase.
    """
    reader = _RelationReader(tokens, parse)
    phrases = parse.phrases
    for i in range(len(phrases)):
        gap_end = phrases[i + 1].lead if i + 1 < len(phrases) else len(tokens)
        gap = _read_pronoun_relation(tokens[phrases[i].end : gap_end], i, parse)
        if i + 1 == len(phrases):
            _check_leftover(gap, phrases[i].text, parse.rejections)
        elif not _SENTENCE_END.isdisjoint(gap) or _is_existential(gap):
            reader.clause_subjects, reader.last = [i + 1], None
        elif gap and _COORDINATORS.issuperset(gap):
            reader.coordinate(i)
        else:
            reader.connect(i, gap)


@dataclass
class _RelationReader:
    """The state of `_read_relations` while it walks a caption."""

    tokens: list[str]
    parse: _Parse
    clause_subjects: list[int] = field(default_factory=list)
    # The last relation read, as (subjects, predicate); its object is the current phrase.
    last: tuple[list[int], _Predicate] | None = None
    # After "a kitchen with a teapot on the stove": the kitchen, which also has what comes
    # next in the list ("and books on a shelf").
    with_holders: list[int] | None = None

    def __post_init__(self) -> None:
        has_preamble = _has_preamble(self.tokens[: self.parse.phrases[0].lead])
        self.clause_subjects = [] if has_preamble else [0]

    def coordinate(self, i: int) -> None:
        """Phrase i+1 follows phrase i after "and" / ",": it shares phrase i's role."""
        nxt = i + 1
        phrases = self.parse.phrases
        if self.with_holders and _preposition_follows(self.tokens, phrases[nxt].end):
            has = _Predicate("has", None)
            for h in self.with_holders:
                self.parse.relations.append((h, has, nxt))
            self.last = (list(self.with_holders), has)
            return
        starts_clause = (_starts_clause(self.tokens, phrases, nxt) or (
            # "a girl in a blue apron and a girl in a red apron": a person after an object
            # that is not one starts a new subject, it is not worn.
            _is_person(phrases[nxt]) and not _is_person(phrases[i]))) and (
            # "a man in a white shirt and a red hat catches ...": the hat does not catch.
            phrases[nxt].head.category not in _WORN)
        if (self.last is not None or i not in self.clause_subjects) and starts_clause:
            self.clause_subjects, self.last = [nxt], None
        elif self.last is not None:
            for s in self.last[0]:
                self.parse.relations.append((s, self.last[1], nxt))
        elif i in self.clause_subjects:
            self.clause_subjects.append(nxt)

    def connect(self, i: int, gap: list[str]) -> None:
        """Read the gap between phrases i and i+1 as a predicate and attach it."""
        phrases, nxt = self.parse.phrases, i + 1
        self.with_holders = None
        connector, problem = _read_connector(gap)
        if connector is None:
            self._reject(f"no relation between {phrases[i].text!r} and "
                         f"{phrases[nxt].text!r}: {problem}")
            self.last, self.clause_subjects = None, []
            if gap and gap[-1] in _CLAUSE_OPENERS:
                self.clause_subjects = [nxt]
            elif gap and gap[-1] == "with":
                # "... with toothbrushes in their mouths": what follows describes the object.
                self.last = ([], _Predicate("has", None))
            return
        if connector.needs_verb:
            if self.last is None or self.last[1].verb in (None, "has") or not self.last[0]:
                self._reject(f"no relation between {phrases[i].text!r} and "
                             f"{phrases[nxt].text!r}: preposition "
                             f"{connector.predicate.preposition!r} without a verb")
                self.last, self.clause_subjects = None, []
                return
            connector = replace(connector, predicate=_Predicate(
                self.last[1].verb, connector.predicate.preposition), needs_verb=False)
            subjects = list(self.last[0])
        else:
            subjects = self._subjects(i, connector, gap)
        if subjects is None:
            return
        if connector.is_bare_with and (i not in subjects or _pronoun_relation_follows(
                self.tokens, phrases, nxt) or _describes_scenery(self.tokens, phrases[nxt].end)):
            # "a field with logs" after "zebra playing on": whose logs is unclear, so no
            # relation; "a blue square, with a red circle to its left": the pronoun says it.
            holders: list[int] = []
            if i in subjects and _on_pronoun_follows(self.tokens, phrases, nxt):
                holders = [i]  # "a table with dishes on it": the table has them too
            elif (i not in subjects and subjects and phrases[nxt].head.category in _HANDHELD
                  and all(_is_agent(phrases[s]) for s in subjects)
                  and not _describes_scenery(self.tokens, phrases[nxt].end)):
                holders = list(subjects)  # "a woman standing on a court with a racquet"
            for s in holders:
                self.parse.relations.append((s, connector.predicate, nxt))
            self.last = (holders, connector.predicate)
            return
        prev = self.last
        if (prev is not None and connector.predicate.verb is None and prev[1].verb not in (
                None, "has") and prev[1].preposition is None
                and connector.predicate.preposition in _PATH_PREPOSITIONS
                and list(subjects) == list(prev[0])):
            # "riding a horse down a street": the path goes with the verb.
            connector = replace(connector, predicate=_Predicate(
                prev[1].verb, connector.predicate.preposition))
        if not subjects:
            self._reject(f"no readable subject for {_gap_text(gap)!r} {phrases[nxt].text!r}")
            self.last = None
            return
        if connector.is_passive:
            for s in subjects:
                self.parse.relations.append((nxt, connector.predicate, s))
            self.last = None
            return
        if connector.aux_plural is not None and len(subjects) == 1:
            # "the sheep are grazing": the caption's auxiliary settles the number; with two
            # subjects ("a zebra and two elephants are") it is the pair's, not each one's.
            phrases[subjects[0]].is_plural = connector.aux_plural
        for s in subjects:
            self.parse.relations.append((s, connector.predicate, nxt))
        self.last = (list(subjects), connector.predicate)

    def _subjects(self, i: int, connector: _Connector, gap: list[str]) -> list[int] | None:
        """Who the predicate is about, or None when that is too ambiguous to say.

        After a "with" object ("a bathroom with towels", "a counter topped with a cake") a
        bare verb describes that object ("... hanging by the shower"), and so does a bare
        preposition to a body part ("with a toothbrush in his mouth"). Any other bare
        preposition after a possession "with" is ambiguous ("a kitchen with tulips on the
        table"); after a participle ("a vase filled with flowers next to a vase") it is
        about the subject.
        """
        nxt = i + 1
        after_with = (self.last is not None and _is_bare_connector(connector)
                      and (self.last[1].verb == "has" or self.last[1].preposition == "with")
                      # "a sheep with short hair stands under a fence": the sheep stands.
                      and self.parse.phrases[i].head.category not in _WORN)
        if after_with and connector.predicate.verb is None:
            is_body = self.parse.phrases[nxt].head.category == "body"
            if self.last[1].verb == "has" and not is_body:
                holders = self.last[0]
                if holders and not any(_is_place(self.parse.phrases[h]) for h in holders):
                    # "a toilet with a black seat next to a shower": the toilet is.
                    return list(holders)
                if holders and connector.predicate.preposition in _PLACING:
                    self.with_holders = list(holders)
                    return [i]  # "a kitchen with a teapot on the stove": the teapot is
                self._reject(f"ambiguous attachment of {_gap_text(gap)!r} "
                             f"{self.parse.phrases[nxt].text!r}")
                self.last, self.clause_subjects = None, []
                return None
            after_with = is_body
        if connector.is_relative:
            self.clause_subjects = [i]
        if connector.is_relative or after_with:
            return [i]
        phrase, obj = self.parse.phrases[i], self.parse.phrases[nxt]
        if _is_bare_connector(connector) and connector.predicate.verb is None:
            if obj.head.category == "clothing" and _is_person(phrase):
                return [i]  # "next to a boy in a blue shirt": the boy wears it
            if obj.head.category == "body" and i not in self.clause_subjects:
                return [i]  # "holding hands over their heads": the hands are
            if obj.head.singular == "sky" and self._after_direct_object():
                return [i]  # "flying a kite in the sky": the kite is
            direct_object = self._after_direct_object()
            onto_surface = (i not in self.clause_subjects
                            and connector.predicate.preposition in _ON_LIKE)
            if (direct_object or onto_surface) and obj.head.category in _SURFACES:
                # "using a keyboard on a desk": the keyboard is on the desk, the person is
                # not; "riding a horse on the beach" is fine (a place, not a surface).
                self._reject(f"ambiguous attachment of {_gap_text(gap)!r} {obj.text!r}")
                self.last = None
                return None
        return self.clause_subjects

    def _after_direct_object(self) -> bool:
        """Whether the current phrase is the direct object of a verb ("using a keyboard")."""
        return (self.last is not None and self.last[1].verb not in (None, "has")
                and self.last[1].preposition is None)

    def _reject(self, detail: str) -> None:
        self.parse.rejections.append(Rejection(RejectReason.UNPARSED, detail))


# Things other things sit on or in: after a direct object, "on a desk" / "in a suitcase" is
# more likely about that object than about the subject.
_SURFACES = frozenset({"furniture", "kitchen", "electronic", "appliance", "indoor", "fixture",
                       "accessory"})
_ON_LIKE = frozenset({"on", "on top of", "in", "at", "inside", "under"})
# Things worn or carried: never the agent of a verb ("a man with a tie posing").
_WORN = frozenset({"clothing", "body", "accessory"})


def _is_person(phrase: _Phrase) -> bool:
    return phrase.head.category.startswith("person")


def _is_agent(phrase: _Phrase) -> bool:
    return _is_person(phrase) or phrase.head.category == "animal"


def _is_place(phrase: _Phrase) -> bool:
    return phrase.head.category in ("room", "outdoor_place")


def _preposition_follows(tokens: list[str], end: int) -> bool:
    return end < len(tokens) and tokens[end] in _PREPOSITION_WORDS and tokens[end] != "of"


def _on_pronoun_follows(tokens: list[str], phrases: list[_Phrase], index: int) -> bool:
    """Whether "on it" / "in it" (not "to its left") follows phrase `index`."""
    end = phrases[index].end
    for n in (1, 3):
        if " ".join(tokens[end : end + n]) in _ON_IT and tokens[end + n : end + n + 1] in (
                ["it"], ["them"]):
            return True
    return False


# Things held or carried: "a woman on a court with a racquet" has it.
_HANDHELD = frozenset({"sports", "accessory", "electronic", "kitchen", "food", "indoor"})
# Prepositions that place a thing: after "a kitchen with a teapot", "on the stove" is the
# teapot's place, not the kitchen's.
_PLACING = frozenset({"on", "on top of", "in", "inside", "at", "under", "near", "next to",
                      "by", "beside", "above", "below", "over"})
# "A with B on it": B is on A, and A has B ("above it", "to its left" only place B).
_ON_IT = frozenset({"on", "on top of", "in", "inside"})
# Prepositions of a path: "riding a horse down a street" keeps its verb.
_PATH_PREPOSITIONS = frozenset({"down", "up", "along", "through", "across", "past", "into",
                                "toward", "around", "onto", "off", "from", "out of",
                                "away from", "to"})


def _gap_text(gap: list[str]) -> str:
    return " ".join(gap)


def _describes_scenery(tokens: list[str], start: int) -> bool:
    """Whether the clause from `start` places things "in the background" (then "X with Y in
    the background" says nothing about X having Y)."""
    for i in range(start, len(tokens)):
        if tokens[i] in _SENTENCE_END:
            return False
        if tokens[i : i + 2] == ["the", "background"] or tokens[i : i + 2] == [
                "the", "foreground"] or tokens[i : i + 2] == ["the", "distance"]:
            return True
    return False


def _has_preamble(tokens: list[str]) -> bool:
    """Whether words before the first phrase may hide the real subject ("an older man
    downhill skiing down a slope"): anything beyond frames, "there is", collectives and
    one unknown modifier ("an attractive young woman")."""
    if lx.DETERMINERS.issuperset(tokens):
        return False  # "A man ...": the common case, nothing to look at
    words = _drop_unknown_modifiers(_skip_frames(tokens))
    return any(w not in _IGNORABLE_PREAMBLE and w not in lx.ATTRIBUTE_KIND
               for w in _content_words(words))


_IGNORABLE_PREAMBLE = (lx.COLLECTIVES | lx.QUANTITY_PREFIXES | lx.OTHER_ADJECTIVES
                       | lx.INTENSIFIERS | frozenset({"of"}))


def _content_words(tokens: list[str]) -> list[str]:
    """Words that may carry meaning (not determiners, "there is", adverbs, punctuation)."""
    return [w for w in _drop_adverbials(tokens) if w.isalnum() and w not in lx.DETERMINERS
            and w not in lx.SKIPPABLE_ADVERBS and w not in _COORDINATORS
            and w not in ("there", "here", "is", "are", "'s")]


def _is_bare_connector(connector: _Connector) -> bool:
    return (connector.aux_plural is None and not connector.is_relative
            and connector.predicate.verb != "has" and not connector.is_bare_with)


def _is_existential(gap: list[str]) -> bool:
    text = " ".join(gap)
    # Every existential opening has "here" in it ("there is", "here are"): most gaps do not.
    return "here" in text and any(e in text for e in lx.EXISTENTIAL)


def _starts_clause(tokens: list[str], phrases: list[_Phrase], index: int) -> bool:
    """Whether phrase `index` is followed by a verb (so it is a new clause's subject)."""
    end = phrases[index].end
    following = tokens[end : end + 2]
    if not following:
        return False
    first = following[0]
    return first in lx.AUXILIARIES or (
        _verb_ing(first) is not None and first not in _PREPOSITION_WORDS)


def _read_pronoun_relation(gap: list[str], subject: int, parse: _Parse) -> list[str]:
    """Read a leading "to its left" / "above it" (pointing back at the nearest earlier
    phrase of the pronoun's number: "a dresser with a monitor on top of it", "a desktop
    with two computers and fruit on it"), record the relation, and return the rest of the
    gap."""
    if "its" not in gap and _PRONOUNS.isdisjoint(gap):
        return gap  # most gaps: no pronoun, nothing to read here
    for words, preposition in _POSSESSIVE_DIRECTIONS.items():
        if tuple(gap[: len(words)]) == words:
            antecedent = _antecedent(parse.phrases, subject, is_plural=False)
            if antecedent is None:
                return gap
            parse.relations.append((subject, _Predicate(None, preposition), antecedent))
            return gap[len(words):]
    for n in range(min(lx.MAX_PREPOSITION_WORDS, len(gap) - 1), 0, -1):
        preposition = " ".join(gap[:n])
        if preposition in lx.PREPOSITION_ANTONYMS and gap[n] in _PRONOUNS:
            antecedent = _antecedent(parse.phrases, subject, is_plural=gap[n] == "them")
            if antecedent is None:
                return gap
            parse.relations.append((subject, _Predicate(None, _canonical(preposition)),
                                    antecedent))
            return gap[n + 1:]
    return gap


def _antecedent(phrases: list[_Phrase], subject: int, is_plural: bool) -> int | None:
    for j in range(subject - 1, -1, -1):
        head = phrases[j].head
        # "lettuce" or "sheep" could be either number: not a safe antecedent.
        if head.singular != head.plural and phrases[j].is_plural == is_plural:
            return j
    return None


def _pronoun_relation_follows(tokens: list[str], phrases: list[_Phrase], index: int) -> bool:
    end = phrases[index].end
    gap = tokens[end : end + 4]
    if any(tuple(gap[: len(w)]) == w for w in _POSSESSIVE_DIRECTIONS):
        return True
    for n in range(min(lx.MAX_PREPOSITION_WORDS, len(gap) - 1), 0, -1):
        if " ".join(gap[:n]) in lx.PREPOSITION_ANTONYMS and gap[n] in _PRONOUNS:
            return True
    return False


def _read_connector(gap: list[str]) -> tuple[_Connector | None, str]:
    """Read the words between two phrases as [that|while|,] [is|are] [verb] [preposition].
    Returns (connector, "") or (None, why not)."""
    # The same few gaps ("is riding", "on", "sitting on") recur in caption after caption;
    # the reading depends on the gap's words alone, and callers replace() a connector
    # rather than change it, so one reading per gap is shared.
    return _read_connector_words(tuple(gap))


@functools.lru_cache(maxsize=1 << 14)
def _read_connector_words(gap: tuple[str, ...]) -> tuple[_Connector | None, str]:
    words = _drop_unknown_modifiers(
        [w for w in _drop_adverbials(list(gap)) if w not in lx.SKIPPABLE_ADVERBS
         and not _is_unknown_adverb(w)])
    if len(words) > 2 and words[0] == "in" and words[1] in lx.ATTRIBUTE_KIND and (
            lx.ATTRIBUTE_KIND[words[1]] == "color"):
        words = words[2:]  # "a girl in pink is playing": what she wears, not a relation
    if not words and gap:
        return None, f"{_gap_text(gap)!r} not in lexicon"
    is_relative = False
    while words and words[0] in _SUBORDINATORS:
        words = words[1:]
    if words and words[0] in _REL_PRONOUNS:
        is_relative, words = True, words[1:]
    aux_plural = None
    if words and words[0] in lx.AUXILIARIES:
        aux_plural = {"is": False, "was": False, "are": True, "were": True}.get(words[0])
        words = words[1:]
    while words and words[0] in lx.AUXILIARIES | {"getting", "gets", "got"}:
        words = words[1:]  # "is being pulled by", "are getting pulled by"
    if words and words[0] == "not":
        return None, "negated predicate"
    if len(words) == 2 and words[0] in lx.AGENT_PARTICIPLES and words[1] == "by":
        # "a trolley that is being pulled by a horse" is "horse is pulling trolley".
        return _Connector(_Predicate(lx.AGENT_PARTICIPLES[words[0]], None), is_relative,
                          None, is_passive=True), ""
    verb = None
    if words and words[0] in ("has", "have", "had"):
        verb, words = "has", words[1:]
    elif words:
        verb = _verb_ing(words[0]) or (words[0] if words[0] in lx.PARTICIPLES else None)
        if verb is not None:
            words = words[1:]
            if len(words) > 1 and words[0] in lx.PARTICLES and _preposition_at(words, 1):
                verb, words = f"{verb} {words[0]}", words[1:]  # "lying down in"
        verb, words = _infinitive(verb, words)
    preposition = None
    for n in range(min(lx.MAX_PREPOSITION_WORDS, len(words)), 0, -1):
        candidate = " ".join(words[:n])
        if candidate in lx.PREPOSITION_ANTONYMS:
            preposition, words = _canonical(candidate), words[n:]
            break
    if words:
        return None, _unknown_reason(words, verb)
    if verb is None and preposition is None:
        return None, "no verb or preposition" if gap else "nothing between them"
    if verb is None and preposition in _NEEDS_VERB:
        # "drinking water from a bottle": the verb before the object carries it.
        return _Connector(_Predicate(None, preposition), is_relative, aux_plural,
                          needs_verb=True), ""
    if preposition == "with" and verb is None:
        return _Connector(_Predicate("has", None), is_relative, aux_plural, True), ""
    if verb == "has" and preposition is not None:
        return None, f"'has ... {preposition}' not in lexicon"
    if verb in lx.PARTICIPLES and preposition is None:
        # "a snow covered forest": a participle without its preposition is an adjective.
        return None, f"participle {verb!r} without a preposition"
    return _Connector(_Predicate(verb, preposition), is_relative, aux_plural), ""


def _infinitive(verb: str | None, words: list[str]) -> tuple[str | None, list[str]]:
    """Read "trying to hit", "reaching up to grab", "about to catch", "getting ready to
    hit" as one verb: the relation is what the subject is doing to the object."""
    if words[:1] == ["ready"] and words[1:2] == ["to"]:
        verb, words = f"{verb} ready" if verb else "ready", words[1:]
    elif verb is None and words[:2] == ["about", "to"]:
        verb, words = "about", words[1:]
    if verb is not None and len(words) > 1 and words[0] == "to" and words[1] in lx.VERB_ING:
        return f"{verb} to {words[1]}", words[2:]
    return verb, words


def _is_unknown_adverb(word: str) -> bool:
    """An unknown "-ly" word between phrases is a manner adverb ("walking slowly across"):
    it changes how, not what, so it is skipped."""
    return (len(word) > 4 and word.endswith("ly") and word not in lx.NOUNS
            and word not in lx.VERB_ING and _is_unknown_word(word))


def _preposition_at(words: list[str], i: int) -> bool:
    return any(" ".join(words[i : i + n]) in lx.PREPOSITION_ANTONYMS
               for n in range(1, lx.MAX_PREPOSITION_WORDS + 1))


def _drop_adverbials(gap: list[str]) -> list[str]:
    """`gap` without fixed adverbial phrases ("in the background", "each other")."""
    if _ADVERBIALS_BY_START.keys().isdisjoint(gap):
        return gap
    kept, i = [], 0
    while i < len(gap):
        # Only the phrases starting with this word can match here, tried in their order.
        for phrase in _ADVERBIALS_BY_START.get(gap[i], ()):
            if gap[i : i + len(phrase)] == phrase:
                i += len(phrase)
                break
        else:
            kept.append(gap[i])
            i += 1
    return kept


_ADVERBIALS_BY_START: dict[str, list[list[str]]] = {}
for _phrase in lx.ADVERBIAL_PHRASES:
    _ADVERBIALS_BY_START.setdefault(_phrase[0], []).append(_phrase)


def _drop_unknown_modifiers(words: list[str]) -> list[str]:
    """Drop unknown words (and their determiner) right before the next phrase: in "in a
    santa costume" the phrase is "costume" and "santa" a modifier we do not know. The
    entity is then less specific, but still true."""
    end = len(words)
    while end and _is_unknown_word(words[end - 1]):
        end -= 1
    if end < len(words) and end and words[end - 1] in lx.DETERMINERS:
        end -= 1
    return words[:end]


def _is_unknown_word(word: str) -> bool:
    return (word.isalpha() and word not in _FUNCTION_WORDS and word not in _PREPOSITION_WORDS
            and word not in lx.ATTRIBUTE_KIND and word not in lx.NOUNS
            and _verb_ing(word) is None and not word.endswith(("ing", "ed")))


def _unknown_reason(words: list[str], verb: str | None) -> str:
    first = words[0]
    if verb is None and first.isalpha() and first not in lx.DETERMINERS and (
            first not in _FUNCTION_WORDS and first not in lx.ATTRIBUTE_KIND):
        return f"verb {first!r} not in lexicon"
    return f"{' '.join(words)!r} not in lexicon"


def _canonical(preposition: str) -> str:
    return _CANONICAL_PREPOSITION.get(preposition, preposition)


@functools.lru_cache(maxsize=1 << 16)
def _verb_ing(word: str) -> str | None:
    """The -ing form of a known verb in any form ("rides", "riding", "ride", "sat")."""
    if word in _ING_FORMS:
        return word
    base = lx.IRREGULAR_FORMS.get(word)
    if base == "have":
        return None
    if base is None and word in lx.VERB_ING:
        base = word
    if base is None:
        for cut, add in (("ies", "y"), ("es", ""), ("s", "")):
            if word.endswith(cut) and word[: -len(cut)] + add in lx.VERB_ING:
                base = word[: -len(cut)] + add
                break
    return lx.VERB_ING.get(base) if base else None


_ING_FORMS = frozenset(lx.VERB_ING.values())


def _check_leftover(gap: list[str], after: str | None, rejections: list[Rejection],
                    leading: bool = False) -> None:
    """Record words outside any unit that may have carried a relation."""
    if not gap or lx.DETERMINERS.issuperset(gap):
        return  # the common leading "a" or "the", or nothing at all: no content words
    content = _content_words(gap)
    if not content:
        return
    text = " ".join(content)
    where = "before the first object" if leading else f"after {after!r}"
    rejections.append(Rejection(RejectReason.UNPARSED, f"{where}: {text!r} not parsed"))


def _unknown_hint(tokens: list[str]) -> str:
    unknown = [t for t in tokens if t.isalpha() and t not in _FUNCTION_WORDS
               and t not in _PREPOSITION_WORDS and _verb_ing(t) is None]
    return f" (unknown words: {', '.join(unknown[:5])})" if unknown else ""


# ------------------------------------------------------------------------------------------
# Units and foils
# ------------------------------------------------------------------------------------------

def _stable_seed(text: str) -> int:
    # Not hash(): Python salts str hashes per process, and foils must not change between runs.
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


# The same entity texts ("man", "table") recur across captions; their hash need not.
_phrase_seed = functools.lru_cache(maxsize=1 << 14)(_stable_seed)


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


def _entity_units(phrases: list[_Phrase], caption: str, tokens: list[str], seed: int,
                  rejections: list[Rejection]
                  ) -> tuple[dict[str, Unit], dict[str, tuple[str, _Reading]], _FoilCheck]:
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
    check = _FoilCheck(caption, texts)
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
        if phrase.attributes and len(kept) < _MAX_ENTITY_FOILS:  # else there are none to add
            kept += check.valid_foils("entity", text, reading, (None, None),
                                      _attribute_foil_candidates(phrase, caption_words, salt),
                                      rejections, limit=_MAX_ENTITY_FOILS - len(kept))
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


def _object_foil_candidates(phrase: _Phrase, taboo: frozenset[str],
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


def _attribute_foil_candidates(phrase: _Phrase, caption_words: set[str],
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
    return norm, words, tuple(_stem(w) for w in words if w not in _UNSTEMMED)


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
_SYNONYM_WORDS = frozenset(_SYNONYMS_OF)


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


class _FoilCheck:
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
                    if foil_word not in _SYNONYMS_OF.get(unit_word, ()):
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


def _relation_units(parse: _Parse, entities: dict[str, Unit],
                    first_foils: dict[str, tuple[str, _Reading]], check: _FoilCheck,
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
        forms = _predicate_forms(predicate)
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


def _relation_foil_candidates(subject: _Phrase, s_reading: _Reading, forms: _PredicateForms,
                              obj: _Phrase, o_reading: _Reading, rendered: str,
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




# ------------------------------------------------------------------------------------------
# Scoring against gold units
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PRF:
    """Precision, recall and F1 with the counts behind them."""

    true_positives: int
    false_positives: int
    false_negatives: int

    @property
    def precision(self) -> float:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else 0.0

    @property
    def recall(self) -> float:
        wanted = self.true_positives + self.false_negatives
        return self.true_positives / wanted if wanted else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass(frozen=True)
class ExtractionScores:
    """Entity and relation P/R/F1 of predicted units against gold, micro-averaged over
    records, units matched on normalized text."""

    entity: PRF
    relation: PRF
    num_records: int

    def as_dict(self) -> dict[str, float]:
        """Flat metrics (`entity_precision`, ..., `relation_f1`) for tables and MLflow."""
        out: dict[str, float] = {"num_records": float(self.num_records)}
        for name, prf in (("entity", self.entity), ("relation", self.relation)):
            out[f"{name}_precision"] = prf.precision
            out[f"{name}_recall"] = prf.recall
            out[f"{name}_f1"] = prf.f1
        return out


def score_against_gold(predicted: Sequence[UnitsRecord] | Sequence[RulesResult],
                       gold: Sequence[UnitsRecord]) -> ExtractionScores:
    """Score predicted units against gold units, record by record (same order).

    Raises:
        DataError: the two sequences differ in length, or records' sample_ids differ.
    """
    if len(predicted) != len(gold):
        raise DataError(f"{len(predicted)} predicted records but {len(gold)} gold records; "
                        "score the same captions in the same order")
    counts = {"entity": [0, 0, 0], "relation": [0, 0, 0]}
    for pred, ref in zip(predicted, gold, strict=True):
        if isinstance(pred, UnitsRecord) and pred.sample_id != ref.sample_id:
            raise DataError(f"predicted record {pred.sample_id!r} is paired with gold "
                            f"{ref.sample_id!r}; sort both by sample_id")
        for kind, mine, theirs in (("entity", pred.entities, ref.entities),
                                   ("relation", pred.relations, ref.relations)):
            found = {normalize_text(u.text) for u in mine}
            wanted = {normalize_text(u.text) for u in theirs}
            counts[kind][0] += len(found & wanted)
            counts[kind][1] += len(found - wanted)
            counts[kind][2] += len(wanted - found)
    return ExtractionScores(PRF(*counts["entity"]), PRF(*counts["relation"]), len(gold))

"""What every part of the rules backend shares: the tokens, the word classes a reading
checks words against, and the data types of a reading (phrases, predicates, connectors)."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from csclip.extract import lexicon as lx
from csclip.units import Rejection, Unit

# Words, with inner hyphens/apostrophes kept ("close-up", "elephant's"), and the
# punctuation that separates phrases and sentences.
_TOKEN = re.compile(r"[a-z0-9]+(?:['-][a-z0-9]+)*|[.,;:!?]")
# Tokens that end a sentence: no relation reads across them.
SENTENCE_END = frozenset(".;:!?")
# Tokens that join noun phrases into a list ("a cat and a dog").
COORDINATORS = frozenset({",", "and", "or", "plus", "also"})
# Words after which the next noun phrase starts a new clause ("... while a girl plays").
CLAUSE_OPENERS = frozenset({"while", "whilst", "as", "and", "but", "when", "where", ",",
                             "because", "so"})
# Relative pronouns: "a man who is riding ..." attaches to the phrase just before.
REL_PRONOUNS = frozenset({"that", "which", "who"})
# Words after which a participle starts a clause of the sentence's subject.
SUBORDINATORS = frozenset({"while", "whilst", "and", ","})
# Pronouns a relation may point back through ("a plate with food on it").
PRONOUNS = frozenset({"it", "them"})
# "to its left" style phrases: the relation points back at the phrase before.
POSSESSIVE_DIRECTIONS = {("to", "its", "left"): "left of", ("to", "its", "right"): "right of",
                          ("on", "its", "left"): "left of", ("on", "its", "right"): "right of"}
# One spelling per spatial relation, so "to the left of" and "left of" give one predicate.
CANONICAL_PREPOSITION = {"to the left of": "left of", "to the right of": "right of",
                          "inside of": "inside", "outside of": "outside",
                          "towards": "toward", "underneath": "under", "beneath": "under"}
MAX_ENTITY_FOILS = 3  # foils kept per entity unit
# The record's meta key for what the caption says is absent: a JSON list of entity texts.
ABSENT_META_KEY = "absent"
# Prepositions that say nothing spatial on their own ("holding a slice to her face").
NEEDS_VERB = frozenset({"to", "for", "from", "up", "down", "off", "of"})


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
class Phrase:
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


class Predicate(NamedTuple):
    """A relation predicate as read from the caption: an optional verb ("riding", "filled",
    "has") and an optional preposition ("on", "left of"). A tuple: it keys the caches of
    its renderings, and a tuple hashes in C."""

    verb: str | None
    preposition: str | None

    def render(self, is_plural: bool, negated: bool = False) -> str:
        forms = predicate_forms(self)
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

    def antonym(self) -> Predicate | None:
        if self.preposition and lx.PREPOSITION_ANTONYMS.get(self.preposition):
            opposite = lx.PREPOSITION_ANTONYMS[self.preposition]
            return Predicate(self.verb, CANONICAL_PREPOSITION.get(opposite, opposite))
        if self.verb in lx.VERB_ANTONYMS:
            return Predicate(lx.VERB_ANTONYMS[self.verb], self.preposition)
        return None

    @property
    def is_symmetric(self) -> bool:
        return self.preposition in lx.SYMMETRIC_PREPOSITIONS


class PredicateForms(NamedTuple):
    """A predicate's renderings, each a (singular subject, plural subject) pair."""

    plain: tuple[str, str]
    negated: tuple[str, str]
    antonym: tuple[str, str] | None  # None: the predicate has no antonym
    is_symmetric: bool


@functools.lru_cache(maxsize=1 << 14)
def predicate_forms(predicate: Predicate) -> PredicateForms:
    """Every rendering of `predicate` a unit or foil needs (cached)."""
    # A few hundred predicates, each rendered ~5 times a relation (unit and foils).
    antonym = predicate.antonym()
    return PredicateForms(
        (predicate._render(False, False), predicate._render(True, False)),
        (predicate._render(False, True), predicate._render(True, True)),
        None if antonym is None else (antonym._render(False, False),
                                      antonym._render(True, False)),
        predicate.is_symmetric)


@dataclass
class Connector:
    """The words between two noun phrases, read as a predicate."""

    predicate: Predicate
    is_relative: bool = False  # "that is ...": attaches to the phrase just before
    aux_plural: bool | None = None  # number the caption's own auxiliary gives the subject
    is_bare_with: bool = False
    needs_verb: bool = False  # "from a bottle": only as part of the verb before it
    is_passive: bool = False  # "pulled by a horse": the next phrase is the subject


@dataclass
class Parse:
    """A caption's reading so far: its noun phrases in caption order, the relations
    between them as (subject index, predicate, object index), and what was not read."""

    phrases: list[Phrase] = field(default_factory=list)
    relations: list[tuple[int, Predicate, int]] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


def tokenize(caption: str) -> list[str]:
    """Lower-case word and punctuation tokens of a caption."""
    return _TOKEN.findall(caption.lower())


# Words that are never an unknown content word: determiners, auxiliaries, pronouns, ...
FUNCTION_WORDS = (
    lx.DETERMINERS | lx.AUXILIARIES | lx.RELATIVE_WORDS | lx.SKIPPABLE_ADVERBS
    | lx.INTENSIFIERS | lx.QUANTITIES | lx.OTHER_ADJECTIVES | lx.PARTICIPLES | CLAUSE_OPENERS
    | PRONOUNS | frozenset({"of", "not", "its", "there", "here", "has", "have", "had",
                             "plus", "also", "their", "his", "her", "one", "each", "other",
                             "about", "like", "than", "what", "how", "only", "too", "during",
                             "until", "since", "per", "via", "despite", "except", "if", "or",
                             "nor", "yet", "such", "then", "him", "them", "they", "he", "she",
                             "we", "you", "i", "me", "us", "himself", "herself", "themselves",
                             "itself", "someone", "something", "everyone", "anyone"})
)
# Every word of a known preposition ("next", "to", "in", "front", "of", ...).
PREPOSITION_WORDS = frozenset(w for p in lx.PREPOSITIONS for w in p.split())


def is_unknown_word(word: str) -> bool:
    """Whether `word` is a content word the lexicon does not know (no function word,
    preposition, attribute, noun or verb form)."""
    return (word.isalpha() and word not in FUNCTION_WORDS and word not in PREPOSITION_WORDS
            and word not in lx.ATTRIBUTE_KIND and word not in lx.NOUNS
            and verb_ing(word) is None and not word.endswith(("ing", "ed")))


@functools.lru_cache(maxsize=1 << 16)
def verb_ing(word: str) -> str | None:
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

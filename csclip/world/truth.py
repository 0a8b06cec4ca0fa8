"""The truth oracle's language: a small grammar over the world's vocabulary.

It parses text on its own (never looking at what the generator produced) so that tests
can check gold units and foils against the scene:

    statement := clause ("and" clause)*
    clause    := entity | entity "is" ["not"] predicate entity
    entity    := [a|an|the] [size] [color] shape
    predicate := "left of" | "right of" | "above" | "below"
                 (also "to the left of" / "to the right of")
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from csclip.config.world import PALETTE, SHAPES, SIZES
from csclip.errors import CsclipError


class WorldLanguageError(CsclipError):
    """Text that is not in the world's language (so the oracle cannot judge it)."""


class _Object(Protocol):
    shape: str
    color: str
    size: str
    row: int
    col: int


@dataclass(frozen=True)
class EntityPhrase:
    """An entity mention: the shape and any subset of size and color (None = not said)."""

    shape: str
    color: str | None = None
    size: str | None = None

    def matches(self, obj: _Object) -> bool:
        return (obj.shape == self.shape and (self.color is None or obj.color == self.color)
                and (self.size is None or obj.size == self.size))


@dataclass(frozen=True)
class RelationClause:
    """`subject is [not] predicate object`; `relation` is left|right|above|below."""

    subject: EntityPhrase
    relation: str
    object: EntityPhrase
    negated: bool = False


Clause = EntityPhrase | RelationClause

_ARTICLES = frozenset({"a", "an", "the"})
_RELATION_WORDS: dict[tuple[str, ...], str] = {
    ("left", "of"): "left",
    ("right", "of"): "right",
    ("to", "the", "left", "of"): "left",
    ("to", "the", "right", "of"): "right",
    ("above",): "above",
    ("below",): "below",
}
_TOKEN = re.compile(r"[a-z]+")


def parse_entity(words: Sequence[str], text: str) -> EntityPhrase:
    """Parse `[article] [size] [color] shape` from a list of words."""
    rest = list(words)
    if rest and rest[0] in _ARTICLES:
        rest = rest[1:]
    size = rest.pop(0) if rest and rest[0] in SIZES else None
    color = rest.pop(0) if rest and rest[0] in PALETTE else None
    if len(rest) != 1 or rest[0] not in SHAPES:
        raise WorldLanguageError(
            f"{text!r}: expected an entity '[size] [color] shape' (sizes {list(SIZES)}, colors "
            f"{sorted(PALETTE)}, shapes {list(SHAPES)}), got {' '.join(words)!r}")
    return EntityPhrase(shape=rest[0], color=color, size=size)


def _parse_clause(words: list[str], text: str) -> Clause:
    if "is" not in words:
        return parse_entity(words, text)
    at = words.index("is")
    subject, rest = parse_entity(words[:at], text), words[at + 1:]
    negated = bool(rest) and rest[0] == "not"
    if negated:
        rest = rest[1:]
    for phrase, relation in _RELATION_WORDS.items():
        if tuple(rest[: len(phrase)]) == phrase:
            return RelationClause(subject, relation, parse_entity(rest[len(phrase):], text), negated)
    raise WorldLanguageError(
        f"{text!r}: unknown predicate after 'is' in {' '.join(words)!r}; use 'is [not] left of', "
        "'right of', 'above' or 'below'")


@functools.lru_cache(maxsize=4096)  # bounded: memory stays flat over 100k samples
def parse_statement(text: str) -> tuple[Clause, ...]:
    """Parse world-language text into clauses joined by 'and'. Cached: the language is
    small, so the generator's oracle checks repeat the same texts over and over.

    Raises:
        WorldLanguageError: the text uses words or a structure outside the language.
    """
    cleaned = text.strip().lower().rstrip(".")
    words = cleaned.split()
    if not words or any(not _TOKEN.fullmatch(w) for w in words):
        raise WorldLanguageError(f"{text!r}: expected lower-case words of the world language, "
                                 "e.g. 'red circle is left of blue square'")
    clauses, current = [], []
    for word in words + ["and"]:
        if word == "and":
            if not current:
                raise WorldLanguageError(f"{text!r}: empty clause around 'and'")
            clauses.append(_parse_clause(current, text))
            current = []
        else:
            current.append(word)
    return tuple(clauses)


def _relation_holds(relation: str, a: _Object, b: _Object) -> bool:
    # Row 0 is the top of the image; relations compare grid cells, never pixels.
    if relation == "left":
        return a.col < b.col
    if relation == "right":
        return a.col > b.col
    if relation == "above":
        return a.row < b.row
    return a.row > b.row


def clause_holds(clause: Clause, objects: Sequence[_Object]) -> bool:
    """Whether one clause is true of a scene's objects.

    An entity holds iff some object matches every mentioned attribute; a relation iff some
    object matching the subject stands in it to some object matching the object; a negated
    relation iff the positive one does not hold.
    """
    if isinstance(clause, EntityPhrase):
        return any(clause.matches(o) for o in objects)
    positive = any(
        _relation_holds(clause.relation, a, b)
        for a in objects if clause.subject.matches(a)
        for b in objects if clause.object.matches(b)
    )
    return positive != clause.negated


def statement_holds(text: str, objects: Sequence[_Object]) -> bool:
    """Whether world-language `text` is true of `objects` ("A and B": both hold)."""
    return all(clause_holds(c, objects) for c in parse_statement(text))

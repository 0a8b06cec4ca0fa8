"""Absence: "no X", "without X", "missing (its) X", "not ... any X", "X-less" are cut out of
the caption before it is read, and kept as what the caption says is not there."""

from __future__ import annotations

from csclip.extract import lexicon as lx
from csclip.extract.rules.base import (
    FUNCTION_WORDS,
    PREPOSITION_WORDS,
    SENTENCE_END,
    Phrase,
    is_unknown_word,
    verb_ing,
)
from csclip.extract.rules.phrases import match_phrase


def cut_absent(tokens: list[str]) -> tuple[list[str], tuple[str, ...]]:
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


def _absent_phrase(tokens: list[str], i: int) -> Phrase | None:
    phrase, _, _ = match_phrase(tokens, i)
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
                    tokens[end].endswith("ed") and is_unknown_word(tokens[end]))):
                following = _absent_phrase(tokens, end + 1)
                if following is not None and following.lead == end + 1:
                    absent.append(" ".join(tokens[phrase.start : following.end]))
                    return following.end
                last = end + 1
                while last < len(tokens) and is_unknown_word(tokens[last]):
                    last += 1
                if last > end + 1:  # "orange decorated wallpaper": an unknown head
                    absent.append(" ".join(tokens[phrase.start : last]))
                    return last
            return _record_absent(phrase, absent)
        if not (is_unknown_word(tokens[k]) or tokens[k] in lx.OTHER_ADJECTIVES
                or tokens[k] in lx.ATTRIBUTE_KIND or tokens[k].endswith(("ed", "ing"))):
            break
        k += 1
    if k > j and is_unknown_word(tokens[k - 1]):
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
                tokens[j] not in FUNCTION_WORDS and tokens[j] not in PREPOSITION_WORDS):
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


def _record_absent(phrase: Phrase, absent: list[str]) -> int:
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
    if before in ("and", ",") or verb_ing(before) or before in ("has", "have", "had"):
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
        if tokens[j] in SENTENCE_END or tokens[j] == ",":
            return None
        if tokens[j] == "any":
            end = _absent_span(tokens, j, absent)
            if end is None:
                return None
            return i, _coordinated_absent(tokens, end, absent, False)
    return None


_NOT_WORDS = frozenset({"not", "never", "doesnt", "dont", "isnt", "arent", "hasnt", "havent"})
_NEGATION_CUES = frozenset({"no", "without", "missing"}) | _NOT_WORDS

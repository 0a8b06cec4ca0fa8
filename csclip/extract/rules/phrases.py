"""Noun phrases: the entities of a caption, each a span with its head noun and attributes,
and the frames ("a photo of", "close up of") that are no entity."""

from __future__ import annotations

from csclip.extract import lexicon as lx
from csclip.extract.rules.base import (
    COORDINATORS,
    FUNCTION_WORDS,
    PREPOSITION_WORDS,
    Phrase,
    verb_ing,
)
from csclip.units import (
    Rejection,
    RejectReason,
)


def find_phrases(tokens: list[str], rejections: list[Rejection]) -> list[Phrase]:
    """The caption's noun phrases in order; a phrase seen but not readable goes to
    `rejections`."""
    phrases: list[Phrase] = []
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
        phrase, next_i, rejected = match_phrase(tokens, i)
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
    if not word.isalpha() or word in FUNCTION_WORDS or word in PREPOSITION_WORDS:
        return False
    return word not in lx.NOUNS and verb_ing(word) is None and word not in lx.PARTICIPLES


def skip_frames(tokens: list[str]) -> list[str]:
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


# The words `match_phrase` can find a phrase at: anything else gives (None, i + 1, None).
_PHRASE_STARTS = (lx.DETERMINERS | lx.INTENSIFIERS | frozenset(lx.QUANTITY_PREFIXES)
                  | frozenset(lx.COLLECTIVES) | frozenset(lx.ATTRIBUTE_KIND)
                  | lx.OTHER_ADJECTIVES | frozenset(lx.NOUNS) | _MULTIWORD_NOUN_STARTS)


def match_phrase(tokens: list[str], i: int) -> tuple[Phrase | None, int, str | None]:
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
    return (Phrase(start, end, i, words, head_index - start, noun, tuple(attributes),
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
    if verb_ing(form) is None or " " in form:
        return False
    after = tokens[i + 1] if i + 1 < len(tokens) else ""
    return after in lx.DETERMINERS or after in PREPOSITION_WORDS
# Words after which a noun starts a phrase even when it could be a verb ("with paddles").
_OPENS_PHRASE = lx.DETERMINERS | PREPOSITION_WORDS | frozenset({",", "and", "or", "of"})


def _is_bare_verb_noun(word: str) -> bool:
    """A verb's base form right after a singular noun cannot be its verb ("a cat brush"
    is not a cat brushing): it is the head of a compound ("toilet brush")."""
    return word in lx.VERB_ING and word not in lx.NOUNS and word not in lx.PARTICIPLES


def _is_unknown_noun(word: str, after: str) -> bool:
    """Whether `word`, right after a noun, is likely the real (unknown) head noun: an
    unknown word that does not look like a verb form ("swats at" is a verb, "seat" and
    "dwellers walk" are nouns)."""
    if not word or not word.isalpha() or word in FUNCTION_WORDS or word in PREPOSITION_WORDS:
        return False
    if word in lx.NOUNS or word in lx.ATTRIBUTE_KIND or verb_ing(word) is not None:
        return False
    if word.endswith(("ing", "ed")):
        return False
    if word.endswith("s") and not word.endswith("ss"):
        # A verb in the third person is followed by its object or a preposition.
        return not (not after or not after.isalpha() or after in lx.DETERMINERS
                    or after in PREPOSITION_WORDS or after in COORDINATORS
                    or after in lx.SKIPPABLE_ADVERBS)
    return True

"""Relations between noun phrases: the words between two phrases read as a predicate
(verb and preposition), with who is the subject, or a rejection that says why not."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from csclip.extract import lexicon as lx
from csclip.extract.rules.base import (
    CANONICAL_PREPOSITION,
    CLAUSE_OPENERS,
    COORDINATORS,
    FUNCTION_WORDS,
    NEEDS_VERB,
    POSSESSIVE_DIRECTIONS,
    PREPOSITION_WORDS,
    PRONOUNS,
    REL_PRONOUNS,
    SENTENCE_END,
    SUBORDINATORS,
    Connector,
    Parse,
    Phrase,
    Predicate,
    is_unknown_word,
    verb_ing,
)
from csclip.extract.rules.phrases import skip_frames
from csclip.units import (
    Rejection,
    RejectReason,
)


def read_relations(tokens: list[str], parse: Parse) -> None:
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
            check_leftover(gap, phrases[i].text, parse.rejections)
        elif not SENTENCE_END.isdisjoint(gap) or _is_existential(gap):
            reader.clause_subjects, reader.last = [i + 1], None
        elif gap and COORDINATORS.issuperset(gap):
            reader.coordinate(i)
        else:
            reader.connect(i, gap)


@dataclass
class _RelationReader:
    """The state of `read_relations` while it walks a caption."""

    tokens: list[str]
    parse: Parse
    clause_subjects: list[int] = field(default_factory=list)
    # The last relation read, as (subjects, predicate); its object is the current phrase.
    last: tuple[list[int], Predicate] | None = None
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
            has = Predicate("has", None)
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
            if gap and gap[-1] in CLAUSE_OPENERS:
                self.clause_subjects = [nxt]
            elif gap and gap[-1] == "with":
                # "... with toothbrushes in their mouths": what follows describes the object.
                self.last = ([], Predicate("has", None))
            return
        if connector.needs_verb:
            if self.last is None or self.last[1].verb in (None, "has") or not self.last[0]:
                self._reject(f"no relation between {phrases[i].text!r} and "
                             f"{phrases[nxt].text!r}: preposition "
                             f"{connector.predicate.preposition!r} without a verb")
                self.last, self.clause_subjects = None, []
                return
            connector = replace(connector, predicate=Predicate(
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
            connector = replace(connector, predicate=Predicate(
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

    def _subjects(self, i: int, connector: Connector, gap: list[str]) -> list[int] | None:
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


def _is_person(phrase: Phrase) -> bool:
    return phrase.head.category.startswith("person")


def _is_agent(phrase: Phrase) -> bool:
    return _is_person(phrase) or phrase.head.category == "animal"


def _is_place(phrase: Phrase) -> bool:
    return phrase.head.category in ("room", "outdoor_place")


def _preposition_follows(tokens: list[str], end: int) -> bool:
    return end < len(tokens) and tokens[end] in PREPOSITION_WORDS and tokens[end] != "of"


def _on_pronoun_follows(tokens: list[str], phrases: list[Phrase], index: int) -> bool:
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
        if tokens[i] in SENTENCE_END:
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
    words = _drop_unknown_modifiers(skip_frames(tokens))
    return any(w not in _IGNORABLE_PREAMBLE and w not in lx.ATTRIBUTE_KIND
               for w in _content_words(words))


_IGNORABLE_PREAMBLE = (lx.COLLECTIVES | lx.QUANTITY_PREFIXES | lx.OTHER_ADJECTIVES
                       | lx.INTENSIFIERS | frozenset({"of"}))


def _content_words(tokens: list[str]) -> list[str]:
    """Words that may carry meaning (not determiners, "there is", adverbs, punctuation)."""
    return [w for w in _drop_adverbials(tokens) if w.isalnum() and w not in lx.DETERMINERS
            and w not in lx.SKIPPABLE_ADVERBS and w not in COORDINATORS
            and w not in ("there", "here", "is", "are", "'s")]


def _is_bare_connector(connector: Connector) -> bool:
    return (connector.aux_plural is None and not connector.is_relative
            and connector.predicate.verb != "has" and not connector.is_bare_with)


def _is_existential(gap: list[str]) -> bool:
    text = " ".join(gap)
    # Every existential opening has "here" in it ("there is", "here are"): most gaps do not.
    return "here" in text and any(e in text for e in lx.EXISTENTIAL)


def _starts_clause(tokens: list[str], phrases: list[Phrase], index: int) -> bool:
    """Whether phrase `index` is followed by a verb (so it is a new clause's subject)."""
    end = phrases[index].end
    following = tokens[end : end + 2]
    if not following:
        return False
    first = following[0]
    return first in lx.AUXILIARIES or (
        verb_ing(first) is not None and first not in PREPOSITION_WORDS)


def _read_pronoun_relation(gap: list[str], subject: int, parse: Parse) -> list[str]:
    """Read a leading "to its left" / "above it" (pointing back at the nearest earlier
    phrase of the pronoun's number: "a dresser with a monitor on top of it", "a desktop
    with two computers and fruit on it"), record the relation, and return the rest of the
    gap."""
    if "its" not in gap and PRONOUNS.isdisjoint(gap):
        return gap  # most gaps: no pronoun, nothing to read here
    for words, preposition in POSSESSIVE_DIRECTIONS.items():
        if tuple(gap[: len(words)]) == words:
            antecedent = _antecedent(parse.phrases, subject, is_plural=False)
            if antecedent is None:
                return gap
            parse.relations.append((subject, Predicate(None, preposition), antecedent))
            return gap[len(words):]
    for n in range(min(lx.MAX_PREPOSITION_WORDS, len(gap) - 1), 0, -1):
        preposition = " ".join(gap[:n])
        if preposition in lx.PREPOSITION_ANTONYMS and gap[n] in PRONOUNS:
            antecedent = _antecedent(parse.phrases, subject, is_plural=gap[n] == "them")
            if antecedent is None:
                return gap
            parse.relations.append((subject, Predicate(None, _canonical(preposition)),
                                    antecedent))
            return gap[n + 1:]
    return gap


def _antecedent(phrases: list[Phrase], subject: int, is_plural: bool) -> int | None:
    for j in range(subject - 1, -1, -1):
        head = phrases[j].head
        # "lettuce" or "sheep" could be either number: not a safe antecedent.
        if head.singular != head.plural and phrases[j].is_plural == is_plural:
            return j
    return None


def _pronoun_relation_follows(tokens: list[str], phrases: list[Phrase], index: int) -> bool:
    end = phrases[index].end
    gap = tokens[end : end + 4]
    if any(tuple(gap[: len(w)]) == w for w in POSSESSIVE_DIRECTIONS):
        return True
    for n in range(min(lx.MAX_PREPOSITION_WORDS, len(gap) - 1), 0, -1):
        if " ".join(gap[:n]) in lx.PREPOSITION_ANTONYMS and gap[n] in PRONOUNS:
            return True
    return False


def _read_connector(gap: list[str]) -> tuple[Connector | None, str]:
    """Read the words between two phrases as [that|while|,] [is|are] [verb] [preposition].
    Returns (connector, "") or (None, why not)."""
    # The same few gaps ("is riding", "on", "sitting on") recur in caption after caption;
    # the reading depends on the gap's words alone, and callers replace() a connector
    # rather than change it, so one reading per gap is shared.
    return _read_connector_words(tuple(gap))


@functools.lru_cache(maxsize=1 << 14)
def _read_connector_words(gap: tuple[str, ...]) -> tuple[Connector | None, str]:
    words = _drop_unknown_modifiers(
        [w for w in _drop_adverbials(list(gap)) if w not in lx.SKIPPABLE_ADVERBS
         and not _is_unknown_adverb(w)])
    if len(words) > 2 and words[0] == "in" and words[1] in lx.ATTRIBUTE_KIND and (
            lx.ATTRIBUTE_KIND[words[1]] == "color"):
        words = words[2:]  # "a girl in pink is playing": what she wears, not a relation
    if not words and gap:
        return None, f"{_gap_text(gap)!r} not in lexicon"
    is_relative = False
    while words and words[0] in SUBORDINATORS:
        words = words[1:]
    if words and words[0] in REL_PRONOUNS:
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
        return Connector(Predicate(lx.AGENT_PARTICIPLES[words[0]], None), is_relative,
                          None, is_passive=True), ""
    verb = None
    if words and words[0] in ("has", "have", "had"):
        verb, words = "has", words[1:]
    elif words:
        verb = verb_ing(words[0]) or (words[0] if words[0] in lx.PARTICIPLES else None)
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
    if verb is None and preposition in NEEDS_VERB:
        # "drinking water from a bottle": the verb before the object carries it.
        return Connector(Predicate(None, preposition), is_relative, aux_plural,
                          needs_verb=True), ""
    if preposition == "with" and verb is None:
        return Connector(Predicate("has", None), is_relative, aux_plural, True), ""
    if verb == "has" and preposition is not None:
        return None, f"'has ... {preposition}' not in lexicon"
    if verb in lx.PARTICIPLES and preposition is None:
        # "a snow covered forest": a participle without its preposition is an adjective.
        return None, f"participle {verb!r} without a preposition"
    return Connector(Predicate(verb, preposition), is_relative, aux_plural), ""


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
            and word not in lx.VERB_ING and is_unknown_word(word))


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
    while end and is_unknown_word(words[end - 1]):
        end -= 1
    if end < len(words) and end and words[end - 1] in lx.DETERMINERS:
        end -= 1
    return words[:end]


def _unknown_reason(words: list[str], verb: str | None) -> str:
    first = words[0]
    if verb is None and first.isalpha() and first not in lx.DETERMINERS and (
            first not in FUNCTION_WORDS and first not in lx.ATTRIBUTE_KIND):
        return f"verb {first!r} not in lexicon"
    return f"{' '.join(words)!r} not in lexicon"


def _canonical(preposition: str) -> str:
    return CANONICAL_PREPOSITION.get(preposition, preposition)


def check_leftover(gap: list[str], after: str | None, rejections: list[Rejection],
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


def unknown_hint(tokens: list[str]) -> str:
    """A rejection detail's tail naming the caption's unknown words ("" if none)."""
    unknown = [t for t in tokens if t.isalpha() and t not in FUNCTION_WORDS
               and t not in PREPOSITION_WORDS and verb_ing(t) is None]
    return f" (unknown words: {', '.join(unknown[:5])})" if unknown else ""

"""The rules backend: entity and relation units with foils from caption
English, by lexicon lookup and a few patterns, on CPU, with no model.

It only claims what its lexicon covers. An object noun it does not know, a verb it does not
know, or a connecting phrase it cannot read gives a `Rejection` with the reason instead of
a guess. What the caption says is absent ("no passengers", "without a kite") is never a
unit: it is cut out before reading and kept in `RulesResult.absent`. Same caption, same
output: foil choices are seeded from a hash of the caption.
"""

from __future__ import annotations

import json
from dataclasses import replace

from csclip.extract.rules.absence import cut_absent
from csclip.extract.rules.base import ABSENT_META_KEY, Parse, RulesResult, tokenize
from csclip.extract.rules.foils import entity_units, foil_category, relation_units, stable_seed
from csclip.extract.rules.phrases import find_phrases, skip_frames
from csclip.extract.rules.relations import check_leftover, read_relations, unknown_hint
from csclip.units import Rejection, RejectReason, UnitsRecord, normalize_text

# The modules inside: base (tokens, word lists, the parse's types), phrases (noun
# phrases), absence (what the caption says is not there), relations (between phrases),
# foils (units and their foils). Their shared names are public in the module that
# defines them; scoring against gold units is csclip.extract.quality.
__all__ = ["ABSENT_META_KEY", "RulesResult", "extract_record", "extract_units", "foil_category",
           "tokenize"]


def extract_units(caption: str) -> RulesResult:
    """Entity and relation units, with validated foils, of one caption.

    Entity texts are noun phrases without determiners ("brown horse", "three dogs");
    relation predicates keep their auxiliary ("is riding", "is left of"), and their subject
    and object are entity texts of the caption. Every foil passed `foil_rejection`.
    """
    if not caption or not caption.strip():
        return RulesResult((), (), (Rejection(RejectReason.EMPTY_CAPTION, "caption is empty"),))
    tokens, absent = cut_absent(tokenize(caption))
    parse = _parse(tokens)
    if not parse.phrases:
        reason = "no known object noun" + unknown_hint(tokens)
        return RulesResult((), (), (*parse.rejections, Rejection(RejectReason.UNPARSED, reason)),
                           absent)
    rng_seed = stable_seed(normalize_text(caption))
    rejections = list(parse.rejections)
    entities, first_foils, check = entity_units(parse.phrases, caption, tokens, rng_seed,
                                                 rejections)
    relations = relation_units(parse, entities, first_foils, check, rejections)
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


def _parse(tokens: list[str]) -> Parse:
    # The noun phrases (phrases.py), then the relations between them (relations.py).
    parse = Parse()
    spans = find_phrases(tokens, parse.rejections)
    parse.phrases = spans
    if spans:
        check_leftover(skip_frames(tokens[: spans[0].lead]), None, parse.rejections,
                        leading=True)
        read_relations(tokens, parse)
    return parse

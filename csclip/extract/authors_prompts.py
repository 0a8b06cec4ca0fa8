"""The authors' prompt set (`backend.prompts: authors`, `csclip extract --prompts authors`):
unit extraction as the CS-CLIP authors ran it (kargibora/CS-CLIP, unit_pipeline/ at commit
cc17cf9: generation.py, llm_utils.py, main.py, generate_coco.bash), written anew from
reading it.

Three calls per caption, each a system prompt + one user turn, thinking off:

1. extract: the caption is the whole user turn; answer `{entities: [str], relations:
   [{subject, relation_type, object, description?}]}`.
2. entity_foils, one call per entity: "ENTITY\\nContext: CAPTION"; answer
   `{negative_variants: [{negative, change_type}]}`.
3. relation_foils, one call per caption with relations: "CAPTION\\nEntities: [E1, E2]\\n
   Relations: S R O | ..." (the first 8 relations); answer `{relation_negatives:
   [{original_relation, original_subject, original_object, negatives: [...]}]}`.

Their post-processing follows, step for step, including the quirks that change the output
(docs/extraction.md lists them): braces in captions and entities are doubled in the
prompts; a malformed answer gets its missing `]` then `}` appended (in that order) unless
it ends with `}`, else it is empty; the foil filters match substrings; only the first 8
relations survive a relation call. The result of a caption is an entry in the authors'
released unit format (`authors_entry`); csclip.authors reads it into a UnitsRecord.
Everything they drop is kept here as a Rejection with a reason. Pure: no Ray, no vLLM.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from csclip.extract.prompt_sets.base import MissingAnswer, prompt_json, prompt_text
from csclip.units import Rejection, RejectReason

# The paper's Table 5; their generate_coco.bash runs Qwen/Qwen3-14B-AWQ.
MODEL = "Qwen/Qwen3-8B-AWQ"
EXTRACT, ENTITY_FOILS, RELATION_FOILS = "extract", "entity_foils", "relation_foils"
CALL_KINDS = (EXTRACT, ENTITY_FOILS, RELATION_FOILS)

# Sampling (llm_utils.VLLMWrapper.generate and its three callers in generation.py).
TEMPERATURE, TOP_P, TOP_K, REPETITION_PENALTY = 0.3, 0.95, -1, 1.0
MAX_TOKENS = {EXTRACT: 800, ENTITY_FOILS: 400, RELATION_FOILS: 800}
STOP = {EXTRACT: ["\n\n", "Input:", "Extract from:"],
        ENTITY_FOILS: ["\n\n", "Component:", "Context:"],
        RELATION_FOILS: ["\n\n", "Caption:", "Components:"]}
CHAT_TEMPLATE_KWARGS = {"enable_thinking": False}
MAX_LISTED_ENTITIES = 12  # entities named in the relation-foil prompt
MAX_RELATIONS_WITH_FOILS = 8  # relations sent for foils; a relation call keeps only these
MAX_NEGATIVES_PER_RELATION = 5

# Their three system prompts, word for word, and their pydantic models' model_json_schema()
# (llm_utils.py): package data under csclip/extract/prompt_sets/texts/authors/.
SYSTEM = {kind: prompt_text("authors", f"{kind}_system.txt") for kind in CALL_KINDS}
SCHEMA = {kind: prompt_json("authors", f"{kind}_schema.json") for kind in CALL_KINDS}


def sampling_params(kind: str) -> dict:
    """vLLM SamplingParams kwargs of one call kind, as their wrapper sets them (the schema
    apart: a request carries SCHEMA[kind] as its structured output)."""
    return {"n": 1, "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS[kind], "top_p": TOP_P,
            "top_k": TOP_K, "repetition_penalty": REPETITION_PENALTY, "stop": list(STOP[kind]),
            "skip_special_tokens": True}


# ---------------------------------------------------------------------------------------
# The calls
# ---------------------------------------------------------------------------------------

def prompt_caption(caption: str) -> str:
    """The caption as their pipeline holds it: their COCO loader strips each one."""
    return caption.strip()


def _braces(text: str) -> str:
    # Their code doubles braces "to prevent format() errors" but never calls format(), so
    # the model reads "{{" and "}}" (a quirk kept: it is in the prompts they ran).
    return text.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Call:
    """One request: its kind, whose caption it serves, and its user turn. `occurrence`
    counts the same prompt sent again for one caption (an entity listed twice)."""

    kind: str
    sample_id: str
    caption_index: int
    entity: str | None
    occurrence: int
    user: str

    @property
    def key(self) -> tuple[str, str, str | None, int]:
        return (self.kind, self.sample_id, self.entity, self.occurrence)

    def head(self) -> dict:
        return {"kind": self.kind, "sample_id": self.sample_id,
                "caption_index": self.caption_index, "entity": self.entity,
                "occurrence": self.occurrence}

    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM[self.kind]},
                {"role": "user", "content": self.user}]

    def request(self, model: str) -> dict:
        """The request as `--dump-prompts` writes it."""
        return {**self.head(), "messages": self.messages(),
                "chat_template_kwargs": dict(CHAT_TEMPLATE_KWARGS),
                "sampling_params": sampling_params(self.kind),
                "structured_outputs": {"json": SCHEMA[self.kind]}, "model": model}


def extract_call(sample_id: str, caption_index: int, caption: str) -> Call:
    return Call(EXTRACT, sample_id, caption_index, None, 0, _braces(prompt_caption(caption)))


def entity_calls(sample_id: str, caption_index: int, caption: str,
                 entities: Sequence[str]) -> list[Call]:
    """One call per entity, in list order (a repeated entity is asked again)."""
    seen: dict[str, int] = {}
    calls = []
    for entity in entities:
        occurrence = seen.get(entity, 0)
        seen[entity] = occurrence + 1
        user = f"{_braces(entity)}\nContext: {_braces(prompt_caption(caption))}"
        calls.append(Call(ENTITY_FOILS, sample_id, caption_index, entity, occurrence, user))
    return calls


def _triple(relation: dict) -> tuple[str, str, str]:
    return (relation.get("subject", ""), relation.get("relation_type", ""),
            relation.get("object", ""))


def relation_call(sample_id: str, caption_index: int, caption: str,
                  extraction: Extraction) -> Call | None:
    """The relation-foil call, or None when no relation of the first 8 is complete. Only
    the caption is brace-doubled; entities (the first 12) and relations are not."""
    listed = [" ".join(t) for t in map(_triple, extraction.relations[:MAX_RELATIONS_WITH_FOILS])
              if all(t)]
    if not listed:
        return None
    user = (f"{_braces(prompt_caption(caption))}\n"
            f"Entities: [{', '.join(extraction.entities[:MAX_LISTED_ENTITIES])}]\n"
            f"Relations: {' | '.join(listed)}")
    return Call(RELATION_FOILS, sample_id, caption_index, None, 0, user)


# ---------------------------------------------------------------------------------------
# Reading an answer (llm_utils.VLLMWrapper.generate)
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parsed:
    """An answer read as their wrapper reads it: `value` None when it gave nothing;
    `repaired` when brackets were appended (their wrapper then skips its own filters)."""

    value: object
    repaired: bool = False
    error: str = ""


def read_json(answer: str) -> Parsed:
    """json.loads of the stripped answer; failing that, unless the text ends with "}",
    the missing "]" then the missing "}" appended (their order, whatever the nesting)."""
    raw = (answer or "").strip()
    try:
        return Parsed(json.loads(raw))
    except json.JSONDecodeError as err:
        error = f"not JSON: {err}"
    except RecursionError:
        # Nested deeper than Python's JSON parser recurses: no value, as any unreadable
        # answer, and bracket repair would only nest it deeper.
        return Parsed(None, error="not JSON: nested deeper than the JSON parser reads")
    if raw.endswith("}"):
        return Parsed(None, error=error)
    missing_brackets = raw.count("[") - raw.count("]")
    missing_braces = raw.count("{") - raw.count("}")
    if missing_braces <= 0 and missing_brackets <= 0:
        return Parsed(None, error=error)
    try:
        return Parsed(json.loads(raw + "]" * missing_brackets + "}" * missing_braces), repaired=True)
    except (ValueError, RecursionError):
        return Parsed(None, error=f"{error}; bracket repair failed")


_LLM_BLANKS = ("", "...", ".", " ")  # llm_utils' placeholder strings
_ENTITY_PLACEHOLDERS = ("x", "y", "string", "...", "___")  # generation.py step 1


def _string_fields(item: dict, names: Sequence[str]) -> bool:
    # Their code calls .strip() on these; a present non-string would raise there.
    return all(isinstance(item.get(n, ""), str) for n in names)


def _as_list(value: object, what: str, rejections: list[Rejection]) -> list:
    if isinstance(value, list):
        return value
    rejections.append(Rejection(RejectReason.WRONG_TYPE, f"{what} is not a list: {value!r:.80}"))
    return []


@dataclass
class Extraction:
    """Call 1 read: the entities and relations their pipeline keeps (`error` says why an
    answer gave nothing at all)."""

    entities: list[str] = field(default_factory=list)
    relations: list[dict] = field(default_factory=list)
    error: str = ""
    error_reason: RejectReason = RejectReason.MALFORMED_JSON
    rejections: list[Rejection] = field(default_factory=list)


def read_extraction(answer: str) -> Extraction:
    """llm_utils' filters (only for an answer that parsed without repair), then
    generation.py's entity filter."""
    parsed = read_json(answer)
    if parsed.value is None:
        return Extraction(error=parsed.error)
    if not isinstance(parsed.value, dict):
        return Extraction(error=f"answer is a {type(parsed.value).__name__}, not an object",
                          error_reason=RejectReason.SCHEMA_VIOLATION)
    out = Extraction()
    entities = _as_list(parsed.value.get("entities", []), "entities", out.rejections)
    relations = _as_list(parsed.value.get("relations", []), "relations", out.rejections)
    if not parsed.repaired:
        kept = []
        for entity in entities:
            if entity and isinstance(entity, str) and entity.strip() not in _LLM_BLANKS:
                kept.append(entity)
            else:
                out.rejections.append(Rejection(RejectReason.PLACEHOLDER, f"entity {entity!r}"))
        kept_relations = []
        for relation in relations:
            fields = _triple(relation) if isinstance(relation, dict) else ("",)
            if all(f and isinstance(f, str) and f.strip() not in _LLM_BLANKS for f in fields):
                kept_relations.append(relation)
            else:
                out.rejections.append(Rejection(RejectReason.PLACEHOLDER, f"relation {relation!r}"))
        if not kept:
            out.rejections += [Rejection(RejectReason.EMPTY_EXTRACTION,
                                         f"relation {r!r}: the answer kept no entity")
                               for r in kept_relations]
            kept_relations = []
        entities, relations = kept, kept_relations
    for entity in entities:
        text = str(entity).strip()  # str(): a repaired answer may hold any JSON value
        if text.lower() not in _ENTITY_PLACEHOLDERS and len(text) >= 2:
            out.entities.append(text)
        else:
            out.rejections.append(Rejection(RejectReason.PLACEHOLDER, f"entity {text!r}"))
    for relation in relations:
        # Only a repaired answer gets here with these (their code would raise on them).
        if not isinstance(relation, dict) or not _string_fields(
                relation, ("subject", "relation_type", "object")):
            out.rejections.append(Rejection(RejectReason.WRONG_TYPE, f"relation {relation!r:.80}"))
            continue
        out.relations.append(relation)
    return out


# ---------------------------------------------------------------------------------------
# Entity foils (generation.generate_entity_negatives_batched)
# ---------------------------------------------------------------------------------------

_BAD_PATTERNS = frozenset({"x", "y", "z", "variant", "alternative", "example", "string",
                           "object", "...", "___", "false", "placeholder", "true", "none",
                           "null", "variant1", "variant2", "variente1", "variente2"})
_GENERIC_TERMS = frozenset({"item", "thing", "stuff", "vehicle", "device", "product",
                            "something", "anything"})
# Matched as substrings of the lower-cased entity and foil, in either direction.
SYNONYM_PAIRS = (
    ("car", "automobile"), ("car", "auto"), ("bike", "bicycle"), ("boat", "ship"),
    ("boat", "canoe"), ("boat", "kayak"), ("plane", "airplane"), ("plane", "aircraft"),
    ("couch", "sofa"), ("sofa", "couch"), ("cup", "mug"), ("curtain", "drape"),
    ("rug", "carpet"), ("pants", "trousers"), ("shirt", "top"), ("sweater", "jumper"),
    ("sneakers", "trainers"), ("cap", "hat"), ("puppy", "dog"), ("kitten", "cat"),
    ("pup", "dog"), ("guy", "man"), ("lady", "woman"), ("kid", "child"), ("infant", "baby"),
    ("teen", "teenager"), ("big", "large"), ("small", "little"), ("tiny", "small"),
    ("happy", "joyful"), ("sad", "unhappy"), ("angry", "mad"), ("fast", "quick"),
    ("slow", "sluggish"), ("rock", "stone"), ("woods", "forest"), ("road", "street"),
    ("store", "shop"), ("movie", "film"),
)


def _too_similar(original: str, foil: str) -> tuple[RejectReason, str] | None:
    orig, neg = original.lower().strip(), foil.lower().strip()
    for a, b in SYNONYM_PAIRS:
        if (a in orig and b in neg) or (b in orig and a in neg):
            return RejectReason.FOIL_IS_SYNONYM, f"synonym pair {a}/{b}"
    if re.sub(r"s$", "", orig) == re.sub(r"s$", "", neg) and orig != neg:
        return RejectReason.FOIL_ONLY_INFLECTION, "plural only"
    stem = re.sub(r"(ing|ed)$", "", orig)
    if len(stem) > 3 and stem == re.sub(r"(ing|ed)$", "", neg) and orig != neg:
        return RejectReason.FOIL_ONLY_INFLECTION, "-ing/-ed only"
    orig_words, neg_words = set(orig.split()), set(neg.split())
    if orig_words and neg_words and len(orig_words) > 1 and (
            len(orig_words & neg_words) / max(len(orig_words), len(neg_words)) > 0.8):
        return RejectReason.FOIL_IS_SYNONYM, "more than 80% of the words shared"
    return None


def _entity_foil_rejection(foil: str, entity: str, entities: Sequence[str],
                           used: set[str]) -> tuple[RejectReason, str] | None:
    """Their filters, in their order (the first that matches names the reason)."""
    lowered = foil.lower().strip()
    for other in entities:
        other_lowered = other.lower().strip()
        if lowered == other_lowered or lowered in other_lowered or other_lowered in lowered:
            return RejectReason.FOIL_IN_CAPTION, f"equal to or inside entity {other!r}"
    words = set(foil.lower().split())
    for other in entities:
        other_words = set(other.lower().split())
        if other != entity and other_words and len(words & other_words) / len(other_words) > 0.5:
            return RejectReason.FOIL_IN_CAPTION, f"over half the words of entity {other!r}"
    if lowered in used:
        return RejectReason.DUPLICATE_UNIT, "a foil of this caption already"
    similar = _too_similar(entity, foil)
    if similar is not None:
        return similar
    if lowered in _BAD_PATTERNS or len(foil) <= 1:
        return RejectReason.PLACEHOLDER, "placeholder"
    if lowered in _GENERIC_TERMS:
        return RejectReason.FOIL_GENERIC_WORD, "generic word"
    if lowered == entity.lower():
        return RejectReason.FOIL_EQUALS_UNIT, "equal to the entity"
    without_numbers = re.sub(r"\d+", "", entity.lower())
    if without_numbers == re.sub(r"\d+", "", foil.lower()) and without_numbers != "":
        return RejectReason.FOIL_ONLY_INFLECTION, "only a number changed"
    return None


def entity_change_type(change_type: str) -> str:
    """Their keyword mapping of the model's free-text change type."""
    lowered = change_type.lower()
    if any(w in lowered for w in ("entity", "person", "role")):
        return "entity_change"
    if any(w in lowered for w in ("color", "size", "material", "shape", "attribute")):
        return "attribute_change"
    return "object_change"


def entity_foils(entities: Sequence[str], answers: Sequence[str]
                 ) -> tuple[dict[str, list[dict]], list[Rejection]]:
    """`negative_entities` of one caption from its entity calls' answers (in entity
    order): foils are checked against every entity and every foil kept before them in
    the caption; a repeated entity keeps the foils of its last call."""
    used: set[str] = set()
    negatives: dict[str, list[dict]] = {}
    rejections: list[Rejection] = []
    for entity, answer in zip(entities, answers, strict=True):
        kept: list[dict] = []
        parsed = read_json(answer)
        if parsed.value is None:
            rejections.append(Rejection(RejectReason.MALFORMED_JSON,
                                        f"entity {entity!r}: foils answer {parsed.error}"))
        elif not isinstance(parsed.value, dict):
            rejections.append(Rejection(RejectReason.WRONG_TYPE,
                                        f"entity {entity!r}: foils answer is not an object"))
        else:
            variants = _as_list(parsed.value.get("negative_variants", []),
                                f"entity {entity!r}: negative_variants", rejections)
            for variant in variants:
                if not isinstance(variant, dict) or not _string_fields(variant, ("negative", "change_type")):
                    rejections.append(Rejection(RejectReason.WRONG_TYPE,
                                                f"entity {entity!r} -> {variant!r:.80}"))
                    continue
                foil = variant.get("negative", "").strip()
                change_type = variant.get("change_type", "").strip()
                if not foil:
                    rejections.append(Rejection(RejectReason.EMPTY_FOIL, f"entity {entity!r} -> ''"))
                    continue
                rejected = _entity_foil_rejection(foil, entity, entities, used)
                if rejected is not None:
                    reason, why = rejected
                    rejections.append(Rejection(reason, f"entity {entity!r} -> {foil!r}: {why}"))
                    continue
                kept.append({"negative": foil, "change_type": entity_change_type(change_type)})
                used.add(foil.lower().strip())
        if entity in negatives and negatives[entity]:
            rejections += [Rejection(RejectReason.DUPLICATE_UNIT, f"entity {entity!r} -> "
                                     f"{v['negative']!r}: the entity is listed again, its "
                                     "later call's foils replace these") for v in negatives[entity]]
        negatives[entity] = kept
    return negatives, rejections


# ---------------------------------------------------------------------------------------
# Relation foils (generation.generate_relational_negatives_batched)
# ---------------------------------------------------------------------------------------

_RELATION_CHANGES = ("antonym", "negation", "swap")


def _llm_utils_relation_filter(entries: list, rejections: list[Rejection]) -> list:
    # llm_utils, for an answer parsed without repair: complete entries only, negatives of
    # the three change types only (case-sensitive).
    kept = []
    for entry in entries:
        if not isinstance(entry, dict):
            rejections.append(Rejection(RejectReason.WRONG_TYPE, f"relation foils {entry!r:.80}"))
            continue
        names = ("original_relation", "original_subject", "original_object")
        if not all(entry.get(n) and isinstance(entry.get(n), str) and entry.get(n).strip()
                   for n in names):
            rejections.append(Rejection(RejectReason.MISSING_FIELD, f"relation foils {entry!r:.80}"))
            continue
        negatives = entry.get("negatives") or []
        valid = []
        for negative in negatives if isinstance(negatives, list) else []:
            if isinstance(negative, dict) and negative.get("change_type", "") in _RELATION_CHANGES:
                valid.append(negative)
            else:
                rejections.append(Rejection(RejectReason.UNKNOWN_CHANGE_TYPE,
                                            f"relation foil {negative!r:.100}"))
        kept.append({**entry, "negatives": valid})
    return kept


def _relation_negatives(relation: dict, negatives: list, entities: Sequence[str],
                        rejections: list[Rejection]) -> list[dict]:
    subject, predicate, obj = (v.strip() for v in _triple(relation))
    name = f"relation {subject} {predicate} {obj}"
    for negative in negatives[MAX_NEGATIVES_PER_RELATION:]:
        rejections.append(Rejection(RejectReason.TOO_MANY_UNITS,
                                    f"{name}: foil {negative!r:.80} after the first 5"))
    kept = []
    for negative in negatives[:MAX_NEGATIVES_PER_RELATION]:
        if not isinstance(negative, dict) or not isinstance(negative.get("change_type", ""), str):
            rejections.append(Rejection(RejectReason.WRONG_TYPE, f"{name}: foil {negative!r:.80}"))
            continue
        change_type = negative.get("change_type", "").lower()
        # A null (their schema allows it) reads as absent; their code would raise on it.
        if change_type == "swap":
            swap_subject = (negative.get("swap_subject") or "").strip()
            swap_object = (negative.get("swap_object") or "").strip()
            if swap_subject in entities and swap_object in entities:
                kept.append({"subject": swap_subject, "relation_type": predicate,
                             "object": swap_object, "change_type": "subject_object_swap"})
            else:
                rejections.append(Rejection(RejectReason.SWAP_ARGUMENT_NOT_ENTITY, (
                    f"{name}: swap {swap_subject!r}/{swap_object!r}: not both listed entities")))
            continue
        new_predicate = (negative.get("relation_type") or "").strip()
        if new_predicate and new_predicate != predicate:
            kept.append({"subject": subject, "relation_type": new_predicate, "object": obj,
                         "change_type": change_type if change_type in ("antonym", "negation")
                         else "antonym"})
        else:
            reason = RejectReason.FOIL_EQUALS_UNIT if new_predicate else RejectReason.EMPTY_FOIL
            rejections.append(Rejection(reason, f"{name}: foil predicate {new_predicate!r}"))
    return kept


def relation_foils(extraction: Extraction, answer: str) -> tuple[list[dict], list[Rejection]]:
    """The relations of a caption after its relation call: the first 8 only (their
    output keeps no other), each with `negatives`."""
    rejections = [Rejection(RejectReason.TOO_MANY_UNITS,
                            f"relation {' '.join(_triple(r))}: after the first 8, dropped")
                  for r in extraction.relations[MAX_RELATIONS_WITH_FOILS:]]
    relations = extraction.relations[:MAX_RELATIONS_WITH_FOILS]
    parsed = read_json(answer)
    by_triple: dict[tuple[str, str, str], list] = {}
    if parsed.value is None:
        rejections.append(Rejection(RejectReason.MALFORMED_JSON, f"relation foils answer {parsed.error}"))
    elif not isinstance(parsed.value, dict):
        rejections.append(Rejection(RejectReason.WRONG_TYPE, "relation foils answer is not an object"))
    else:
        entries = _as_list(parsed.value.get("relation_negatives", []), "relation_negatives",
                           rejections)
        if not parsed.repaired and "relation_negatives" in parsed.value:
            entries = _llm_utils_relation_filter(entries, rejections)
        for entry in entries:
            names = ("original_relation", "original_subject", "original_object")
            if not isinstance(entry, dict) or not _string_fields(entry, names):
                rejections.append(Rejection(RejectReason.WRONG_TYPE, f"relation foils {entry!r:.80}"))
                continue
            predicate, subject, obj = (entry.get(n, "").strip() for n in names)
            negatives = entry.get("negatives", [])
            if not (predicate and subject and obj):
                rejections.append(Rejection(RejectReason.MISSING_FIELD, f"relation foils {entry!r:.80}"))
            elif not isinstance(negatives, list):
                rejections.append(Rejection(RejectReason.WRONG_TYPE, f"relation foils {entry!r:.80}"))
            else:
                by_triple[(subject, predicate, obj)] = negatives
    matched = set()
    out = []
    for relation in relations:
        key = tuple(v.strip() for v in _triple(relation))
        matched.add(key)
        out.append({**relation, "negatives": _relation_negatives(
            relation, by_triple.get(key, []), extraction.entities, rejections)})
    rejections += [Rejection(RejectReason.UNMATCHED_NEGATIVE,
                             f"relation foils of {' '.join(key)}: no such relation")
                   for key in by_triple if key not in matched]
    return out, rejections


# ---------------------------------------------------------------------------------------
# One caption, all three calls (main.build_structured_entries)
# ---------------------------------------------------------------------------------------

AnswerOf = Callable[[Call], str]


@dataclass
class Derived:
    """A caption after its calls: `entry` in the authors' format, or why there is none."""

    calls: list[tuple[Call, str]] = field(default_factory=list)
    entry: dict | None = None
    stage: str = "validation"
    reason: RejectReason | None = None
    detail: str = ""
    rejections: list[Rejection] = field(default_factory=list)


def planned_calls(sample_id: str, caption_index: int, caption: str, extract_answer: str
                  ) -> list[Call]:
    """Calls two and three, which follow from the first call's answer."""
    extraction = read_extraction(extract_answer)
    calls = entity_calls(sample_id, caption_index, caption, extraction.entities)
    relation = relation_call(sample_id, caption_index, caption, extraction)
    return calls + ([relation] if relation is not None else [])


def derive(sample_id: str, caption_index: int, caption: str, image_path: str | None,
           answer_of: AnswerOf) -> Derived:
    """Every call of one caption, answered by `answer_of`, and the caption's entry."""
    out = Derived()

    def ask(call: Call) -> str:
        answer = answer_of(call)
        out.calls.append((call, answer))
        return answer

    try:
        extraction = read_extraction(ask(extract_call(sample_id, caption_index, caption)))
        out.rejections += extraction.rejections
        calls = entity_calls(sample_id, caption_index, caption, extraction.entities)
        negatives, rejected = entity_foils(extraction.entities, [ask(c) for c in calls])
        out.rejections += rejected
        call = relation_call(sample_id, caption_index, caption, extraction)
        if call is not None:
            relations, rejected = relation_foils(extraction, ask(call))
            out.rejections += rejected
        else:
            # No relation call: every relation kept, `negatives` added unless it has one.
            relations = [dict(r) if "negatives" in r else {**r, "negatives": []}
                         for r in extraction.relations]
    except MissingAnswer as missing:
        out.stage, out.reason, out.detail = "inference", RejectReason.INFERENCE_ERROR, str(missing)
        return out
    if not extraction.entities:
        out.stage = "parse" if extraction.error else "validation"
        out.reason = extraction.error_reason if extraction.error else RejectReason.EMPTY_EXTRACTION
        out.detail = extraction.error or "no entities"
        return out
    if any(e.strip() in ("", "...", ".") for e in extraction.entities):
        out.reason, out.detail = RejectReason.PLACEHOLDER, "a placeholder entity"
        return out
    out.entry = {"sample_id": sample_id, "original_caption": prompt_caption(caption),
                 "entities": extraction.entities, "negative_entities": negatives,
                 "image_path": image_path, "relations": relations}
    return out

"""Prompts and the answer schema of the LLM unit extraction (SPEC §2).

SPEC §2 uses three calls (extraction, entity foils per entity, relation foils). We combine
them into ONE call per caption whose answer holds the units and their foils: the caption
and the long few-shot prefix are prefilled once instead of 2 + #entities times, and the
model still writes each foil after the unit it edits, so it conditions on the same
context as the separate calls did. See docs/extraction_pipeline.md for the token budget.
A failed answer may get one repair call that shows the model its answer and the error.
"""

from __future__ import annotations

import json

from csclip.units import ENTITY_CHANGES, MAX_ENTITIES, MAX_RELATIONS, ChangeType

# Relation foils the LLM writes; subject/object replacements are built later from entity
# foils by the sampler (SPEC §3), so the model never has to produce them.
LLM_RELATION_CHANGES = (ChangeType.ANTONYM, ChangeType.NEGATION, ChangeType.SUBJECT_OBJECT_SWAP)
MAX_FOILS = 3

_STR = {"type": "string", "minLength": 1}
_TRIPLE = {"subject": _STR, "predicate": _STR, "object": _STR}
UNITS_ANSWER_SCHEMA: dict = {
    "type": "object",
    "properties": {
        "entities": {
            "type": "array",
            "maxItems": MAX_ENTITIES,
            "items": {
                "type": "object",
                "properties": {
                    "entity": _STR,
                    "foils": {
                        "type": "array",
                        "maxItems": MAX_FOILS,
                        "items": {
                            "type": "object",
                            "properties": {
                                "foil": _STR,
                                "change_type": {"type": "string",
                                                "enum": sorted(c.value for c in ENTITY_CHANGES)},
                            },
                            "required": ["foil", "change_type"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["entity", "foils"],
                "additionalProperties": False,
            },
        },
        "relations": {
            "type": "array",
            "maxItems": MAX_RELATIONS,
            "items": {
                "type": "object",
                "properties": {
                    **_TRIPLE,
                    "foils": {
                        "type": "array",
                        "maxItems": MAX_FOILS,
                        "items": {
                            "type": "object",
                            "properties": {
                                **_TRIPLE,
                                "change_type": {"type": "string",
                                                "enum": [c.value for c in LLM_RELATION_CHANGES]},
                            },
                            "required": ["subject", "predicate", "object", "change_type"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["subject", "predicate", "object", "foils"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["entities", "relations"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = """You decompose image captions into units and write foils for them.

Units:
- An entity is an object with the attributes the caption gives it, copied from the caption:
  "brown horse", "three dogs", "wooden table". Keep counts and attributes with their object.
  Entities must not overlap; do not split "red bus" into "red" and "bus".
- A relation is (subject, predicate, object). Subject and object must be entities of your
  list, written exactly as in the list. The predicate keeps its auxiliary verb so that
  "subject predicate object" reads as a clause: "is riding", "is on", "is next to".
- Extract only what the caption says. At most 12 entities and 12 relations.

Foils are minimal, realistic edits that make a unit false for the image:
- Entity foils (2-3 per entity): attribute_change changes one attribute (color, count,
  size, state, material); object_change replaces the noun by another of the same category
  (horse -> cow, table -> desk). Never a synonym, never only singular/plural, never a
  generic word (thing, object, item), never an entity the caption already mentions.
- Relation foils (2-3 per relation), in this order: antonym (opposite predicate: "is on"
  -> "is under"), negation ("is holding" -> "is not holding"), and subject_object_swap
  (swap subject and object, same predicate) only when the swapped scene looks different.
  Every relation foil gives the full edited subject, predicate and object.

Answer with JSON only.

Example caption: "A man riding a brown horse on a beach."
Example answer: {"entities": [{"entity": "man", "foils": [{"foil": "woman", "change_type": "object_change"}, {"foil": "boy", "change_type": "object_change"}]}, {"entity": "brown horse", "foils": [{"foil": "white horse", "change_type": "attribute_change"}, {"foil": "brown cow", "change_type": "object_change"}]}, {"entity": "beach", "foils": [{"foil": "snowfield", "change_type": "object_change"}, {"foil": "rocky beach", "change_type": "attribute_change"}]}], "relations": [{"subject": "man", "predicate": "is riding", "object": "brown horse", "foils": [{"subject": "man", "predicate": "is walking beside", "object": "brown horse", "change_type": "antonym"}, {"subject": "man", "predicate": "is not riding", "object": "brown horse", "change_type": "negation"}, {"subject": "brown horse", "predicate": "is riding", "object": "man", "change_type": "subject_object_swap"}]}, {"subject": "brown horse", "predicate": "is on", "object": "beach", "foils": [{"subject": "brown horse", "predicate": "is off", "object": "beach", "change_type": "antonym"}, {"subject": "brown horse", "predicate": "is not on", "object": "beach", "change_type": "negation"}]}]}

Example caption: "Two cats sleeping under a wooden table."
Example answer: {"entities": [{"entity": "two cats", "foils": [{"foil": "three cats", "change_type": "attribute_change"}, {"foil": "two dogs", "change_type": "object_change"}]}, {"entity": "wooden table", "foils": [{"foil": "glass table", "change_type": "attribute_change"}, {"foil": "wooden chair", "change_type": "object_change"}]}], "relations": [{"subject": "two cats", "predicate": "are sleeping under", "object": "wooden table", "foils": [{"subject": "two cats", "predicate": "are sleeping on", "object": "wooden table", "change_type": "antonym"}, {"subject": "two cats", "predicate": "are not sleeping under", "object": "wooden table", "change_type": "negation"}]}]}
"""


def user_prompt(caption: str) -> str:
    # json.dumps quotes and escapes the caption, so quotes inside it cannot end it early.
    return f"Caption: {json.dumps(caption.strip())}\nAnswer:"


def extraction_messages(caption: str) -> list[dict[str, str]]:
    """Chat messages for one caption. The system prompt is identical for every caption,
    so vLLM's prefix cache prefills it once per engine."""
    return [{"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user_prompt(caption)}]


def repair_messages(caption: str, answer: str, error: str) -> list[dict[str, str]]:
    """The second and last chance: the model sees its answer and why it was rejected."""
    return extraction_messages(caption) + [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": (
            f"That answer was rejected: {error}. Write the corrected JSON for the same "
            "caption, following every rule above.")},
    ]

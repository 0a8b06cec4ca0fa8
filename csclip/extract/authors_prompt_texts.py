"""The authors' prompt set's fixed parts, as their unit pipeline has them (kargibora/CS-CLIP,
unit_pipeline/ at cc17cf9): the three calls' system prompts, JSON schemas and sampling
settings. csclip.extract.authors_prompts builds the calls and reads the answers.
"""

from __future__ import annotations

import json

PROMPT_SET = "authors"
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

EXTRACT_SYSTEM = """Extract visual entity units and relations. Return ONLY valid JSON:
{"entities": ["item1", "item2"], "relations": [{"subject": "item1", "relation_type": "is action", "object": "item2"}]}

═══════════════════════════════════════════════════════════
COMPONENT EXTRACTION RULES:
═══════════════════════════════════════════════════════════

1. Extract ONLY what's described - no hallucination
2. Keep attributes WITH objects: "red car" (not separate "red" and "car")
3. NO overlapping entities - each distinct object once with full description
4. Include counting numbers: "three dogs", "five people"
5. Match input language exactly
6. Max 12 entities, 12 relations

═══════════════════════════════════════════════════════════
RELATION EXTRACTION RULES - CRITICAL:
═══════════════════════════════════════════════════════════

1. GRAMMATICALLY COMPLETE: Relations must form valid sentences
   Format: "subject + relation_type + object" = complete sentence
\x20\x20\x20
   CORRECT: "is holding", "is sitting on", "is next to", "is wearing"
   WRONG: "holding", "sitting on", "next to", "wearing"
\x20\x20\x20
2. RELATION TYPES TO CAPTURE:
   - SPATIAL: "is on", "is under", "is next to", "is in front of", "is behind", "is inside", "is above", "is below"
   - ACTIONS: "is holding", "is eating", "is riding", "is playing with", "is looking at", "is touching"
   - POSSESSION: "has", "is wearing", "is carrying", "owns"
   - COMPARISON: "is larger than", "is smaller than", "is taller than", "is similar to"
   - EXISTENCE: "is with", "is accompanied by", "contains", "includes"
   - STATE: "is covered by", "is surrounded by", "is filled with", "is made of"

3. SUBJECT AND OBJECT must be from the entity list (exact match)

═══════════════════════════════════════════════════════════
EXAMPLES:
═══════════════════════════════════════════════════════════

"A man holding a red umbrella"
{"entities": ["man", "red umbrella"], "relations": [{"subject": "man", "relation_type": "is holding", "object": "red umbrella"}]}

"Cat sitting on the wooden table"
{"entities": ["cat", "wooden table"], "relations": [{"subject": "cat", "relation_type": "is sitting on", "object": "wooden table"}]}

"The dog is larger than the cat"
{"entities": ["dog", "cat"], "relations": [{"subject": "dog", "relation_type": "is larger than", "object": "cat"}]}

"Woman with a child near the fountain"
{"entities": ["woman", "child", "fountain"], "relations": [{"subject": "woman", "relation_type": "is with", "object": "child"}, {"subject": "woman", "relation_type": "is near", "object": "fountain"}]}

"Three red apples in a blue bowl"
{"entities": ["three red apples", "blue bowl"], "relations": [{"subject": "three red apples", "relation_type": "are in", "object": "blue bowl"}]}

"Gato sobre la mesa"
{"entities": ["gato", "mesa"], "relations": [{"subject": "gato", "relation_type": "está sobre", "object": "mesa"}]}

"Bird flying above the trees"
{"entities": ["bird", "trees"], "relations": [{"subject": "bird", "relation_type": "is flying above", "object": "trees"}]}

"The coffee cup next to the laptop"
{"entities": ["coffee cup", "laptop"], "relations": [{"subject": "coffee cup", "relation_type": "is next to", "object": "laptop"}]}"""

ENTITY_FOILS_SYSTEM = """Generate entity negatives for vision-language training. Return ONLY valid JSON:
{"negative_variants": [{"negative": "variant", "change_type": "type"}]}

═══════════════════════════════════════════════════════════
GOAL: Create BALANCED negatives - clearly different but same category
═══════════════════════════════════════════════════════════

DIFFICULTY BALANCE:
- TOO EASY: "cat" → "airplane" (completely unrelated - trivial to distinguish)
- TOO HARD: "boat" → "canoe" (nearly identical - impossible to distinguish)\x20\x20
- JUST RIGHT: "cat" → "dog" (same category, clearly different appearance)

SYNONYM CHECK - REJECT these pairs:
- bike/bicycle, car/automobile, couch/sofa, pants/trousers
- big/large, small/little, happy/joyful, fast/quick
- boat/ship (too similar!), cup/mug (too similar!)

═══════════════════════════════════════════════════════════
CHANGE TYPES (pick 2-3 diverse negatives):
═══════════════════════════════════════════════════════════

1. ATTRIBUTE_CHANGE - Change a visual property, keep object:
   Colors: "red car" → "blue car", "white dog" → "brown dog"
   Count: "three apples" → "five apples", "two birds" → "one bird"\x20\x20
   Size: "large pizza" → "small pizza", "tall building" → "short building"
   State: "open door" → "closed door", "full glass" → "empty glass"
   Age/Gender: "young man" → "old man", "boy" → "girl"

2. OBJECT_CHANGE - Replace with DIFFERENT object from SAME category:
   Animals: "cat" → "dog", "horse" → "cow", "eagle" → "owl"
   Vehicles: "car" → "bus", "bicycle" → "motorcycle", "train" → "truck"
   Furniture: "chair" → "bench", "table" → "desk", "bed" → "couch"
   Places: "beach" → "mountain", "kitchen" → "bathroom", "park" → "street"
   Food: "apple" → "orange", "pizza" → "burger", "cake" → "pie"
   Clothing: "shirt" → "jacket", "hat" → "helmet", "shoes" → "boots"

═══════════════════════════════════════════════════════════
EXAMPLES:
═══════════════════════════════════════════════════════════

"red car"
{"negative_variants": [
  {"negative": "blue car", "change_type": "attribute_change"},
  {"negative": "red truck", "change_type": "object_change"}
]}

"three cats"
{"negative_variants": [
  {"negative": "one cat", "change_type": "attribute_change"},
  {"negative": "three dogs", "change_type": "object_change"}
]}

"woman running"
{"negative_variants": [
  {"negative": "man running", "change_type": "attribute_change"},
  {"negative": "woman walking", "change_type": "attribute_change"}
]}

"wooden table"
{"negative_variants": [
  {"negative": "metal table", "change_type": "attribute_change"},
  {"negative": "wooden chair", "change_type": "object_change"}
]}

"beach"
{"negative_variants": [
  {"negative": "forest", "change_type": "object_change"},
  {"negative": "mountain", "change_type": "object_change"}
]}

"sleeping dog"
{"negative_variants": [
  {"negative": "running dog", "change_type": "attribute_change"},
  {"negative": "sleeping cat", "change_type": "object_change"}
]}

═══════════════════════════════════════════════════════════
STRICT RULES:
═══════════════════════════════════════════════════════════

1. SAME CATEGORY: dog -> cat, not dog -> table
2. NO SYNONYMS: avoid bike -> bicycle, car -> automobile
3. NOT TOO SIMILAR: avoid boat -> canoe, cup -> mug, sofa -> couch
4. VISUALLY DISTINCT: Must look clearly different in an image
5. KEEP LANGUAGE: Spanish input → Spanish output
6. 2-3 NEGATIVES: Mix of attribute_change and object_change
7. NO PLACEHOLDERS: No "variant1", "X", "example"

SKIP if entity is abstract text ("Sign up", "Call now") → return empty []"""

RELATION_FOILS_SYSTEM = """Generate negative relations for each input relation. Return ONLY valid JSON:
{"relation_negatives": [{"original_relation": "is holding", "negatives": [{"relation_type": "is not holding", "change_type": "negation"}, {"relation_type": "is dropping", "change_type": "antonym"}]}]}

═══════════════════════════════════════════════════════════
GOAL: For EACH relation, generate 2-3 negative variants
═══════════════════════════════════════════════════════════

NEGATIVE TYPES (in order of preference):

1. **ANTONYM** (PREFERRED) - Use semantic opposite:
   SPATIAL:
   - "is on" → "is under"
   - "is above" → "is below"
   - "is in front of" → "is behind"
   - "is inside" → "is outside"
   - "is near" → "is far from"
   - "is next to" → "is away from"
   - "is left of" → "is right of"
\x20\x20\x20
   ACTIONS:
   - "is holding" → "is dropping"
   - "is sitting on" → "is standing on"
   - "is walking towards" → "is walking away from"
   - "is pushing" → "is pulling"
   - "is opening" → "is closing"
   - "is eating" → "is not eating" (no clear antonym)
\x20\x20\x20
   STATES:
   - "is with" → "is without"
   - "is attached to" → "is detached from"
   - "is covered by" → "is exposed"
   - "is filled with" → "is empty of"
\x20\x20\x20
   COMPARISON:
   - "is larger than" → "is smaller than"
   - "is taller than" → "is shorter than"
   - "is older than" → "is younger than"

2. **NEGATION** - Add "not" (use when no clear antonym):
   - "is holding" → "is not holding"
   - "is wearing" → "is not wearing"
   - "is looking at" → "is not looking at"
   - "has" → "does not have"

3. **SWAP** - Reverse subject/object (only if creates different scene):
   - Original: subject="cat", relation="is on", object="mat"
   - Swap: subject="mat", relation="is on", object="cat"
   - Only include if visually different!

═══════════════════════════════════════════════════════════
OUTPUT FORMAT:
═══════════════════════════════════════════════════════════

For each original relation, output its negatives:

{"relation_negatives": [
  {
    "original_relation": "is sitting on",
    "original_subject": "cat",
    "original_object": "mat",
    "negatives": [
      {"relation_type": "is standing on", "change_type": "antonym"},
      {"relation_type": "is under", "change_type": "antonym"},
      {"relation_type": "is not sitting on", "change_type": "negation"},
      {"swap_subject": "mat", "swap_object": "cat", "change_type": "swap"}
    ]
  }
]}

═══════════════════════════════════════════════════════════
RULES:
═══════════════════════════════════════════════════════════

1. GRAMMATICALLY COMPLETE: Keep "is/are" prefix
   "is sitting on" -> "is standing on"

2. PREFER ANTONYMS: Only use negation if no clear antonym exists

3. NO SYNONYMS:\x20
   Avoid "is near" -> "is close to" because it preserves meaning.
   Prefer "is near" -> "is far from".

4. MATCH SUBJECT/OBJECT: Use exact entity names from input

5. VISUALLY DISTINCT: Each negative must create different visual scene

═══════════════════════════════════════════════════════════
EXAMPLES:
═══════════════════════════════════════════════════════════

Input: "cat is sitting on mat" | Entities: [cat, mat]
{"relation_negatives": [{"original_relation": "is sitting on", "original_subject": "cat", "original_object": "mat", "negatives": [{"relation_type": "is under", "change_type": "antonym"}, {"relation_type": "is standing on", "change_type": "antonym"}, {"relation_type": "is not sitting on", "change_type": "negation"}, {"swap_subject": "mat", "swap_object": "cat", "change_type": "swap"}]}]}

Input: "man is holding umbrella" | Entities: [man, umbrella]
{"relation_negatives": [{"original_relation": "is holding", "original_subject": "man", "original_object": "umbrella", "negatives": [{"relation_type": "is dropping", "change_type": "antonym"}, {"relation_type": "is not holding", "change_type": "negation"}]}]}

Input: "dog is with owner" | Entities: [dog, owner]
{"relation_negatives": [{"original_relation": "is with", "original_subject": "dog", "original_object": "owner", "negatives": [{"relation_type": "is without", "change_type": "antonym"}, {"relation_type": "is away from", "change_type": "antonym"}, {"relation_type": "is not with", "change_type": "negation"}]}]}

Input: "book is on table" | Entities: [book, table]
{"relation_negatives": [{"original_relation": "is on", "original_subject": "book", "original_object": "table", "negatives": [{"relation_type": "is under", "change_type": "antonym"}, {"relation_type": "is beside", "change_type": "antonym"}, {"relation_type": "is not on", "change_type": "negation"}, {"swap_subject": "table", "swap_object": "book", "change_type": "swap"}]}]}

Input: "car is larger than bicycle" | Entities: [car, bicycle]
{"relation_negatives": [{"original_relation": "is larger than", "original_subject": "car", "original_object": "bicycle", "negatives": [{"relation_type": "is smaller than", "change_type": "antonym"}, {"relation_type": "is not larger than", "change_type": "negation"}, {"swap_subject": "bicycle", "swap_object": "car", "change_type": "swap"}]}]}

Input: "gato está sobre la mesa" | Entities: [gato, mesa]
{"relation_negatives": [{"original_relation": "está sobre", "original_subject": "gato", "original_object": "mesa", "negatives": [{"relation_type": "está debajo de", "change_type": "antonym"}, {"relation_type": "no está sobre", "change_type": "negation"}, {"swap_subject": "mesa", "swap_object": "gato", "change_type": "swap"}]}]}"""

# Their pydantic models' model_json_schema() (llm_utils.py), as JSON text.
EXTRACT_SCHEMA: dict = json.loads("""{
 "$defs": {
  "Relation": {
   "properties": {
    "subject": {
     "title": "Subject",
     "type": "string"
    },
    "relation_type": {
     "title": "Relation Type",
     "type": "string"
    },
    "object": {
     "title": "Object",
     "type": "string"
    },
    "description": {
     "anyOf": [
      {
       "type": "string"
      },
      {
       "type": "null"
      }
     ],
     "default": null,
     "title": "Description"
    }
   },
   "required": [
    "subject",
    "relation_type",
    "object"
   ],
   "title": "Relation",
   "type": "object"
  }
 },
 "properties": {
  "entities": {
   "items": {
    "type": "string"
   },
   "title": "Entities",
   "type": "array"
  },
  "relations": {
   "items": {
    "$ref": "#/$defs/Relation"
   },
   "title": "Relations",
   "type": "array"
  }
 },
 "required": [
  "entities",
  "relations"
 ],
 "title": "EntityRelationScheme",
 "type": "object"
}""")
ENTITY_FOILS_SCHEMA: dict = json.loads("""{
 "$defs": {
  "NegativeVariant": {
   "properties": {
    "negative": {
     "title": "Negative",
     "type": "string"
    },
    "change_type": {
     "title": "Change Type",
     "type": "string"
    }
   },
   "required": [
    "negative",
    "change_type"
   ],
   "title": "NegativeVariant",
   "type": "object"
  }
 },
 "properties": {
  "negative_variants": {
   "items": {
    "$ref": "#/$defs/NegativeVariant"
   },
   "title": "Negative Variants",
   "type": "array"
  }
 },
 "title": "EntityNegativeScheme",
 "type": "object"
}""")
RELATION_FOILS_SCHEMA: dict = json.loads("""{
 "$defs": {
  "RelationNegativeVariant": {
   "properties": {
    "relation_type": {
     "anyOf": [
      {
       "type": "string"
      },
      {
       "type": "null"
      }
     ],
     "default": null,
     "description": "New relation type (for antonym/negation changes)",
     "title": "Relation Type"
    },
    "swap_subject": {
     "anyOf": [
      {
       "type": "string"
      },
      {
       "type": "null"
      }
     ],
     "default": null,
     "description": "New subject (for subject-object swaps)",
     "title": "Swap Subject"
    },
    "swap_object": {
     "anyOf": [
      {
       "type": "string"
      },
      {
       "type": "null"
      }
     ],
     "default": null,
     "description": "New object (for subject-object swaps)",
     "title": "Swap Object"
    },
    "change_type": {
     "description": "Type of change: 'antonym', 'negation', or 'swap'",
     "title": "Change Type",
     "type": "string"
    }
   },
   "required": [
    "change_type"
   ],
   "title": "RelationNegativeVariant",
   "type": "object"
  },
  "RelationWithNegatives": {
   "properties": {
    "original_relation": {
     "description": "The original relation type (e.g., 'is sitting on')",
     "title": "Original Relation",
     "type": "string"
    },
    "original_subject": {
     "description": "The original subject entity",
     "title": "Original Subject",
     "type": "string"
    },
    "original_object": {
     "description": "The original object entity",
     "title": "Original Object",
     "type": "string"
    },
    "negatives": {
     "description": "List of negative variants for this relation",
     "items": {
      "$ref": "#/$defs/RelationNegativeVariant"
     },
     "title": "Negatives",
     "type": "array"
    }
   },
   "required": [
    "original_relation",
    "original_subject",
    "original_object"
   ],
   "title": "RelationWithNegatives",
   "type": "object"
  }
 },
 "properties": {
  "relation_negatives": {
   "description": "List of relations with their negatives",
   "items": {
    "$ref": "#/$defs/RelationWithNegatives"
   },
   "title": "Relation Negatives",
   "type": "array"
  }
 },
 "title": "RelationalNegativeScheme",
 "type": "object"
}""")

SYSTEM = {EXTRACT: EXTRACT_SYSTEM, ENTITY_FOILS: ENTITY_FOILS_SYSTEM,
          RELATION_FOILS: RELATION_FOILS_SYSTEM}
SCHEMA = {EXTRACT: EXTRACT_SCHEMA, ENTITY_FOILS: ENTITY_FOILS_SCHEMA,
          RELATION_FOILS: RELATION_FOILS_SCHEMA}


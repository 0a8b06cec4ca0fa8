"""The units data model (SPEC §2): captions, entity and relation units, foils, their
validation and the Arrow schema of the units table."""

from __future__ import annotations

import functools
import json
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from csclip.errors import DataError
from csclip.storage import exists, filesystem_for, is_dir, list_files, read_bytes


class ChangeType(StrEnum):
    """How a foil edits its unit (SPEC §2 table)."""

    ATTRIBUTE_CHANGE = "attribute_change"
    OBJECT_CHANGE = "object_change"
    ANTONYM = "antonym"
    NEGATION = "negation"
    SUBJECT_OBJECT_SWAP = "subject_object_swap"
    SUBJECT_REPLACE = "subject_replace"
    OBJECT_REPLACE = "object_replace"


ENTITY_CHANGES = frozenset({ChangeType.ATTRIBUTE_CHANGE, ChangeType.OBJECT_CHANGE})
RELATION_CHANGES = frozenset(set(ChangeType) - ENTITY_CHANGES)
# Predicate-only edits: the foil keeps subject and object.


class RejectReason(StrEnum):
    """Why a unit, foil or whole record was rejected. A fixed vocabulary, so rejects tables
    can be grouped and counted."""

    EMPTY_CAPTION = "empty_caption"
    EMPTY_EXTRACTION = "empty_extraction"
    MISSING_FIELD = "missing_field"
    WRONG_TYPE = "wrong_type"
    UNKNOWN_CHANGE_TYPE = "unknown_change_type"
    CHANGE_TYPE_MISMATCH = "change_type_mismatch"
    EMPTY_FOIL = "empty_foil"
    PLACEHOLDER = "placeholder"
    FOIL_EQUALS_UNIT = "foil_equals_unit"
    FOIL_IS_SYNONYM = "foil_is_synonym"
    FOIL_ONLY_INFLECTION = "foil_only_inflection"
    FOIL_GENERIC_WORD = "foil_generic_word"
    FOIL_IN_CAPTION = "foil_in_caption"
    SWAP_ARGUMENT_NOT_ENTITY = "swap_argument_not_entity"
    RELATION_ARGUMENT_NOT_ENTITY = "relation_argument_not_entity"
    DUPLICATE_UNIT = "duplicate_unit"
    TOO_MANY_UNITS = "too_many_units"
    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    INFERENCE_ERROR = "inference_error"
    UNPARSED = "unparsed"
    ENTITY_NOT_IN_CAPTION = "entity_not_in_caption"  # an LLM entity the caption never says
    UNMATCHED_NEGATIVE = "unmatched_negative"  # a stored negative of no unit of its record
    PROMPT_TOO_LONG = "prompt_too_long"  # prompt + max_tokens exceed the model's context
    CAPTION_TOO_LONG = "caption_too_long"  # past the rules backend's cap


MAX_ENTITIES = 12
MAX_RELATIONS = 12

GENERIC_WORDS = frozenset(
    {"thing", "things", "object", "objects", "item", "items", "stuff", "something",
     "entity", "entities", "someone", "somebody", "anything", "element", "part"}
)
PLACEHOLDER_PATTERN = re.compile(
    r"^(n/?a|none|null|unknown|tbd|todo|\.\.\.|…|-+|_+|\?+|<[^>]*>|\[[^\]]*\]|\{[^}]*\}|"
    r"(entity|foil|object|subject|predicate|negative)\s*_?\d*)$",
    re.IGNORECASE,
)
# Small synonym sets for the words captions use most; a foil that only swaps within a set
# is still true of the image. Extend here, never in callers.
SYNONYM_SETS: tuple[frozenset[str], ...] = tuple(
    frozenset(s.split())
    for s in (
        "man guy gentleman male",
        "woman lady female",
        "kid child youngster",
        "boy lad",
        "girl lass",
        "person individual human",
        "people persons folks",
        "big large huge giant",
        "small little tiny",
        "couch sofa",
        "automobile car",
        "bike bicycle",
        "motorbike motorcycle",
        "cellphone phone cell",
        "television tv",
        "plane airplane aeroplane aircraft jet",
        "puppy dog",
        "kitten cat",
        "road street",
        "grey gray",
        "picture photo photograph image",
        "shore beach",
        "atop on",
        "beneath under underneath below",
        "above over",
        "beside next near by",
        "ocean sea",
        "rock stone",
        "square cube",
        "circle disk ball sphere",
    )
)
_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")


@functools.lru_cache(maxsize=1 << 16)
def normalize_text(text: str) -> str:
    """Lower-case, collapse whitespace, strip surrounding punctuation."""
    # Cached: foil validation normalises the same caption and unit texts many times over.
    return " ".join(_WORD.findall(text.lower()))


@functools.lru_cache(maxsize=1 << 16)
def stem_word(word: str) -> str:
    """`word` with one inflection suffix cut (-ing, -es, -ed, -s) and a final -e dropped:
    the form foil checks compare."""
    # Crude number/inflection folding, enough to catch "horse"/"horses", "rides"/"riding".
    for suffix in ("ing", "es", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[: -len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


@functools.lru_cache(maxsize=1 << 16)
def _stems(text: str) -> tuple[str, ...]:
    return tuple(stem_word(w) for w in normalize_text(text).split()
                 if w not in {"a", "an", "the", "is", "are"})


# Each word of SYNONYM_SETS -> every word it shares a set with (itself included).
SYNONYMS_OF: dict[str, frozenset[str]] = {}
for _synonyms in SYNONYM_SETS:
    for _word in _synonyms:
        SYNONYMS_OF[_word] = SYNONYMS_OF.get(_word, frozenset()) | _synonyms


def _are_synonyms(a: str, b: str) -> bool:
    return a != b and b in SYNONYMS_OF.get(a, ())


@dataclass(frozen=True)
class Foil:
    """A minimally edited, false version of a unit. For relation foils, `subject`,
    `predicate` and `object` hold the edited triple and `text` its rendering."""

    text: str
    change_type: ChangeType
    subject: str | None = None
    predicate: str | None = None
    object: str | None = None

    def __post_init__(self) -> None:
        # Accept plain strings; an unknown change_type raises ValueError here, at the source.
        # (The type test first: extractors build ~10 foils a caption, and the Enum call is
        # the slow part of a Foil.)
        if type(self.change_type) is not ChangeType:
            object.__setattr__(self, "change_type", ChangeType(self.change_type))

    @staticmethod
    def relation(subject: str, predicate: str, object: str, change_type: ChangeType) -> Foil:
        return Foil(render_relation(subject, predicate, object), change_type,
                    subject, predicate, object)


@dataclass(frozen=True)
class Unit:
    """An entity (`text` = object with attributes) or a relation (subject, predicate,
    object; `text` = "{subject} {predicate} {object}") with its foils."""

    kind: str  # "entity" | "relation"
    text: str
    foils: tuple[Foil, ...] = ()
    subject: str | None = None
    predicate: str | None = None
    object: str | None = None

    @staticmethod
    def entity(text: str, foils: Iterable[Foil] = ()) -> Unit:
        return Unit("entity", text, tuple(foils))

    @staticmethod
    def relation(subject: str, predicate: str, object: str, foils: Iterable[Foil] = ()) -> Unit:
        return Unit("relation", render_relation(subject, predicate, object), tuple(foils),
                    subject, predicate, object)

    def foils_of(self, *change_types: ChangeType) -> list[Foil]:
        return [f for f in self.foils if f.change_type in change_types]


def render_relation(subject: str, predicate: str, object: str) -> str:
    """The text of a relation unit: "{subject} {predicate} {object}" (SPEC §2)."""
    parts = (subject.strip(), predicate.strip(), object.strip())
    return " ".join(part for part in parts if part)


@dataclass(frozen=True)
class UnitsRecord:
    """One caption with its units: one row of the units table."""

    sample_id: str
    image_id: str
    caption: str
    split: str
    entities: tuple[Unit, ...] = ()
    relations: tuple[Unit, ...] = ()
    image_path: str | None = None
    image_bytes: bytes | None = None
    source: str = ""
    meta: dict[str, str] = field(default_factory=dict)

    @property
    def units(self) -> tuple[Unit, ...]:
        return self.entities + self.relations


# ---------------------------------------------------------------------------------------
# Foil validation (SPEC §2: "A foil is rejected when ...")
# ---------------------------------------------------------------------------------------

def contains_phrase(text: str, phrase: str) -> bool:
    """Whether `phrase` occurs in `text` on word boundaries, ignoring case and punctuation."""
    haystack, needle = normalize_text(text), normalize_text(phrase)
    return bool(needle) and f" {needle} " in f" {haystack} "


@functools.lru_cache(maxsize=1 << 16)
def is_placeholder(text: str) -> bool:
    return bool(PLACEHOLDER_PATTERN.match(text.strip()))


def foil_rejection(unit: Unit, foil: Foil, caption: str,
                   caption_entities: Sequence[str] = ()) -> RejectReason | None:
    """Why `foil` is not a valid foil of `unit` in `caption`, or None if it is valid.

    caption_entities: entity texts of the caption (defaults to nothing beyond the caption
    text itself); swaps must use two of them, and a foil naming one of them is true.
    """
    if not foil.text or not foil.text.strip():
        return RejectReason.EMPTY_FOIL
    if is_placeholder(foil.text) or any(
        part is not None and is_placeholder(part) for part in (foil.subject, foil.predicate, foil.object)
    ):
        return RejectReason.PLACEHOLDER
    allowed = ENTITY_CHANGES if unit.kind == "entity" else RELATION_CHANGES
    if foil.change_type not in allowed:
        return RejectReason.CHANGE_TYPE_MISMATCH
    unit_norm, foil_norm = normalize_text(unit.text), normalize_text(foil.text)
    if foil_norm == unit_norm:
        return RejectReason.FOIL_EQUALS_UNIT
    if unit.kind == "relation" and foil.change_type == ChangeType.SUBJECT_OBJECT_SWAP:
        return _swap_rejection(unit, foil, caption_entities)
    unit_words, foil_words = unit_norm.split(), foil_norm.split()
    changed = [(u, f) for u, f in zip(unit_words, foil_words, strict=False) if u != f]
    if len(unit_words) == len(foil_words) and changed and all(_are_synonyms(u, f) for u, f in changed):
        return RejectReason.FOIL_IS_SYNONYM
    if _stems(unit.text) == _stems(foil.text):
        return RejectReason.FOIL_ONLY_INFLECTION
    new_words = set(foil_words) - set(unit_words)
    if new_words and new_words <= GENERIC_WORDS:
        return RejectReason.FOIL_GENERIC_WORD
    if unit.kind == "entity":
        others = [e for e in caption_entities if normalize_text(e) != unit_norm]
        if contains_phrase(caption, foil.text) or any(normalize_text(e) == foil_norm for e in others):
            return RejectReason.FOIL_IN_CAPTION
    else:
        if contains_phrase(caption, foil.text):
            return RejectReason.FOIL_IN_CAPTION
    return None


def _swap_rejection(unit: Unit, foil: Foil, caption_entities: Sequence[str]) -> RejectReason | None:
    # A swap is kept only when both arguments are entities of the caption (SPEC §2).
    names = {normalize_text(e) for e in caption_entities}
    heads = {n.split()[-1] for n in names if n}
    for arg in (unit.subject, unit.object):
        arg_norm = normalize_text(arg or "")
        if arg_norm not in names and arg_norm not in heads:
            return RejectReason.SWAP_ARGUMENT_NOT_ENTITY
    return None


def is_caption_entity(name: str, caption_entities: Sequence[str]) -> bool:
    """Whether a relation argument names an entity of the caption: the entity itself
    ("brown horse") or its head noun phrase ("horse")."""
    target = normalize_text(name)
    if not target:
        return False
    for entity in caption_entities:
        norm = normalize_text(entity)
        if norm == target or norm.endswith(" " + target):
            return True
    return False


@dataclass(frozen=True)
class Rejection:
    """A rejected unit or foil, kept so nothing is dropped silently."""

    reason: RejectReason
    detail: str


def validate_record(record: UnitsRecord) -> tuple[UnitsRecord, list[Rejection]]:
    """Drop invalid units and foils from `record`, returning the cleaned record and one
    Rejection per dropped item. The record itself is rejected (EMPTY_CAPTION /
    EMPTY_EXTRACTION) by the caller when nothing usable remains."""
    rejections: list[Rejection] = []
    entity_texts = [e.text for e in record.entities]
    entities: list[Unit] = []
    seen: set[str] = set()
    for unit in record.entities:
        key = normalize_text(unit.text)
        if not key or is_placeholder(unit.text):
            rejections.append(Rejection(RejectReason.PLACEHOLDER, f"entity {unit.text!r}"))
            continue
        if key in seen:
            rejections.append(Rejection(RejectReason.DUPLICATE_UNIT, f"entity {unit.text!r}"))
            continue
        seen.add(key)
        entities.append(_keep_valid_foils(unit, record.caption, entity_texts, rejections))
    relations: list[Unit] = []
    for unit in record.relations:
        bad_args = [a for a in (unit.subject, unit.object) if not is_caption_entity(a or "", entity_texts)]
        if bad_args or not (unit.predicate or "").strip():
            rejections.append(Rejection(RejectReason.RELATION_ARGUMENT_NOT_ENTITY,
                                        f"relation {unit.text!r}: {bad_args or 'empty predicate'}"))
            continue
        key = normalize_text(unit.text)
        if key in seen:
            rejections.append(Rejection(RejectReason.DUPLICATE_UNIT, f"relation {unit.text!r}"))
            continue
        seen.add(key)
        relations.append(_keep_valid_foils(unit, record.caption, entity_texts, rejections))
    for kind, kept, limit in (("entities", entities, MAX_ENTITIES), ("relations", relations, MAX_RELATIONS)):
        if len(kept) > limit:
            rejections.append(Rejection(RejectReason.TOO_MANY_UNITS, f"{len(kept)} {kind}, kept {limit}"))
            del kept[limit:]
    cleaned = UnitsRecord(
        sample_id=record.sample_id, image_id=record.image_id, caption=record.caption,
        split=record.split, entities=tuple(entities), relations=tuple(relations),
        image_path=record.image_path, image_bytes=record.image_bytes, source=record.source,
        meta=dict(record.meta),
    )
    return cleaned, rejections


def _keep_valid_foils(unit: Unit, caption: str, entity_texts: Sequence[str],
                      rejections: list[Rejection]) -> Unit:
    kept: list[Foil] = []
    for foil in unit.foils:
        reason = foil_rejection(unit, foil, caption, entity_texts)
        if reason is None and foil not in kept:
            kept.append(foil)
        elif reason is not None:
            rejections.append(Rejection(reason, f"{unit.kind} {unit.text!r} -> {foil.text!r} ({foil.change_type})"))
    return Unit(unit.kind, unit.text, tuple(kept), unit.subject, unit.predicate, unit.object)


# ---------------------------------------------------------------------------------------
# The units table: one Arrow schema, one row per caption
# ---------------------------------------------------------------------------------------

FOIL_TYPE = pa.struct([
    ("text", pa.string()),
    ("change_type", pa.string()),
    ("subject", pa.string()),
    ("predicate", pa.string()),
    ("object", pa.string()),
])
UNIT_TYPE = pa.struct([
    ("text", pa.string()),
    ("subject", pa.string()),
    ("predicate", pa.string()),
    ("object", pa.string()),
    ("foils", pa.list_(FOIL_TYPE)),
])
UNITS_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("image_id", pa.string(), nullable=False),
    pa.field("caption", pa.string(), nullable=False),
    pa.field("split", pa.string(), nullable=False),
    pa.field("entities", pa.list_(UNIT_TYPE)),
    pa.field("relations", pa.list_(UNIT_TYPE)),
    pa.field("image_path", pa.string()),
    pa.field("image_bytes", pa.binary()),
    pa.field("source", pa.string()),
    pa.field("meta", pa.map_(pa.string(), pa.string())),
])


def _foil_to_row(foil: Foil) -> dict:
    return {"text": foil.text, "change_type": foil.change_type.value, "subject": foil.subject,
            "predicate": foil.predicate, "object": foil.object}


def _unit_to_row(unit: Unit) -> dict:
    return {"text": unit.text, "subject": unit.subject, "predicate": unit.predicate,
            "object": unit.object, "foils": [_foil_to_row(f) for f in unit.foils]}


def record_to_row(record: UnitsRecord) -> dict:
    """A UnitsRecord as a plain dict matching UNITS_SCHEMA (for Ray Data and pyarrow)."""
    return {
        "sample_id": record.sample_id, "image_id": record.image_id, "caption": record.caption,
        "split": record.split,
        "entities": [_unit_to_row(u) for u in record.entities],
        "relations": [_unit_to_row(u) for u in record.relations],
        "image_path": record.image_path, "image_bytes": record.image_bytes,
        "source": record.source, "meta": sorted(record.meta.items()),
    }


# The members by value: an Enum call per foil was a visible share of an epoch's map task
# (every row's units and foils are read back in every epoch).
_CHANGE_TYPES = {member.value: member for member in ChangeType}


def _foil_from_row(row: dict) -> Foil:
    value = row["change_type"]
    change_type = _CHANGE_TYPES.get(value) or ChangeType(value)  # an unknown value raises
    return Foil(row["text"], change_type, row.get("subject"), row.get("predicate"),
                row.get("object"))


def _unit_from_row(kind: str, row: dict) -> Unit:
    return Unit(kind, row["text"], tuple(_foil_from_row(f) for f in row.get("foils") or ()),
                row.get("subject"), row.get("predicate"), row.get("object"))


def record_from_row(row: dict) -> UnitsRecord:
    """Inverse of record_to_row; accepts rows from pyarrow's to_pylist or Ray Data."""
    meta = row.get("meta") or {}
    if not isinstance(meta, dict):  # pyarrow returns maps as lists of (key, value)
        meta = dict(meta)
    image_bytes = row.get("image_bytes")
    return UnitsRecord(
        sample_id=row["sample_id"], image_id=row["image_id"], caption=row["caption"],
        split=row["split"],
        entities=tuple(_unit_from_row("entity", u) for u in row.get("entities") or ()),
        relations=tuple(_unit_from_row("relation", u) for u in row.get("relations") or ()),
        image_path=row.get("image_path"),
        image_bytes=bytes(image_bytes) if image_bytes is not None else None,
        source=row.get("source") or "", meta=meta,
    )


# A record's precomputed caption shuffles (the authors' units: `swap_negatives`, NegCLIP's
# word-order shuffles made once per caption), as JSON in `meta`: one text per stored entry,
# "" for an entry their sampler cannot use, so a draw among them is their draw.
SWAP_NEGATIVES_META = "swap_negatives"


def stored_shuffles(record: UnitsRecord) -> list[str]:
    """The record's precomputed shuffles (SWAP_NEGATIVES_META); [] when it has none."""
    stored = record.meta.get(SWAP_NEGATIVES_META)
    return json.loads(stored) if stored else []


def records_to_table(records: Iterable[UnitsRecord]) -> pa.Table:
    return pa.Table.from_pylist([record_to_row(r) for r in records], schema=UNITS_SCHEMA)


def table_to_records(table: pa.Table) -> list[UnitsRecord]:
    return [record_from_row(row) for row in table.to_pylist()]


def write_units(records: Iterable[UnitsRecord], uri: str, *, filesystem=None) -> None:
    """Write records as one Parquet file at `uri` (local path or s3://)."""
    pq.write_table(records_to_table(records), uri, filesystem=filesystem)


def read_units(uri: str, *, filesystem=None) -> list[UnitsRecord]:
    """Read a units Parquet file or directory of files (local path or s3://), after
    check_units_table. Raises DataError naming the file for what it refuses."""

    if filesystem is None:
        filesystem, uri = filesystem_for(uri)
    check_units_table(filesystem, uri, uri)
    try:
        table = pq.read_table(uri, filesystem=filesystem, schema=UNITS_SCHEMA)
    except FileNotFoundError as err:
        raise DataError(f"units table not found: {uri}") from err
    return table_to_records(table)


# ---------------------------------------------------------------------------------------
# Checks of a units table before it is read (read with schema=UNITS_SCHEMA, pyarrow
# would fill a missing column with nulls and cast what it can)
# ---------------------------------------------------------------------------------------

# Columns a units table may leave out (read as nulls): where the image is, and provenance.
OPTIONAL_UNITS_COLUMNS = frozenset({"image_path", "image_bytes", "source", "meta"})
# An extraction output folder (csclip.extract.pipeline): its manifest, each shard's done
# marker, and the completion marker written after the summary.
EXTRACTION_MANIFEST = "_manifest.json"
EXTRACTION_DONE_DIR = "_done"
EXTRACTION_COMPLETE = "_complete.json"


def _type_problem(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Whether `actual` is not the kind of `expected` (string vs large_string, list vs
    large_list and the names of list items do not matter; a struct may have more fields)."""
    if pa.types.is_string(expected):
        return not (pa.types.is_string(actual) or pa.types.is_large_string(actual))
    if pa.types.is_binary(expected):
        return not (pa.types.is_binary(actual) or pa.types.is_large_binary(actual))
    if pa.types.is_map(expected):
        return not (pa.types.is_map(actual)
                    and not _type_problem(actual.key_type, expected.key_type)
                    and not _type_problem(actual.item_type, expected.item_type))
    if pa.types.is_list(expected):
        return not ((pa.types.is_list(actual) or pa.types.is_large_list(actual))
                    and not _type_problem(actual.value_type, expected.value_type))
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(actual):
            return True
        names = [actual.field(i).name for i in range(actual.num_fields)]
        return any(expected.field(i).name not in names or _type_problem(
            actual.field(expected.field(i).name).type, expected.field(i).type)
            for i in range(expected.num_fields))
    return actual != expected


def units_schema_problems(schema: pa.Schema) -> list[str]:
    """What makes `schema` not a units table's: missing columns, columns of another type
    (an all-null optional column is fine)."""
    missing = [f.name for f in UNITS_SCHEMA
               if f.name not in schema.names and f.name not in OPTIONAL_UNITS_COLUMNS]
    wrong = [f"{f.name} ({schema.field(f.name).type}, expected {f.type})" for f in UNITS_SCHEMA
             if f.name in schema.names and _type_problem(schema.field(f.name).type, f.type)
             and not (f.nullable and pa.types.is_null(schema.field(f.name).type))]
    problems = [f"missing columns {', '.join(missing)}"] if missing else []
    return problems + ([f"wrong types: {', '.join(wrong)}"] if wrong else [])


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def check_units_table(filesystem, path: str, uri: str) -> None:
    """Refuse, in one DataError line naming the file, a units table that would read
    wrong: an extraction output whose run has not finished, a file that is not Parquet
    (corrupt, empty, random bytes), a schema that is not UNITS_SCHEMA's (columns missing
    or of another type), or sample_ids that occur more than once (refused, not dropped:
    every record is counted once)."""

    check_extraction_complete(filesystem, path, uri)
    try:
        import pyarrow.dataset as pads  # noqa: PLC0415  it imports pandas (seconds); the configs import this module

        dataset = pads.dataset(path, filesystem=filesystem, format="parquet")
        fragments = list(dataset.get_fragments())
    except FileNotFoundError as err:
        raise DataError(f"units table not found: {uri}") from err
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{uri}: not a readable Parquet units table ({_first_line(err)})") from err
    if not fragments:
        raise DataError(f"{uri}: no Parquet files there; point it at a units table "
                        "(an extraction's units/ folder or a .parquet file)")
    for fragment in fragments:
        try:
            schema = fragment.physical_schema
        except (pa.ArrowInvalid, OSError) as err:
            raise DataError(f"{fragment.path}: not a readable Parquet file "
                            f"({_first_line(err)})") from err
        problems = units_schema_problems(schema)
        if problems:
            raise DataError(f"{fragment.path}: not a units table: {'; '.join(problems)}")
    try:
        ids = dataset.to_table(columns=["sample_id"]).column("sample_id")
    except (pa.ArrowInvalid, OSError) as err:
        raise DataError(f"{uri}: not a readable Parquet units table ({_first_line(err)})") from err
    counts = pc.value_counts(ids)
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        example = repeated[0]["values"].as_py()
        extra = sum(repeated.field("counts").to_pylist()) - len(repeated)
        raise DataError(f"{uri}: {len(repeated)} sample_ids occur more than once ({extra} "
                        f"extra rows; e.g. {example!r}); each record needs its own sample_id")


def check_extraction_complete(filesystem, path: str, uri: str) -> None:
    """Refuse the units/ folder of an extraction output (or the output folder itself)
    whose run has not written its completion marker, naming how far it got."""

    path = path.rstrip("/")
    root = posixpath.dirname(path) if posixpath.basename(path) == "units" else path
    manifest = posixpath.join(root, EXTRACTION_MANIFEST)
    if not exists(filesystem, manifest) or exists(filesystem,
                                                  posixpath.join(root, EXTRACTION_COMPLETE)):
        return
    try:
        saved = json.loads(read_bytes(filesystem, manifest))
        # Webdataset input has a shard per input shard; caption files are cut by shard_size.
        num_shards = (int(saved["num_shards"]) if "num_shards" in saved
                      else -(-int(saved["num_rows"]) // int(saved["shard_size"])))
    except (ValueError, KeyError, TypeError) as err:
        raise DataError(f"{manifest}: not an extraction manifest ({_first_line(err)})") from err
    done = len(list_files(filesystem, posixpath.join(root, EXTRACTION_DONE_DIR), ".json"))
    where = uri.rstrip("/")
    where = where[: -len("/units")] if where.endswith("/units") else where
    if done >= num_shards:  # killed while summarizing, or written before the marker existed
        raise DataError(f"extraction at {where} has all {num_shards} shards but no "
                        f"{EXTRACTION_COMPLETE}; rerun the same command to finish")
    raise DataError(f"extraction at {where} stopped at shard {done} of {num_shards}; rerun the "
                    "same command to finish")


def units_table_uri(uri: str) -> str:
    """The units table `uri` names: an extraction's output folder (`csclip extract --out`:
    its _manifest.json beside units/) is read through its units/ folder, so what extract
    writes is what --units takes (evaluate, benchmark build, train); anything else as
    given. One resolver for every reader of a units URI."""

    if any(c in uri for c in "*?[") or uri.rstrip("/").endswith(".parquet"):
        return uri
    filesystem, path = filesystem_for(uri)
    path = path.rstrip("/")
    if (posixpath.basename(path) != "units"
            and exists(filesystem, posixpath.join(path, EXTRACTION_MANIFEST))
            and is_dir(filesystem, posixpath.join(path, "units"))):
        return uri.rstrip("/") + "/units"
    return uri


def unit_columns(num_unit_slots: int) -> tuple[str, ...]:
    """The unit and foil token columns of slots 1..N, in encoding order."""
    return (tuple(f"unit_{k}" for k in range(num_unit_slots))
            + tuple(f"foil_{k}" for k in range(num_unit_slots)))

"""The CS-CLIP authors' unit files read into UnitsRecords without loss.

Two key schemas, both written by the authors' code and detected per record:

* training JSON (their unit_pipeline/main.py, the README's "Training JSON Format"):
  `sample_id, original_caption, entities: [str], negative_entities: {entity:
  [{negative, change_type}]}, relations: [{subject, relation_type, object, negatives:
  [...]}], image_path`;
* the older schema (their neg_pipeline/unified_generation.py, read by their sampler and
  half-truth scripts): `positive_components: [str]`, `negative_components: {component:
  [{negative, change_type}] | [str]}`, top-level `relations: [{subject, relation_type,
  object}]` and top-level `negative_relations: [{subject, relation_type, object,
  change_type}]`, matched to a relation as their sampler does: the same (subject, object)
  for a predicate edit, the reversed pair for a swap.

Every change-type name their code writes or accepts maps to a ChangeType
(CHANGE_TYPE_NAMES); a foil that cannot be used (an unknown change type, a bare string,
a negative of no unit of the record) is dropped with a counted reason, never the record.
A record is rejected only when it cannot become one (no caption, entities not a list, ...),
with all its problems listed. A file may be a JSON list, a JSON object keyed by id, or
JSON Lines; `read_authors_units` reads local files, `read_authors_uri` local or s3:// ones,
`read_verbatim_records` reads them as the authors' half-truth builder does (no validation:
the paper protocol of csclip.eval.halftruth). A library module: extraction
(csclip.extract.authors feeds the pipeline) and evaluation both read it.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from csclip import storage
from csclip.errors import DataError
from csclip.units import (
    ENTITY_CHANGES,
    EXTRACTION_MANIFEST,
    SWAP_NEGATIVES_META,
    ChangeType,
    Foil,
    Rejection,
    RejectReason,
    Unit,
    UnitsRecord,
    check_extraction_complete,
    normalize_text,
)

ATTR, OBJ = ChangeType.ATTRIBUTE_CHANGE, ChangeType.OBJECT_CHANGE
# Every change-type name found in the authors' code (lower-cased, stripped), as written by
# their generators or accepted by their sampler and half-truth scripts.
CHANGE_TYPE_NAMES: dict[str, ChangeType] = {
    # Entity foils. unit_pipeline/generation.py normalises the model's words: entity /
    # person / role -> entity_change, color / size / material / shape / attribute ->
    # attribute_change, anything else -> object_change; neg_pipeline/component_negatives.py
    # wrote the raw words (entity, attribute, color, material, object, action, spatial, size,
    # weather, location). We follow their normalisation; entity_change ("woman -> man",
    # "cat -> dog": another entity) is our object_change for training and the csclip
    # protocol. Their half-truth builder matches names exactly and takes only
    # "object_change" for +Obj, Rel:Obj and Subj, so the name as written is kept beside
    # the ChangeType (ENTITY_CHANGE_NAMES_META) for the paper protocol.
    "attribute_change": ATTR, "object_change": OBJ, "entity_change": OBJ,
    "entity": OBJ, "person": OBJ, "role": OBJ,
    "attribute": ATTR, "color": ATTR, "size": ATTR, "material": ATTR, "shape": ATTR,
    "object": OBJ, "action": OBJ, "spatial": OBJ, "weather": OBJ, "location": OBJ,
    # Relation foils. "swap" is what their LLM schema asks for; relation_change,
    # relation_type_change and predicate_change replace the predicate by another one,
    # which their sampler treats like an antonym (one predicate-edit candidate).
    "antonym": ChangeType.ANTONYM, "negation": ChangeType.NEGATION,
    "subject_object_swap": ChangeType.SUBJECT_OBJECT_SWAP, "swap": ChangeType.SUBJECT_OBJECT_SWAP,
    "relation_change": ChangeType.ANTONYM, "relation_type_change": ChangeType.ANTONYM,
    "predicate_change": ChangeType.ANTONYM,
    "subject_replace": ChangeType.SUBJECT_REPLACE, "object_replace": ChangeType.OBJECT_REPLACE,
}
# An entity foil's change type as its file wrote it, where that is not the ChangeType's own
# name (entity_change, color, Object_Change, ...): JSON in UnitsRecord.meta, a list of
# [entity, foil, name]. The paper protocol reads it back (entity_foil_names), as the
# authors' builder compares names exactly (half_truth_vulnerability.py@2325a1c: `==
# 'object_change'` for +Obj, Rel:Obj and Subj); training and the csclip protocol use the
# ChangeType.
ENTITY_CHANGE_NAMES_META = "entity_change_names"
# relation_opposite (the older schema): a negation when the new predicate negates, else an
# antonym, as their half-truth script decides.
RELATION_OPPOSITE = "relation_opposite"
_NEGATING_WORDS = frozenset({"not", "no", "never", "without"})


class RecordError(ValueError):
    """A record that cannot become a UnitsRecord; carries every problem found."""

    def __init__(self, problems: list[Rejection], where: str | None = None):
        details = "; ".join(p.detail for p in problems)
        super().__init__(f"{where}: {details}" if where else details)
        self.problems = problems
        self.reason = problems[0].reason
        self.detail = str(self)


@dataclass(frozen=True)
class ReadRejection:
    """A rejected record or a dropped unit/foil, located in its file."""

    position: str  # "file.json[17]" or "file.jsonl:18"
    sample_id: str | None
    reason: RejectReason
    detail: str


@dataclass
class ReadResult:
    """Records read from one or more files, with every rejection kept and counted:
    `rejections` are whole records, `item_rejections` units and foils of loaded records."""

    records: list[UnitsRecord] = field(default_factory=list)
    rejections: list[ReadRejection] = field(default_factory=list)
    item_rejections: list[ReadRejection] = field(default_factory=list)

    def counts_by_reason(self) -> dict[str, int]:
        return dict(Counter(r.reason.value for r in self.rejections))


@dataclass(frozen=True)
class ParsedRecord:
    """One record of an authors' file: the record and the items dropped from it."""

    record: UnitsRecord
    dropped: list[Rejection]


# ---------------------------------------------------------------------------------------
# One record
# ---------------------------------------------------------------------------------------

class _Reader:
    """Parses one raw record, collecting record-level problems (all of them) and dropped
    items as it goes."""

    def __init__(self, obj: dict, where: str):
        self.obj, self.where = obj, where
        self.problems: list[Rejection] = []
        self.dropped: list[Rejection] = []
        self.written_names: list[tuple[str, str, str]] = []  # ENTITY_CHANGE_NAMES_META

    def problem(self, reason: RejectReason, detail: str) -> None:
        self.problems.append(Rejection(reason, detail))

    def drop(self, reason: RejectReason, where: str, detail: str) -> None:
        self.dropped.append(Rejection(reason, f"{where}: {detail}"))

    def field_of(self, key: str, kind: type, default=None, required: bool = False):
        """obj[key] if it has the type, else `default` with a problem noted."""
        if key not in self.obj:
            if required:
                self.problem(RejectReason.MISSING_FIELD, f"missing key {key!r}")
            return default
        value = self.obj[key]
        if not isinstance(value, kind):
            self.problem(RejectReason.WRONG_TYPE,
                         f"{key!r} must be {kind.__name__}, got {type(value).__name__}")
            return default
        return value

    # -- foils -------------------------------------------------------------------------

    def change_type(self, item: dict, where: str, predicate: str | None = None) -> ChangeType | None:
        raw = item.get("change_type")
        if not isinstance(raw, str) or not raw.strip():
            self.drop(RejectReason.UNKNOWN_CHANGE_TYPE, where, "no change_type")
            return None
        name = raw.strip().lower()
        if name == RELATION_OPPOSITE:
            words = set(normalize_text(predicate or "").split())
            negates = bool(words & _NEGATING_WORDS) or "n't" in (predicate or "")
            return ChangeType.NEGATION if negates else ChangeType.ANTONYM
        if name not in CHANGE_TYPE_NAMES:
            self.drop(RejectReason.UNKNOWN_CHANGE_TYPE, where,
                      f"unknown change_type {raw!r} (the known names: "
                      "csclip.authors.CHANGE_TYPE_NAMES, docs/data_formats.md)")
            return None
        return CHANGE_TYPE_NAMES[name]

    def entity_foils(self, items: object, where: str, entity: str) -> list[Foil]:
        if not isinstance(items, list):
            self.drop(RejectReason.WRONG_TYPE, where, "negatives must be a list")
            return []
        foils = []
        for j, item in enumerate(items):
            at = f"{where}[{j}]"
            if isinstance(item, str):
                # Their sampler accepts bare strings; they carry no change type, and guessing
                # one would mislabel the foil for the half-truth conditions.
                self.drop(RejectReason.UNKNOWN_CHANGE_TYPE, at, f"bare string {item!r} carries no change_type")
                continue
            if not isinstance(item, dict):
                self.drop(RejectReason.WRONG_TYPE, at, "must be an object with negative, change_type")
                continue
            change = self.change_type(item, at)
            text = item.get("negative")
            if change is None:
                continue
            if change not in ENTITY_CHANGES:
                self.drop(RejectReason.CHANGE_TYPE_MISMATCH, at, f"{change} is not an entity change")
            elif not isinstance(text, str) or not text.strip():
                self.drop(RejectReason.EMPTY_FOIL, at, "'negative' is missing or empty")
            else:
                foils.append(Foil(text.strip(), change))
                if item["change_type"] != change.value:
                    self.written_names.append((entity, text.strip(), item["change_type"]))
        return foils

    def relation_foil(self, unit: Unit, item: object, where: str) -> Foil | None:
        """A relation negative: any of subject / relation_type (or predicate) / object
        (or swap_subject / swap_object), the rest taken from the unit; or a full
        `negative` text. A swap with no arguments swaps the unit's."""
        if not isinstance(item, dict):
            self.drop(RejectReason.WRONG_TYPE, where, "must be an object with change_type")
            return None
        predicate_key = "relation_type" if "relation_type" in item else "predicate"
        change = self.change_type(item, where, item.get(predicate_key))
        if change is None:
            return None
        if change in ENTITY_CHANGES:
            self.drop(RejectReason.CHANGE_TYPE_MISMATCH, where, f"{change} is not a relation change")
            return None
        edited = {"subject": item.get("subject", item.get("swap_subject")),
                  "predicate": item.get(predicate_key),
                  "object": item.get("object", item.get("swap_object"))}
        given = {k: v for k, v in edited.items() if v is not None}
        if any(not isinstance(v, str) or not v.strip() for v in given.values()):
            self.drop(RejectReason.WRONG_TYPE, where, "subject, relation_type and object must be non-empty strings")
            return None
        if not given:
            if change == ChangeType.SUBJECT_OBJECT_SWAP:
                return Foil.relation(unit.object or "", unit.predicate or "", unit.subject or "", change)
            text = item.get("negative")
            if isinstance(text, str) and text.strip():
                return Foil(text.strip(), change)
            self.drop(RejectReason.MISSING_FIELD, where, "needs subject, relation_type, object or negative")
            return None
        return Foil.relation(given.get("subject", unit.subject or "").strip(),
                             given.get("predicate", unit.predicate or "").strip(),
                             given.get("object", unit.object or "").strip(), change)

    # -- units -------------------------------------------------------------------------

    def relation(self, obj: object, where: str) -> Unit | None:
        if not isinstance(obj, dict):
            self.drop(RejectReason.WRONG_TYPE, where, "a relation must be an object")
            return None
        predicate_key = "relation_type" if "relation_type" in obj else "predicate"
        parts = [obj.get(k) for k in ("subject", predicate_key, "object")]
        if not all(isinstance(p, str) and p.strip() for p in parts):
            self.drop(RejectReason.MISSING_FIELD, where,
                      f"needs non-empty subject, {predicate_key}, object (got {parts})")
            return None
        unit = Unit.relation(*(p.strip() for p in parts))
        foils = []
        for key in ("negatives", "negative_relations"):
            items = obj.get(key, [])
            if not isinstance(items, list):
                self.drop(RejectReason.WRONG_TYPE, f"{where}.{key}", "must be a list")
                continue
            foils += [f for j, item in enumerate(items)
                      if (f := self.relation_foil(unit, item, f"{where}.{key}[{j}]")) is not None]
        return _with_foils(unit, foils)


def _with_foils(unit: Unit, foils: list[Foil]) -> Unit:
    return Unit(unit.kind, unit.text, (*unit.foils, *foils), unit.subject, unit.predicate, unit.object)


def _infer_split(obj: dict, image_path: str | None, default: str | None,
                 restval_as_train: bool) -> str:
    # The record's own split; else the configured one; else the authors' rule (their
    # COCODataset keeps a sample when "train" / "val" / "test" occurs in its image_path).
    split = obj.get("split") if isinstance(obj.get("split"), str) else None
    if split is None and default is None:
        lowered = (image_path or "").lower()
        split = next((s for s in ("train", "val", "test") if s in lowered), "train")
    split = split or default or "train"
    return "train" if split == "restval" and restval_as_train else split


def parse_record(obj: object, where: str, *, sample_id: str, split: str | None = None,
                 image_root: str | None = None, restval_as_train: bool = True) -> ParsedRecord:
    """One record of either schema. sample_id: the record's own or one made from its
    position. Raises RecordError listing every record-level problem."""
    if not isinstance(obj, dict):
        raise RecordError([Rejection(RejectReason.WRONG_TYPE, f"{where}: a record must be an object, "
                                     f"got {type(obj).__name__}")])
    reader = _Reader(obj, where)
    caption_key = next((k for k in ("original_caption", "caption") if k in obj), "original_caption")
    caption = reader.field_of(caption_key, str, required=True)
    if caption is not None and not caption.strip():
        reader.problem(RejectReason.EMPTY_CAPTION, f"{caption_key!r} is empty")
    older = "positive_components" in obj or "negative_components" in obj
    names_key, negatives_key = (("positive_components", "negative_components") if older
                                else ("entities", "negative_entities"))
    names = reader.field_of(names_key, list, [], required=True)
    negatives = reader.field_of(negatives_key, dict, {})
    relations_raw = reader.field_of("relations", list, [])
    top_negative_relations = reader.field_of("negative_relations", list, [])
    swap_negatives = reader.field_of("swap_negatives", list, None)
    image_path = obj.get("image_path", obj.get("image"))
    if image_path is not None and not isinstance(image_path, str):
        reader.problem(RejectReason.WRONG_TYPE, "'image_path' must be a string")
        image_path = None
    if reader.problems:
        raise RecordError(reader.problems, where)

    entities: list[Unit] = []
    relations: list[Unit] = []
    used_keys: set[str] = set()
    for i, name in enumerate(names):
        at = f"{where}.{names_key}[{i}]"
        if isinstance(name, dict):  # a relation listed among the components
            if (relation := reader.relation(name, at)) is not None:
                relations.append(relation)
            continue
        if not isinstance(name, str) or not name.strip():
            reader.drop(RejectReason.WRONG_TYPE, at, f"an entity must be a non-empty string, got {name!r}")
            continue
        used_keys.add(name)
        foils = reader.entity_foils(negatives.get(name, []), f"{where}.{negatives_key}[{name!r}]",
                                    name.strip())
        entities.append(Unit.entity(name.strip(), foils))
    for i, raw in enumerate(relations_raw):
        if (relation := reader.relation(raw, f"{where}.relations[{i}]")) is not None:
            relations.append(relation)
    relations = _attach_keyed_negatives(reader, relations, negatives, negatives_key, used_keys)
    relations = _attach_top_level_negatives(reader, relations, top_negative_relations)

    sample_split = _infer_split(obj, image_path, split, restval_as_train)
    image_id = obj.get("image_id")
    image_id = str(image_id) if image_id is not None else (
        posixpath.splitext(posixpath.basename(image_path))[0] if image_path else sample_id)
    if image_path and image_root and not _is_absolute(image_path):
        image_path = posixpath.join(image_root, image_path)
    # Their sampler draws one entry and uses it when it is a dict with a non-empty
    # "negative" (utils/sampler.py@98b40c0); any other entry makes that draw fall through.
    meta = {} if not swap_negatives else {SWAP_NEGATIVES_META: json.dumps(
        [(item.get("negative") or "").strip() if isinstance(item, dict)
         and isinstance(item.get("negative") or "", str) else "" for item in swap_negatives])}
    if reader.written_names:
        meta[ENTITY_CHANGE_NAMES_META] = json.dumps(reader.written_names)
    record = UnitsRecord(sample_id, image_id, caption.strip(), sample_split, tuple(entities),
                         tuple(relations), image_path=image_path,
                         source="authors_older_json" if older else "authors_json", meta=meta)
    return ParsedRecord(record, reader.dropped)


_OUR_COCO_ID = re.compile(r"coco-(\d+)-(\d+)")


def authors_entry(entry: dict) -> dict:
    """An entry of the authors' unit format with their sample id: csclip's COCO caption
    `coco-<image>-<sentence>` becomes their `coco_<image>_<sentence>`
    (unit_pipeline/main.py:104@cc17cf9), so their code finds the image by
    `sample_id.rsplit("_", 1)[0]` (their half-truth builder's one sample per image). Other
    ids are kept. The image number stays ours (the COCO id; theirs is the Karpathy file's
    `imgid`, its position in dataset_coco.json): their code never reads the number, only
    groups by it. image_path is already theirs: image root / filepath / filename."""
    found = _OUR_COCO_ID.fullmatch(str(entry.get("sample_id", "")))
    if found is None:
        return entry
    return {**entry, "sample_id": f"coco_{found[1]}_{found[2]}"}


def entity_foil_names(record: UnitsRecord) -> dict[str, tuple[tuple[str, str], ...]]:
    """Each entity's foils as (text, change-type name as its file wrote it): the name kept in
    ENTITY_CHANGE_NAMES_META where the file wrote another than the ChangeType's (entity_change
    stays entity_change), else the ChangeType's value. Entities without foils are left out;
    a repeated entity text keeps its last foils, as a dict keyed by component does."""
    written: dict[tuple[str, str], list[str]] = {}
    for entity, foil, name in json.loads(record.meta.get(ENTITY_CHANGE_NAMES_META) or "[]"):
        written.setdefault((entity, foil), []).append(name)

    def name_of(entity: str, foil: Foil) -> str:
        names = written.get((entity, foil.text), [])
        # Equal texts are interchangeable to the builder; the name must still read as the
        # foil's type (a name whose foil validation dropped is never given to another type).
        match = next((n for n in names
                      if CHANGE_TYPE_NAMES.get(n.strip().lower()) == foil.change_type), None)
        if match is None:
            return foil.change_type.value
        names.remove(match)
        return match

    return {e.text: tuple((f.text, name_of(e.text, f)) for f in e.foils)
            for e in record.entities if e.foils}


def _is_absolute(path: str) -> bool:
    return path.startswith("/") or "://" in path


def _attach_keyed_negatives(reader: _Reader, relations: list[Unit], negatives: dict,
                            negatives_key: str, used_keys: set[str]) -> list[Unit]:
    # Negatives keyed by a relation's text attach to it (an older variant of the schema);
    # a key that names no unit of the record drops its foils, counted.
    by_text = {r.text: i for i, r in enumerate(relations)}
    relations = list(relations)
    for key, items in negatives.items():
        if key in used_keys:
            continue
        at = f"{reader.where}.{negatives_key}[{key!r}]"
        if key in by_text and isinstance(items, list):
            i = by_text[key]
            foils = [f for j, item in enumerate(items)
                     if (f := reader.relation_foil(relations[i], item, f"{at}[{j}]")) is not None]
            relations[i] = _with_foils(relations[i], foils)
            continue
        for j, _ in enumerate(items if isinstance(items, list) else [items]):
            reader.drop(RejectReason.UNMATCHED_NEGATIVE, f"{at}[{j}]", f"no unit {key!r} in the record")
    return relations


def _attach_top_level_negatives(reader: _Reader, relations: list[Unit],
                                items: list) -> list[Unit]:
    # The older schema's top-level negative_relations, matched as the authors' sampler does:
    # a swap to the relation whose (subject, object) it reverses, any other edit to every
    # relation with the same (subject, object).
    relations = list(relations)
    for j, item in enumerate(items):
        at = f"{reader.where}.negative_relations[{j}]"
        if not isinstance(item, dict):
            reader.drop(RejectReason.WRONG_TYPE, at, "must be an object")
            continue
        subject, obj = item.get("subject"), item.get("object")
        if not (isinstance(subject, str) and subject.strip() and isinstance(obj, str) and obj.strip()):
            reader.drop(RejectReason.MISSING_FIELD, at, "needs non-empty subject and object")
            continue
        pair = (normalize_text(subject), normalize_text(obj))
        is_swap = str(item.get("change_type", "")).strip().lower() in ("swap", "subject_object_swap")
        matches = [i for i, r in enumerate(relations)
                   if _arguments(r, reversed_=is_swap) == pair]
        if not matches:
            reader.drop(RejectReason.UNMATCHED_NEGATIVE, at,
                        f"no relation with subject/object {subject!r}/{obj!r}"
                        + (" reversed" if is_swap else ""))
            continue
        for i in matches:
            if (foil := reader.relation_foil(relations[i], item, at)) is not None:
                relations[i] = _with_foils(relations[i], [foil])
    return relations


def _arguments(relation: Unit, reversed_: bool) -> tuple[str, str]:
    pair = (normalize_text(relation.subject or ""), normalize_text(relation.object or ""))
    return pair[::-1] if reversed_ else pair


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------

_GLOB = re.compile(r"[*?\[]")


def _iter_raw(name: str, text: str) -> Iterator[tuple[str, str | None, object]]:
    """Yield (position, key_hint, raw object) from a JSON list, a JSON object keyed by id,
    or JSON Lines. Unparseable JSON Lines are yielded as RecordError objects."""
    stripped = text.lstrip()
    if name.endswith(".jsonl") or (stripped.startswith("{") and "\n{" in stripped and not _is_json(text)):
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield f"{name}:{n}", None, json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{name}:{n}", None, RecordError(
                    [Rejection(RejectReason.MALFORMED_JSON, f"{name}:{n}: {err.msg}")])
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{name}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err
    if isinstance(data, list):
        for i, obj in enumerate(data):
            yield f"{name}[{i}]", None, obj
    elif isinstance(data, dict) and _is_one_record(data):
        yield f"{name}[0]", None, data
    elif isinstance(data, dict):
        for key, obj in data.items():
            yield f"{name}[{key!r}]", str(key), obj
    else:
        raise DataError(f"{name}: expected a JSON list or object of records, got {type(data).__name__}")


def _is_one_record(data: dict) -> bool:
    # Their coco_neg loader also accepts a file holding a single record object.
    return any(k in data for k in ("original_caption", "positive_components", "entities"))


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


@dataclass(frozen=True)
class _Item:
    """One raw record in a file, with the id it will carry."""

    position: str
    sample_id: str
    raw: object


def _items(name: str, text: str) -> Iterator[_Item]:
    stem = posixpath.splitext(posixpath.basename(name))[0]
    for number, (position, key_hint, obj) in enumerate(_iter_raw(name, text)):
        given = obj.get("sample_id", key_hint) if isinstance(obj, dict) else key_hint
        # A record without an id gets one from its position (as the CSV reader does).
        yield _Item(position, str(given) if given is not None else f"{stem}-{number:08d}", obj)


def _parse_items(items: Iterator[_Item], result: ReadResult, **options) -> None:
    seen: dict[str, str] = {}
    for item in items:
        if item.sample_id in seen:
            raise DataError(f"sample_id {item.sample_id!r} occurs twice ({seen[item.sample_id]} and "
                            f"{item.position}); give records unique sample_id values")
        seen[item.sample_id] = item.position
        try:
            if isinstance(item.raw, RecordError):
                raise item.raw
            parsed = parse_record(item.raw, item.position, sample_id=item.sample_id, **options)
        except RecordError as err:
            result.rejections.append(ReadRejection(item.position, item.sample_id, err.reason, err.detail))
            continue
        result.records.append(parsed.record)
        result.item_rejections += [ReadRejection(item.position, item.sample_id, d.reason, d.detail)
                                   for d in parsed.dropped]


def read_authors_units(paths: str | Path | list[str | Path], split: str | None = None) -> ReadResult:
    """Read one or more local authors' unit files (either schema, detected per record).

    split: the split of records that state none (None: from image_path, as the authors'
    loader does, else "train"). Raises DataError when a file is missing or is not JSON at
    all, or a sample_id repeats; malformed records and unusable foils become counted
    rejections.
    """
    result = ReadResult()

    def items() -> Iterator[_Item]:
        for path in [paths] if isinstance(paths, str | Path) else paths:
            path = Path(path)
            if not path.is_file():
                raise DataError(f"unit file not found: {path}")
            refuse_unfinished(pafs.LocalFileSystem(), [str(path.resolve())], str(path))
            yield from _items(path.name, _utf8(path.read_bytes(), str(path)))

    _parse_items(items(), result, split=split)
    return result


def _utf8(data: bytes, path: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text, so not a unit file (byte {err.start}: "
                        f"{err.reason})") from err


def expand_uri(uri: str, endpoint_url: str | None = None) -> list[str]:
    """The files `uri` names, sorted: a file, a directory (its *.json and *.jsonl, as the
    authors' training reads a folder of *.json) or a glob (`*`, `?`, `[...]`; `**` spans
    directories), local or s3://. Raises DataError when nothing matches."""

    fs, path = storage.filesystem_for(uri, endpoint_url)
    if _GLOB.search(path):
        base = path[: _GLOB.search(path).start()].rsplit("/", 1)[0] or "/"
        selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
        files = sorted(info.path for info in fs.get_file_info(selector)
                       if info.type == pafs.FileType.File and _glob_match(info.path, path))
    elif storage.is_dir(fs, path):
        files = sorted(storage.list_files(fs, path, ".json") + storage.list_files(fs, path, ".jsonl"))
    else:
        files = [path]
    if not files:
        raise DataError(f"{uri}: no unit files match; point input.uri at a file, a directory "
                        "of *.json or a glob such as 'units/*.json'")
    return files


def finished_unit_files(uri: str, endpoint_url: str | None = None) -> list[str]:
    """expand_uri's files, refusing those of an extraction that has not finished.

    Our `--out-format authors` writes authors/part-K.json shard by shard; a run killed
    half-way leaves a folder that reads like a complete release. Its completion marker is
    the extraction's _complete.json, written last (atomically) beside authors/ once every
    shard is done (csclip.units.check_extraction_complete): a file whose folder, or that
    folder's parent, holds our _manifest.json is read only with that marker there. The
    authors' own released files come with no manifest and are read as they are.
    Raises DataError naming the extraction and how far it got."""
    files = expand_uri(uri, endpoint_url)
    fs, _ = storage.filesystem_for(uri, endpoint_url)
    refuse_unfinished(fs, files, uri)
    return files


def refuse_unfinished(fs: pafs.FileSystem, files: list[str], uri: str) -> None:
    """Raise DataError when any of `files` (paths on `fs`, named by `uri`) lies in an
    unfinished extraction's output (finished_unit_files)."""
    scheme = uri.split("://", 1)[0] + "://" if "://" in uri else ""
    folders = {posixpath.dirname(path) for path in files}
    for root in sorted(folders | {posixpath.dirname(folder) for folder in folders}):
        if not storage.exists(fs, posixpath.join(root, EXTRACTION_MANIFEST)):
            continue
        try:
            check_extraction_complete(fs, root, scheme + root)
        except DataError as err:
            raise DataError(f"{uri}: unit files of an unfinished extraction ({err})") from err


def _glob_match(candidate: str, pattern: str) -> bool:
    """Whether `candidate` matches `pattern`: `*` and `?` stay within one directory,
    `**` crosses directories, `[...]` is a character class."""
    regex, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            regex.append(".*")
            i += 2
        elif pattern[i] == "*":
            regex.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            regex.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1:end]
            regex.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            regex.append(re.escape(pattern[i]))
            i += 1
    return re.fullmatch("".join(regex), candidate) is not None


def read_authors_uri(uri: str, image_root: str | None = None,
                     endpoint_url: str | None = None, split: str | None = None,
                     restval_as_train: bool = True) -> ReadResult:
    """Every record of the files `uri` names (local or s3://), all splits, relative image
    paths joined to image_root (split, restval_as_train: as parse_record)."""
    fs, _ = storage.filesystem_for(uri, endpoint_url)

    def items() -> Iterator[_Item]:
        for path in finished_unit_files(uri, endpoint_url):
            yield from _items(posixpath.basename(path), _utf8(storage.read_bytes(fs, path), path))

    result = ReadResult()
    _parse_items(items(), result, split=split, image_root=image_root,
                 restval_as_train=restval_as_train)
    return result


# ---------------------------------------------------------------------------------------
# Verbatim records: what the authors' half-truth builder reads, nothing validated
# ---------------------------------------------------------------------------------------
# The paper protocol (csclip.eval.halftruth) must see every negative the authors' builder
# (experiments/half_truth_vulnerability.py at kargibora/CS-CLIP@2325a1c) sees, spelled as
# stored: our reader above maps change-type names, fills relation foils from their unit
# and drops what SPEC §2 rejects, each of which changes which items their builder makes.


@dataclass(frozen=True)
class VerbatimTriple:
    """A stored relation negative as written (non-strings read as "")."""

    subject: str
    relation_type: str
    object: str
    change_type: str


@dataclass(frozen=True)
class VerbatimRelation:
    """A stored relation with its own `negatives` and `negative_relations` lists."""

    subject: str
    relation_type: str
    object: str
    negatives: tuple[VerbatimTriple, ...] = ()
    negative_relations: tuple[VerbatimTriple, ...] = ()


@dataclass(frozen=True)
class VerbatimRecord:
    """One record as the authors' builder reads it.

    components: the string entries of positive_components (or `entities`), in order and
    unstripped; component_negatives: every key of negative_components (or
    `negative_entities`), each with its dict entries as (negative, change_type) strings;
    image_key: the record's own sample_id ("" when it has none: their +Rand tells images
    apart by it); dedup_key: one sample per value, their sample_id.rsplit("_", 1)[0]
    (else the image id: their builder, given no sample_id, does not deduplicate at all).
    """

    sample_id: str
    image_id: str
    image_key: str
    image_path: str | None
    caption: str
    components: tuple[str, ...]
    component_negatives: dict[str, tuple[tuple[str, str], ...]]
    relations: tuple[VerbatimRelation, ...]
    negative_relations: tuple[VerbatimTriple, ...]
    dedup_key: str
    image_bytes: bytes | None = None


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _triples(items: object) -> tuple[VerbatimTriple, ...]:
    if not isinstance(items, list):
        return ()
    return tuple(VerbatimTriple(_text(i.get("subject")), _text(i.get("relation_type")),
                                _text(i.get("object")), _text(i.get("change_type")))
                 for i in items if isinstance(i, dict))


def verbatim_record(obj: dict, sample_id: str, image_root: str | None = None) -> VerbatimRecord:
    """A record of either key schema, read as the authors' builder reads the older one
    (`positive_components`, `negative_components`, `relations`, `negative_relations`);
    the training schema's `entities` / `negative_entities` stand in for the first two
    (their builder reads only the older names: it makes no item from a training-schema
    file, which is a key spelling, not a construction)."""
    older = "positive_components" in obj or "negative_components" in obj
    names_key, negatives_key = (("positive_components", "negative_components") if older
                                else ("entities", "negative_entities"))
    names = obj.get(names_key) if isinstance(obj.get(names_key), list) else []
    raw_negatives = obj.get(negatives_key) if isinstance(obj.get(negatives_key), dict) else {}
    # A bare-string entry is kept as ("", ""): never a foil, but it makes the list
    # non-empty, which decides whether their relation lookup falls back to a substring match.
    negatives = {
        str(key): tuple((_text(n.get("negative")), _text(n.get("change_type")))
                        if isinstance(n, dict) else ("", "")
                        for n in (items if isinstance(items, list) else []))
        for key, items in raw_negatives.items()}
    relations = tuple(
        VerbatimRelation(_text(r.get("subject")), _text(r.get("relation_type")), _text(r.get("object")),
                         _triples(r.get("negatives")), _triples(r.get("negative_relations")))
        for r in (obj.get("relations") if isinstance(obj.get("relations"), list) else [])
        if isinstance(r, dict))
    image_path = _text(obj.get("image_path")) or None
    image_id = obj.get("image_id")
    image_id = str(image_id) if image_id is not None else (
        posixpath.splitext(posixpath.basename(image_path))[0] if image_path else sample_id)
    if image_path and image_root and not _is_absolute(image_path):
        image_path = posixpath.join(image_root, image_path)
    image_key = str(obj["sample_id"]) if obj.get("sample_id") is not None else ""
    caption = _text(obj.get("original_caption", obj.get("caption")))
    return VerbatimRecord(
        sample_id=sample_id, image_id=image_id, image_key=image_key,
        dedup_key=image_key.rsplit("_", 1)[0] if image_key else image_id,
        image_path=image_path, caption=caption,
        components=tuple(n for n in names if isinstance(n, str)),
        component_negatives=negatives, relations=relations,
        negative_relations=_triples(obj.get("negative_relations")))


def read_verbatim_records(uri: str, image_root: str | None = None,
                          endpoint_url: str | None = None) -> list[VerbatimRecord]:
    """Every record object of the unit files `uri` names (a file, directory or glob; local
    or s3://; a directory's combined_data.json alone when it has one), in file order,
    files sorted. Non-object entries and unparseable JSON Lines
    are skipped, as the authors' builder skips them; a missing file or one that is not JSON
    is a DataError; so is a file with no record."""
    fs, _ = storage.filesystem_for(uri, endpoint_url)
    records: list[VerbatimRecord] = []
    seen: dict[str, str] = {}
    paths = finished_unit_files(uri, endpoint_url)
    # Their script, given a folder, reads only its combined_data.json when there is one.
    combined = [p for p in paths if posixpath.basename(p) == "combined_data.json"]
    for path in combined or paths:
        try:
            text = storage.read_bytes(fs, path).decode("utf-8")
        except (FileNotFoundError, OSError) as err:
            raise DataError(f"unit file not found or unreadable: {path} ({err})") from err
        except UnicodeDecodeError as err:
            raise DataError(f"{path}: not UTF-8 text, so not a unit file ({err.reason})") from err
        for item in _items(posixpath.basename(path), text):
            if not isinstance(item.raw, dict):
                continue
            if item.sample_id in seen:
                raise DataError(f"sample_id {item.sample_id!r} occurs twice ({seen[item.sample_id]} "
                                f"and {item.position}); give records unique sample_id values")
            seen[item.sample_id] = item.position
            records.append(verbatim_record(item.raw, item.sample_id, image_root))
    if not records:
        raise DataError(f"{uri}: no unit records found (expected the authors' unit JSON: a list "
                        "of objects with positive_components or entities)")
    return records

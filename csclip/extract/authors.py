"""Readers for the CS-CLIP authors' unit files, into UnitsRecords.

Two formats (SPEC §6, "Key names"):

* training JSON (the released extraction): one object per caption with
  `sample_id, original_caption, entities, negative_entities{entity: [{negative,
  change_type}]}, relations[{subject, relation_type, object, negatives[...]}], image_path`;
* the older evaluation format: `positive_components` (entity strings, or relation
  objects) and `negative_components{component: [{negative, change_type}] | [str]}`.

A file may be a JSON list, a JSON object keyed by id, or JSON Lines. A malformed record is
rejected with its position and reason and counted; it never stops the file.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from csclip.errors import DataError
from csclip.units import (
    ENTITY_CHANGES,
    ChangeType,
    Foil,
    RejectReason,
    Unit,
    UnitsRecord,
    render_relation,
)


class RecordError(ValueError):
    """One record is malformed; carries the reason code and a located message."""

    def __init__(self, reason: RejectReason, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ReadRejection:
    position: str  # "file.json[17]" or "file.jsonl:18"
    sample_id: str | None
    reason: RejectReason
    detail: str


@dataclass
class ReadResult:
    """Records read from one or more files, with every rejection kept and counted."""

    records: list[UnitsRecord] = field(default_factory=list)
    rejections: list[ReadRejection] = field(default_factory=list)

    @property
    def num_read(self) -> int:
        return len(self.records) + len(self.rejections)

    def counts_by_reason(self) -> dict[str, int]:
        return dict(Counter(r.reason.value for r in self.rejections))


# ---------------------------------------------------------------------------------------
# Field helpers: each raises RecordError naming the field
# ---------------------------------------------------------------------------------------

def _require(obj: dict, key: str, kind: type | tuple[type, ...], where: str):
    if key not in obj:
        raise RecordError(RejectReason.MISSING_FIELD, f"{where}: missing key {key!r}")
    value = obj[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise RecordError(RejectReason.WRONG_TYPE,
                          f"{where}: {key!r} must be {names}, got {type(value).__name__}")
    return value


def _text(obj: dict, key: str, where: str) -> str:
    value = _require(obj, key, str, where)
    if not value.strip():
        raise RecordError(RejectReason.EMPTY_FOIL if key == "negative" else RejectReason.MISSING_FIELD,
                          f"{where}: {key!r} is empty")
    return value.strip()


def _change_type(obj: dict, where: str) -> ChangeType:
    raw = _require(obj, "change_type", str, where)
    try:
        return ChangeType(raw.strip())
    except ValueError as err:
        known = ", ".join(c.value for c in ChangeType)
        raise RecordError(RejectReason.UNKNOWN_CHANGE_TYPE,
                          f"{where}: unknown change_type {raw!r} (known: {known})") from err


def _entity_foils(items: object, where: str) -> list[Foil]:
    if not isinstance(items, list):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: foils must be a list")
    foils = []
    for j, item in enumerate(items):
        at = f"{where}[{j}]"
        if not isinstance(item, dict):
            raise RecordError(RejectReason.WRONG_TYPE, f"{at}: must be an object with negative, change_type")
        change = _change_type(item, at)
        if change not in ENTITY_CHANGES:
            raise RecordError(RejectReason.CHANGE_TYPE_MISMATCH, f"{at}: {change} is not an entity change")
        foils.append(Foil(_text(item, "negative", at), change))
    return foils


def _relation_foil(unit: Unit, item: object, where: str) -> Foil:
    """A relation negative: any of subject / relation_type (or predicate) / object,
    the rest taken from the unit; or a full `negative` text."""
    if not isinstance(item, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: must be an object with change_type")
    change = _change_type(item, where)
    if change in ENTITY_CHANGES:
        raise RecordError(RejectReason.CHANGE_TYPE_MISMATCH, f"{where}: {change} is not a relation change")
    predicate_key = "relation_type" if "relation_type" in item else "predicate"
    edited = {k: item[k] for k in ("subject", predicate_key, "object") if k in item}
    for key, value in edited.items():
        if not isinstance(value, str) or not value.strip():
            raise RecordError(RejectReason.WRONG_TYPE, f"{where}: {key!r} must be a non-empty string")
    if change == ChangeType.SUBJECT_OBJECT_SWAP and not edited:
        return Foil.relation(unit.object or "", unit.predicate or "", unit.subject or "", change)
    if not edited:
        if "negative" in item:
            return Foil(_text(item, "negative", where), change)
        raise RecordError(RejectReason.MISSING_FIELD,
                          f"{where}: needs subject, relation_type/predicate, object or negative")
    return Foil.relation(edited.get("subject", unit.subject).strip(),
                         edited.get(predicate_key, unit.predicate).strip(),
                         edited.get("object", unit.object).strip(), change)


def _relation(obj: object, where: str) -> Unit:
    if not isinstance(obj, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: must be an object")
    predicate_key = "relation_type" if "relation_type" in obj else "predicate"
    unit = Unit.relation(_text(obj, "subject", where), _text(obj, predicate_key, where),
                         _text(obj, "object", where))
    negatives = obj.get("negatives", [])
    if not isinstance(negatives, list):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: 'negatives' must be a list")
    foils = tuple(_relation_foil(unit, item, f"{where}.negatives[{j}]") for j, item in enumerate(negatives))
    return Unit("relation", unit.text, foils, unit.subject, unit.predicate, unit.object)


def _ids(obj: dict, key_hint: str | None, where: str) -> tuple[str, str, str | None]:
    sample_id = obj.get("sample_id", key_hint)
    if sample_id is None:
        raise RecordError(RejectReason.MISSING_FIELD, f"{where}: missing key 'sample_id'")
    image_path = obj.get("image_path", obj.get("image"))
    if image_path is not None and not isinstance(image_path, str):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: 'image_path' must be a string")
    image_id = obj.get("image_id", Path(image_path).stem if image_path else str(sample_id))
    return str(sample_id), str(image_id), image_path


# ---------------------------------------------------------------------------------------
# The two record formats
# ---------------------------------------------------------------------------------------

def parse_training_record(obj: object, split: str, where: str, key_hint: str | None = None) -> UnitsRecord:
    """One record of the authors' training JSON. Raises RecordError."""
    if not isinstance(obj, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: a record must be an object")
    sample_id, image_id, image_path = _ids(obj, key_hint, where)
    caption = _require(obj, "original_caption", str, where).strip()
    if not caption:
        raise RecordError(RejectReason.EMPTY_CAPTION, f"{where}: 'original_caption' is empty")
    names = _require(obj, "entities", list, where)
    negatives = obj.get("negative_entities", {})
    if not isinstance(negatives, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: 'negative_entities' must be an object")
    entities = []
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            raise RecordError(RejectReason.WRONG_TYPE, f"{where}.entities[{i}]: must be a non-empty string")
        foils = _entity_foils(negatives.get(name, []), f"{where}.negative_entities[{name!r}]")
        entities.append(Unit.entity(name.strip(), foils))
    unknown = sorted(set(negatives) - set(names))
    if unknown:
        raise RecordError(RejectReason.RELATION_ARGUMENT_NOT_ENTITY,
                          f"{where}: negative_entities names {unknown} not in 'entities'")
    relations = [_relation(r, f"{where}.relations[{i}]")
                 for i, r in enumerate(_require(obj, "relations", list, where))] if "relations" in obj else []
    split = str(obj.get("split", split))
    return UnitsRecord(sample_id, image_id, caption, split, tuple(entities), tuple(relations),
                       image_path=image_path, source="authors_json")


def parse_eval_record(obj: object, split: str, where: str, key_hint: str | None = None) -> UnitsRecord:
    """One record of the authors' older evaluation format (`positive_components` /
    `negative_components`). A positive component is an entity string or a relation
    object; negatives are keyed by the component's text. Raises RecordError."""
    if not isinstance(obj, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: a record must be an object")
    sample_id, image_id, image_path = _ids(obj, key_hint, where)
    caption_key = "caption" if "caption" in obj else "original_caption"
    caption = _require(obj, caption_key, str, where).strip()
    if not caption:
        raise RecordError(RejectReason.EMPTY_CAPTION, f"{where}: {caption_key!r} is empty")
    positives = _require(obj, "positive_components", list, where)
    negatives = obj.get("negative_components", {})
    if not isinstance(negatives, dict):
        raise RecordError(RejectReason.WRONG_TYPE, f"{where}: 'negative_components' must be an object")
    entities, relations = [], []
    for i, component in enumerate(positives):
        at = f"{where}.positive_components[{i}]"
        if isinstance(component, str) and component.strip():
            items = negatives.get(component, [])
            # This format sometimes stores bare strings; their change type is unknown,
            # and guessing one would mislabel the foil, so they are rejected.
            if any(isinstance(x, str) for x in items if isinstance(items, list)):
                raise RecordError(RejectReason.UNKNOWN_CHANGE_TYPE,
                                  f"{where}.negative_components[{component!r}]: bare strings carry no change_type")
            entities.append(Unit.entity(component.strip(), _entity_foils(items, f"{where}.negative_components[{component!r}]")))
        elif isinstance(component, dict):
            relation = _relation(component, at)
            key = render_relation(relation.subject or "", relation.predicate or "", relation.object or "")
            extra = negatives.get(key, [])
            if not isinstance(extra, list):
                raise RecordError(RejectReason.WRONG_TYPE, f"{where}.negative_components[{key!r}]: must be a list")
            foils = relation.foils + tuple(
                _relation_foil(relation, item, f"{where}.negative_components[{key!r}][{j}]")
                for j, item in enumerate(extra))
            relations.append(Unit("relation", relation.text, foils, relation.subject,
                                  relation.predicate, relation.object))
        else:
            raise RecordError(RejectReason.WRONG_TYPE, f"{at}: must be a string or a relation object")
    return UnitsRecord(sample_id, image_id, caption, str(obj.get("split", split)), tuple(entities),
                       tuple(relations), image_path=image_path, source="authors_eval_json")


def _detect_parser(obj: dict):
    if "positive_components" in obj or "negative_components" in obj:
        return parse_eval_record
    return parse_training_record


# ---------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------

def _iter_raw(path: Path) -> Iterator[tuple[str, str | None, object]]:
    """Yield (position, key_hint, raw object) from a JSON list, a JSON object keyed by
    id, or JSON Lines. Unparseable JSON Lines are yielded as RecordError objects."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if path.suffix == ".jsonl" or (stripped.startswith("{") and "\n{" in stripped and not _is_json(text)):
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                yield f"{path.name}:{n}", None, json.loads(line)
            except json.JSONDecodeError as err:
                yield f"{path.name}:{n}", None, RecordError(RejectReason.MALFORMED_JSON, f"{path.name}:{n}: {err.msg}")
        return
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from err
    if isinstance(data, list):
        for i, obj in enumerate(data):
            yield f"{path.name}[{i}]", None, obj
    elif isinstance(data, dict):
        for key, obj in data.items():
            yield f"{path.name}[{key!r}]", str(key), obj
    else:
        raise DataError(f"{path}: expected a JSON list or object of records, got {type(data).__name__}")


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def read_authors_units(paths: str | Path | list[str | Path], split: str = "train") -> ReadResult:
    """Read one or more authors' unit files (either format, detected per record).

    Raises DataError when a file is missing or is not JSON at all; malformed records
    become counted rejections.
    """
    result = ReadResult()
    for path in [paths] if isinstance(paths, str | Path) else paths:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"unit file not found: {path}")
        for position, key_hint, obj in _iter_raw(path):
            sample_id = obj.get("sample_id", key_hint) if isinstance(obj, dict) else key_hint
            try:
                if isinstance(obj, RecordError):
                    raise obj
                parser = _detect_parser(obj) if isinstance(obj, dict) else parse_training_record
                result.records.append(parser(obj, split, position, key_hint))
            except RecordError as err:
                result.rejections.append(ReadRejection(position, None if sample_id is None else str(sample_id),
                                                       err.reason, err.detail))
    return result

"""Extraction backends and answer validation.

Every backend turns one caption row into an `Outcome`: a validated UnitsRecord, or a
rejection with its stage, reason and raw answer. `gold` passes the synthetic world's
units through; `rules` wraps `csclip.extract.rules.extract_units`; `vllm` parses an LLM
answer (the engine itself lives in `csclip.extract.vllm`); `authors` validates a record
of the CS-CLIP authors' unit files (read by `csclip.authors`); `replay` re-derives units
from the raw answers a vllm run stored (`csclip.extract.answers`). `prompts` picks the
prompt set of vllm and replay: `csclip` (ours, csclip.extract.prompts) or `authors` (the
authors' three calls, csclip.extract.authors_prompts). Pure: no Ray imports.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field

import jsonschema
import pyarrow as pa
import pyarrow.compute as pc

from csclip.extract.authors import AUTHORS_COLUMN
from csclip.extract.prompts import UNITS_ANSWER_SCHEMA
from csclip.extract.rules import ABSENT_META_KEY, extract_units
from csclip.units import (
    Foil,
    Rejection,
    RejectReason,
    Unit,
    UnitsRecord,
    is_placeholder,
    normalize_text,
    record_from_row,
    record_to_row,
    validate_record,
)


class Status:
    OK = "ok"
    REJECTED = "rejected"
    REPAIR = "repair"  # rejected, but worth one more engine call with a repair prompt


# Record-level failures an LLM can fix when shown its answer and the error.
REPAIRABLE = frozenset({RejectReason.MALFORMED_JSON, RejectReason.SCHEMA_VIOLATION,
                        RejectReason.EMPTY_EXTRACTION, RejectReason.PLACEHOLDER,
                        RejectReason.ENTITY_NOT_IN_CAPTION,
                        RejectReason.RELATION_ARGUMENT_NOT_ENTITY, RejectReason.DUPLICATE_UNIT})


@dataclass(frozen=True)
class Outcome:
    """One caption after a backend: `record` when it kept units, else `reason`.
    `item_rejections` are the units and foils validation dropped from the answer."""

    stage: str  # where it was decided: read | inference | parse | schema | validation
    record: UnitsRecord | None = None
    reason: RejectReason | None = None
    detail: str = ""
    raw_answer: str = ""
    item_rejections: list[Rejection] = field(default_factory=list)
    # Every LLM call of the caption with its raw answer (csclip.extract.answers records),
    # and for the authors' prompt set the caption's entry in their released format.
    calls: list[dict] = field(default_factory=list)
    authors_entry: dict | None = None


class AnswerError(ValueError):
    """An LLM answer that cannot become a record (carries the reject reason)."""

    def __init__(self, reason: RejectReason, stage: str, detail: str):
        super().__init__(detail)
        self.reason, self.stage, self.detail = reason, stage, detail


def _base_record(row: dict, source: str, entities=(), relations=()) -> UnitsRecord:
    return UnitsRecord(sample_id=row["sample_id"], image_id=row["image_id"],
                       caption=row["caption"], split=row["split"], entities=tuple(entities),
                       relations=tuple(relations), image_path=row.get("image_path"),
                       image_bytes=row.get("image_bytes"), source=source)


def finish(record: UnitsRecord, raw_answer: str = "",
           extra_rejections: list[Rejection] | None = None) -> Outcome:
    """Validate a candidate record (SPEC §2 foil rules, `validate_record`). A record with
    no unit left is rejected: EMPTY_EXTRACTION if nothing was found or dropped, else the
    most common reason its units were dropped."""
    cleaned, rejections = validate_record(record)
    rejections = list(extra_rejections or []) + rejections
    if cleaned.units:
        return Outcome("validation", record=cleaned, raw_answer=raw_answer, item_rejections=rejections)
    if not rejections:
        return Outcome("validation", reason=RejectReason.EMPTY_EXTRACTION,
                       detail="no entities or relations", raw_answer=raw_answer,
                       item_rejections=rejections)
    reason, _ = Counter(r.reason for r in rejections).most_common(1)[0]
    detail = "; ".join(r.detail for r in rejections[:4])
    return Outcome("validation", reason=reason, detail=f"every unit rejected: {detail}",
                   raw_answer=raw_answer, item_rejections=rejections)


def empty_caption_outcome(row: dict) -> Outcome | None:
    """The rejection of a row whose caption is empty or blank, else None."""
    if not (row.get("caption") or "").strip():
        return Outcome("read", reason=RejectReason.EMPTY_CAPTION, detail="caption is empty")
    return None


_empty_caption = empty_caption_outcome


# ---------------------------------------------------------------------------------------
# gold and rules
# ---------------------------------------------------------------------------------------

def gold_outcome(row: dict) -> Outcome:
    """The world's gold units, unchanged (validated, so a world bug would show up as
    rejections rather than as bad training data)."""
    if not row.get("gold_json"):
        return Outcome("read", reason=RejectReason.MISSING_FIELD,
                       detail="no gold units: the gold backend needs input.format=world")
    gold = record_from_row({**json.loads(row["gold_json"]), "image_bytes": row.get("image_bytes")})
    return _empty_caption(row) or finish(gold)


# Longer captions are rejected by the rules backend (counted, with their length).
MAX_RULES_CAPTION_CHARS = 2000


def rules_outcome(row: dict) -> Outcome:
    """Units from the lexicon + pattern extractor (CPU, no model)."""
    empty = _empty_caption(row)
    if empty:
        return empty
    if len(row["caption"]) > MAX_RULES_CAPTION_CHARS:
        # The pattern extractor's time grows with the caption; no caption is this long.
        return Outcome("read", reason=RejectReason.CAPTION_TOO_LONG, detail=(
            f"caption of {len(row['caption'])} characters > {MAX_RULES_CAPTION_CHARS}"))
    result = extract_units(row["caption"])
    record = _base_record(row, "rules", result.entities, result.relations)
    if result.absent:  # what the caption says is not there: a true negative for later use
        record.meta[ABSENT_META_KEY] = json.dumps(list(result.absent))
    return finish(record, extra_rejections=list(result.rejections))


def authors_outcome(row: dict) -> Outcome:
    """A record of the authors' unit files (a row of `authors_caption_table`), validated
    like any backend's answer, with the foils dropped while reading counted; a record that
    could not be read is rejected with every problem in its detail."""
    payload = json.loads(row[AUTHORS_COLUMN])
    if "record" not in payload:
        return Outcome("read", reason=RejectReason(payload["reason"]), detail=payload["detail"])
    record = record_from_row({**payload["record"], "image_bytes": None})
    dropped = [Rejection(RejectReason(reason), detail) for reason, detail in payload["dropped"]]
    return finish(record, extra_rejections=dropped)


# ---------------------------------------------------------------------------------------
# LLM answers
# ---------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")
_THINK = re.compile(r"^\s*<think>.*?</think>\s*", re.DOTALL)


def parse_answer(text: str) -> dict:
    """Parse and schema-check one answer. Raises AnswerError (MALFORMED_JSON or
    SCHEMA_VIOLATION). Tolerates a leading empty <think> block and ``` fences, which
    Qwen3 emits when structured decoding is off."""
    cleaned = _FENCE.sub("", _THINK.sub("", text or "").strip())
    try:
        answer = json.loads(cleaned)
    except json.JSONDecodeError as err:
        raise AnswerError(RejectReason.MALFORMED_JSON, "parse", f"not JSON: {err}") from err
    except RecursionError as err:
        # A live engine's answer nested deeper than Python's JSON parser recurses: this
        # caption's rejection, not the extraction's end (the replay backend says the same).
        raise AnswerError(RejectReason.MALFORMED_JSON, "parse",
                          "an answer nests deeper than the JSON parser reads") from err
    try:
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(UNITS_ANSWER_SCHEMA).iter_errors(answer))
    except RecursionError as err:  # parsed, but nested past what the validator recurses
        raise AnswerError(RejectReason.SCHEMA_VIOLATION, "schema",
                          "an answer nests deeper than the schema check reads") from err
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise AnswerError(RejectReason.SCHEMA_VIOLATION, "schema", f"{where}: {error.message}")
    return answer


def _forms(word: str) -> set[str]:
    # Plural folding only: entities are noun phrases ("two horses" / "horse", "boxes" / "box").
    forms = {word}
    if len(word) > 3 and word.endswith("s"):
        forms.add(word[:-1])
    if len(word) > 4 and word.endswith("es"):
        forms.add(word[:-2])
    return forms


def _said_in(text: str, caption: str) -> bool:
    """Whether every word of `text` occurs in `caption` (up to plural), so an entity is
    one the caption states ("extract only what is said", SPEC §2)."""
    caption_forms = set().union(*(_forms(w) for w in normalize_text(caption).split()))
    return all(_forms(w) & caption_forms for w in normalize_text(text).split())


def record_from_answer(row: dict, answer: dict,
                       rejections: list[Rejection] | None = None) -> UnitsRecord:
    """Build the candidate record of a schema-valid answer. Entities the caption does not
    state are dropped (with a Rejection appended to `rejections`); relations that use them
    are then dropped by validate_record."""
    entities = []
    for e in answer["entities"]:
        text = e["entity"].strip()
        # Placeholders are left to validate_record, which names them as such.
        if text and not is_placeholder(text) and not _said_in(text, row["caption"]):
            if rejections is not None:
                rejections.append(Rejection(RejectReason.ENTITY_NOT_IN_CAPTION, f"entity {text!r}"))
            continue
        entities.append(Unit.entity(text, [Foil(f["foil"].strip(), f["change_type"])
                                           for f in e["foils"]]))
    relations = [Unit.relation(r["subject"].strip(), r["predicate"].strip(), r["object"].strip(),
                               [Foil.relation(f["subject"].strip(), f["predicate"].strip(),
                                              f["object"].strip(), f["change_type"])
                                for f in r["foils"]])
                 for r in answer["relations"]]
    return _base_record(row, "vllm", entities, relations)


def llm_outcome(row: dict, generated_text: str | None, inference_error: str | None) -> Outcome:
    """One engine answer -> Outcome. Inference errors are accounted, never retried here."""
    if inference_error:
        return Outcome("inference", reason=RejectReason.INFERENCE_ERROR,
                       detail=str(inference_error)[:500], raw_answer=generated_text or "")
    empty = _empty_caption(row)
    if empty:
        return empty
    raw = generated_text or ""
    try:
        answer = parse_answer(raw)
    except AnswerError as err:
        return Outcome(err.stage, reason=err.reason, detail=err.detail, raw_answer=raw)
    dropped: list[Rejection] = []
    record = record_from_answer(row, answer, dropped)
    return finish(record, raw_answer=raw, extra_rejections=dropped)


def is_repairable(outcome: Outcome) -> bool:
    return outcome.record is None and outcome.reason in REPAIRABLE


# ---------------------------------------------------------------------------------------
# Outcomes as table rows (what flows out of the Ray Data stages)
# ---------------------------------------------------------------------------------------

RESULT_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("shard", pa.int64(), nullable=False),
    pa.field("status", pa.string(), nullable=False),
    pa.field("stage", pa.string()),
    pa.field("reason", pa.string()),
    pa.field("detail", pa.string()),
    pa.field("raw_answer", pa.string()),
    pa.field("record_json", pa.string()),  # units-table row as JSON, without image bytes
    pa.field("image_bytes", pa.binary()),
    pa.field("item_rejects_json", pa.string()),  # [[reason, detail], ...]
    pa.field("attempt", pa.int64()),
    # Kept so rows marked for repair can be re-prompted without the caption table.
    pa.field("image_id", pa.string()),
    pa.field("caption", pa.string()),
    pa.field("split", pa.string()),
    pa.field("image_path", pa.string()),
    pa.field("caption_index", pa.int64()),  # the caption's position in the input
    pa.field("calls_json", pa.string()),  # the caption's LLM calls with their raw answers
    pa.field("authors_json", pa.string()),  # its entry in the authors' format (or null)
])


def outcome_row(row: dict, outcome: Outcome, *, attempt: int = 0, repair: bool = False) -> dict:
    """The RESULT_SCHEMA row of `outcome` for input `row` (a caption row with `shard`)."""
    record_json = None
    if outcome.record is not None:
        data = record_to_row(outcome.record)
        data.pop("image_bytes")
        record_json = json.dumps(data, sort_keys=True)
    status = (Status.OK if outcome.record is not None else
              Status.REPAIR if repair and attempt == 0 and is_repairable(outcome) else
              Status.REJECTED)
    return {
        "sample_id": row["sample_id"], "shard": row["shard"], "status": status,
        "stage": outcome.stage if attempt == 0 else f"repair_{outcome.stage}",
        "reason": outcome.reason.value if outcome.reason else None, "detail": outcome.detail,
        "raw_answer": outcome.raw_answer, "record_json": record_json,
        "image_bytes": row.get("image_bytes"),
        "item_rejects_json": json.dumps([[r.reason.value, r.detail] for r in outcome.item_rejections]),
        "attempt": attempt, "image_id": row["image_id"], "caption": row["caption"],
        "split": row["split"], "image_path": row.get("image_path"),
        "caption_index": row.get("caption_index"),
        "calls_json": json.dumps(outcome.calls) if outcome.calls else None,
        "authors_json": (json.dumps(outcome.authors_entry) if outcome.authors_entry is not None
                         else None),
    }


def shard_blocks(rows: pa.Table, rows_per_block: int) -> list[pa.Table]:
    """Caption rows (with `shard`) cut into blocks of at most `rows_per_block` rows, in
    shard order, a block never spanning two shards: shards then come back roughly in
    order, so the driver holds few partial shards and a crash loses little finished work."""
    shards = rows.column("shard")
    return [shard.slice(start, rows_per_block).combine_chunks()
            for shard in (rows.filter(pc.equal(shards, k)) for k in sorted(set(shards.to_pylist())))
            for start in range(0, shard.num_rows, rows_per_block)]


def record_from_result(result: dict) -> UnitsRecord:
    """The validated UnitsRecord of an `ok` result row."""
    return record_from_row({**json.loads(result["record_json"]), "image_bytes": result.get("image_bytes")})

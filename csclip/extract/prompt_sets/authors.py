"""The authors' prompt set (`backend.prompts: authors`): their three calls (prompts,
answers and filters: csclip.extract.authors_prompts) as chained stages of one Ray Data job,
and a caption's outcome from their answers, live or stored.

    captions -> [extract call: engine A] -> fan out: per caption one carry row and one row
    per entity / relation call -> [engine B] -> join back per caption (groupby sample_id)
    -> result rows

The first stage is materialized before the fan-out: a caption with no entity and no
relation needs no second call and bypasses engine B, and engine A's actors are gone before
engine B's start, so one GPU holds each stage's engine in turn. Entity and relation calls
share engine B (rows carry their own sampling params and schema), so its prefix cache
holds both system prompts; each engine batch is `batch_size` rows (256). Every caption
comes back as exactly one result row (read = units + rejected).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
import ray.data

from csclip.authors import RecordError, parse_record
from csclip.config.extract import VllmConfig
from csclip.extract import authors_prompts as ap
from csclip.extract.backends import (
    RESULT_SCHEMA,
    Outcome,
    empty_caption_outcome,
    finish,
    outcome_row,
)
from csclip.extract.prompt_sets.base import MissingAnswer, StoredAnswers
from csclip.extract.vllm import (
    ACTORS_TIMED_OUT,
    ERROR_COLUMN,
    Engine,
    PromptLength,
    build_engine,
    check_engine_resources,
    engines_did_not_start,
)
from csclip.units import RejectReason

NAME = "authors"
SOURCE = "vllm_authors"  # the units table's `source` of its records, live or replayed

CAPTION_ROLE, CALL_ROLE = "caption", "call"
# The rows between the fan-out and the join: the caption's own columns on its carry row,
# the call and its answer on every row.
JOIN_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string()),
    pa.field("shard", pa.int64()),
    pa.field("caption_index", pa.int64()),
    pa.field("image_id", pa.string()),
    pa.field("image_path", pa.string()),
    pa.field("caption", pa.string()),
    pa.field("split", pa.string()),
    pa.field("image_bytes", pa.binary()),
    pa.field("role", pa.string()),
    pa.field("call_json", pa.string()),
    pa.field("prompt_json", pa.string()),
    pa.field("sampling_json", pa.string()),
    pa.field("generated_text", pa.string()),
    pa.field(ERROR_COLUMN, pa.string()),
])
# The schema travels as JSON text (vLLM's StructuredOutputsParams takes either): engine B
# mixes entity and relation calls in one batch, and Arrow would merge their two schemas,
# as nested structs, into one with nulls.
_SAMPLING = {kind: json.dumps({**ap.sampling_params(kind),
                               "structured_outputs": {"json": json.dumps(ap.SCHEMA[kind])}})
             for kind in ap.CALL_KINDS}


# ---------------------------------------------------------------------------------------
# A caption's outcome from its answers
# ---------------------------------------------------------------------------------------

def call_record(call: ap.Call, answer: str | None, error: str = "") -> dict:
    """The answer record of one call (csclip.extract.prompt_sets.base)."""
    return {**call.head(), "answer": answer, "error": error, "prompts": NAME}


def derived_outcome(row: dict, derived: ap.Derived) -> Outcome:
    """The Outcome of one caption after its three calls: the entry in the authors' format
    read by csclip.authors (as `--backend authors` reads their files) and validated, every
    item their filters or ours dropped kept as a rejection."""
    calls = [call_record(c, a) for c, a in derived.calls]
    extract_answer = derived.calls[0][1] if derived.calls else ""
    if derived.entry is None:
        return Outcome(derived.stage, reason=derived.reason, detail=derived.detail,
                       raw_answer=extract_answer, item_rejections=derived.rejections, calls=calls)
    obj = {**derived.entry, "split": row["split"], "image_id": row["image_id"]}
    try:
        parsed = parse_record(obj, row["sample_id"], sample_id=row["sample_id"], split=row["split"])
    except RecordError as err:
        return Outcome("validation", reason=err.reason, detail=err.detail, raw_answer=extract_answer,
                       item_rejections=derived.rejections, calls=calls)
    record = replace(parsed.record, source=SOURCE, image_bytes=row.get("image_bytes"))
    outcome = finish(record, raw_answer=extract_answer,
                     extra_rejections=derived.rejections + parsed.dropped)
    return replace(outcome, calls=calls, authors_entry=derived.entry)


def authors_outcome_from(row: dict, answer_of: ap.AnswerOf) -> Outcome:
    """Every call of one caption answered by `answer_of` (stored or engine answers)."""
    empty = empty_caption_outcome(row)
    if empty is not None:
        return empty
    derived = ap.derive(row["sample_id"], int(row["caption_index"]), row["caption"],
                        row.get("image_path"), answer_of)
    return derived_outcome(row, derived)


def requests(row: dict, stored: StoredAnswers, cfg: VllmConfig) -> list[dict]:
    """The requests of one caption, rebuilt from its stored answers (calls two and three
    follow from the first call's answer)."""
    out: list[dict] = []

    def answer_of(call: ap.Call) -> str:
        out.append(call.request(cfg.model_source))
        return stored(call)

    ap.derive(row["sample_id"], int(row["caption_index"]), row["caption"], row.get("image_path"),
              answer_of)
    return out


# ---------------------------------------------------------------------------------------
# The calls on Ray Data
# ---------------------------------------------------------------------------------------

def _call_json(call: ap.Call) -> str:
    return json.dumps({**call.head(), "user": call.user})


def _call_from_json(text: str) -> ap.Call:
    data = json.loads(text)
    return ap.Call(data["kind"], data["sample_id"], data["caption_index"], data["entity"],
                   data["occurrence"], data["user"])


def extract_prompts(batch: pa.Table) -> pa.Table:
    """Caption rows -> the same rows with the extract call's prompt and sampling columns."""
    calls = [ap.extract_call(r["sample_id"], r["caption_index"], r["caption"])
             for r in batch.select(["sample_id", "caption_index", "caption"]).to_pylist()]
    batch = batch.append_column("call_json", pa.array([_call_json(c) for c in calls], pa.string()))
    batch = batch.append_column("prompt_json", pa.array(
        [json.dumps(c.messages()) for c in calls], pa.string()))
    return batch.append_column("sampling_json", pa.array([_SAMPLING[ap.EXTRACT]] * len(calls),
                                                         pa.string()))


def fan_out(batch: pa.Table) -> pa.Table:
    """Answered extract rows -> per caption a carry row (its columns and the extract
    answer) and one row per call that follows from the answer."""
    out = []
    for row in batch.to_pylist():
        carry = {name: row.get(name) for name in JOIN_SCHEMA.names}
        carry.update(role=CAPTION_ROLE, prompt_json=None, sampling_json=None,
                     generated_text=row.get("generated_text") or "")
        out.append(carry)
        if row.get(ERROR_COLUMN):
            continue
        for call in ap.planned_calls(row["sample_id"], row["caption_index"], row["caption"],
                                     carry["generated_text"]):
            out.append({"sample_id": row["sample_id"], "shard": row["shard"],
                        "caption_index": row["caption_index"], "role": CALL_ROLE,
                        "call_json": _call_json(call), "prompt_json": json.dumps(call.messages()),
                        "sampling_json": _SAMPLING[call.kind]})
    return pa.Table.from_pylist(out, schema=JOIN_SCHEMA)


def select_role(batch: pa.Table, *, role: str) -> pa.Table:
    """The rows of one role; call rows without the answer columns the engine adds."""
    rows = batch.filter(pc.equal(batch.column("role"), role))
    return rows if role == CAPTION_ROLE else rows.drop_columns(["generated_text", ERROR_COLUMN])


def to_join_schema(batch: pa.Table) -> pa.Table:
    """Engine output -> JOIN_SCHEMA (the engine appends its columns in its own order)."""
    rows = batch.to_pylist()
    return pa.Table.from_pylist([{n: r.get(n) for n in JOIN_SCHEMA.names} for r in rows],
                                schema=JOIN_SCHEMA)


def finalize(group: pa.Table) -> pa.Table:
    """The rows of one caption (its carry row and its answered calls) -> its result row."""
    rows = group.to_pylist()
    carry = next(r for r in rows if r["role"] == CAPTION_ROLE)
    answered = {}
    for row in rows:
        call = _call_from_json(row["call_json"])
        answered[call.key] = (call, row.get("generated_text") or "", row.get(ERROR_COLUMN) or "")
    errors: list[dict] = []

    def answer_of(call: ap.Call) -> str:
        found = answered.get(call.key)
        if found is None:
            raise MissingAnswer(f"the {call.kind} call for {call.entity!r} came back without "
                                "its row")
        _, text, error = found
        if error:
            errors.append(call_record(call, None, error))
            raise MissingAnswer(f"the {call.kind} call failed: {error[:300]}")
        return text

    outcome = authors_outcome_from(carry, answer_of)
    if errors:
        outcome = replace(outcome, calls=outcome.calls + errors)
    return pa.Table.from_pylist([outcome_row(carry, outcome)], schema=RESULT_SCHEMA)


def screen(rows: pa.Table, cfg: VllmConfig, prompt_length) -> tuple[pa.Table, pa.Table]:
    """(rows to send, result rows decided here): an empty caption, or an extract prompt
    whose tokens plus its 800 max_tokens exceed max_model_len, costs no engine time."""
    send, decided = [], []
    max_tokens = ap.MAX_TOKENS[ap.EXTRACT]
    for index, row in enumerate(rows.to_pylist()):
        outcome = empty_caption_outcome(row)
        if outcome is None and prompt_length is not None:
            call = ap.extract_call(row["sample_id"], row["caption_index"], row["caption"])
            tokens = prompt_length(call.messages())
            if tokens + max_tokens > cfg.max_model_len:
                outcome = Outcome("prompt", reason=RejectReason.PROMPT_TOO_LONG, detail=(
                    f"prompt of {tokens} tokens + max_tokens {max_tokens} > "
                    f"max_model_len {cfg.max_model_len}"))
        if outcome is None:
            send.append(index)
        else:
            decided.append(outcome_row(row, outcome))
    return (rows.take(pa.array(send, pa.int64())),
            pa.Table.from_pylist(decided, schema=RESULT_SCHEMA))


def _blocks(rows: pa.Table, rows_per_block: int) -> list[pa.Table]:
    return [rows.slice(start, rows_per_block).combine_chunks()
            for start in range(0, rows.num_rows, rows_per_block)]


def run_authors_stages(rows: pa.Table, cfg: VllmConfig, engine: Engine | None) -> Iterator[pa.Table]:
    """Result batches (RESULT_SCHEMA) for caption rows with `shard` and `caption_index`.
    engine: one Dataset -> Dataset stage used for both engines (tests), else two
    ray.data.llm processors built from cfg."""
    in_process = engine is None and not cfg.server_url
    prompt_length = PromptLength(cfg.model_source) if in_process else None
    rows, decided = screen(rows, cfg, prompt_length)
    if decided.num_rows:
        yield decided
    if not rows.num_rows:
        return
    if engine is None:
        if in_process:
            check_engine_resources(cfg)
        engine_a, engine_b = build_engine(cfg), None
    else:
        engine_a = engine_b = engine
    try:
        ds = ray.data.from_arrow(_blocks(rows, cfg.batch_size))
        ds = ds.map_batches(extract_prompts, batch_format="pyarrow", batch_size=None)
        fanned = engine_a(ds).map_batches(fan_out, batch_format="pyarrow", batch_size=None)
        fanned = fanned.materialize()  # stage one ends here (see the module docstring)
        carries = fanned.map_batches(partial(select_role, role=CAPTION_ROLE),
                                     batch_format="pyarrow", batch_size=None)
        calls = fanned.map_batches(partial(select_role, role=CALL_ROLE), batch_format="pyarrow",
                                   batch_size=None)
        joined = carries
        if calls.count():
            if engine_b is None:
                engine_b = build_engine(cfg)
            answered = engine_b(calls).map_batches(to_join_schema, batch_format="pyarrow",
                                                   batch_size=None)
            joined = carries.union(answered)
        # Few partitions: each is an aggregator actor of Ray's hash shuffle, and a caption's
        # rows are few and small (about one partition per engine batch, at most 64).
        partitions = max(1, min(64, -(-rows.num_rows // cfg.batch_size)))
        results = joined.groupby("sample_id", num_partitions=partitions).map_groups(
            finalize, batch_format="pyarrow")
        yield from results.iter_batches(batch_format="pyarrow", batch_size=None)
    except Exception as err:
        if in_process and ACTORS_TIMED_OUT in str(err):
            raise engines_did_not_start(cfg) from err
        raise


class AuthorsPromptSet:
    """The PromptSet of csclip.extract.authors_prompts: extract, then entity and relation
    foils (no repair: their pipeline has none)."""

    name = NAME
    source = SOURCE
    call_kinds = ap.CALL_KINDS

    def schemas(self) -> dict[str, dict]:
        return dict(ap.SCHEMA)

    def run(self, rows: pa.Table, cfg: VllmConfig, engine: Engine | None,
            attempt: int) -> Iterator[pa.Table]:
        # No row of theirs is ever marked for repair, so only attempt 0 comes here.
        return run_authors_stages(rows, cfg, engine)

    def outcome(self, row: dict, answers: StoredAnswers, repair: bool) -> Outcome:
        return authors_outcome_from(row, answers)

    def requests(self, row: dict, answers: StoredAnswers, cfg: VllmConfig) -> list[dict]:
        return requests(row, answers, cfg)

"""The authors' prompt set on Ray Data (`backend.prompts: authors`, backend vllm): their
three calls as chained stages of one job.

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
import logging
from collections.abc import Iterator
from functools import partial

import pyarrow as pa

from csclip.config.extract import VllmConfig
from csclip.extract import answers as stored_answers
from csclip.extract import authors_prompts as ap
from csclip.extract.backends import RESULT_SCHEMA, Outcome, empty_caption_outcome, outcome_row
from csclip.extract.vllm import ERROR_COLUMN, Engine
from csclip.units import RejectReason

log = logging.getLogger(__name__)

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
    import pyarrow.compute as pc

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
            raise ap.MissingAnswer(f"the {call.kind} call for {call.entity!r} came back without "
                                   "its row")
        _, text, error = found
        if error:
            errors.append(stored_answers.call_record(call, None, error))
            raise ap.MissingAnswer(f"the {call.kind} call failed: {error[:300]}")
        return text

    outcome = stored_answers.authors_outcome_from(carry, answer_of)
    if errors:
        from dataclasses import replace

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
    import ray.data

    in_process = engine is None and not cfg.server_url
    prompt_length = None
    if in_process:
        from csclip.extract.vllm import PromptLength

        prompt_length = PromptLength(cfg.model_source)
    rows, decided = screen(rows, cfg, prompt_length)
    if decided.num_rows:
        yield decided
    if not rows.num_rows:
        return
    if engine is None:
        from csclip.extract.pipeline import _check_engine_resources
        from csclip.extract.vllm import build_engine

        if in_process:
            _check_engine_resources(cfg)
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
                from csclip.extract.vllm import build_engine

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
        if in_process and "Timed out while starting actors" in str(err):
            from csclip.extract.pipeline import _engines_did_not_start

            raise _engines_did_not_start(cfg) from err
        raise

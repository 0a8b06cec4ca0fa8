"""Our prompt set (`backend.prompts: csclip`): one call per caption whose answer holds its
units and their foils (prompts and schema: csclip.extract.prompts), and, for an answer that
fails validation in a way the model can fix, one repair call that shows the model its
answer and the error. The repair calls run as a second attempt after the first has
finished (csclip.extract.pipeline parks the rows to repair).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial

import pyarrow as pa
import ray.data

from csclip.config.extract import VllmConfig
from csclip.extract.backends import (
    RESULT_SCHEMA,
    Outcome,
    empty_caption_outcome,
    is_repairable,
    llm_outcome,
    outcome_row,
    shard_blocks,
)
from csclip.extract.prompt_sets.base import StoredAnswers
from csclip.extract.prompts import UNITS_ANSWER_SCHEMA, extraction_messages, repair_messages
from csclip.extract.vllm import (
    ACTORS_TIMED_OUT,
    ERROR_COLUMN,
    Engine,
    PromptLength,
    add_prompt_columns,
    build_engine,
    check_engine_resources,
    engines_did_not_start,
    sampling_params,
)
from csclip.units import RejectReason

NAME = "csclip"
EXTRACT, REPAIR = "extract", "repair"  # the call kinds: the answer, then its one repair


def answer_stage(batch: pa.Table, *, attempt: int, repair: bool) -> pa.Table:
    """Rows with `generated_text` / `__inference_error__` -> result rows."""
    out = []
    for row in batch.to_pylist():
        outcome = llm_outcome(row, row.get("generated_text"), row.get(ERROR_COLUMN))
        error = row.get(ERROR_COLUMN) or ""
        call = {"kind": REPAIR if attempt else EXTRACT, "sample_id": row["sample_id"],
                "caption_index": row.get("caption_index"), "entity": None, "occurrence": 0,
                "answer": None if error else row.get("generated_text") or "", "error": error,
                "prompts": NAME}
        outcome = replace(outcome, calls=[call])
        out.append(outcome_row(row, outcome, attempt=attempt, repair=repair))
    return pa.Table.from_pylist(out, schema=RESULT_SCHEMA)


def _llm_passthrough(batch: pa.Table) -> pa.Table:
    # Repair rows keep their identity columns; the answer columns are replaced.
    keep = ["sample_id", "shard", "image_id", "caption", "split", "image_path", "image_bytes",
            "raw_answer", "detail", "caption_index"]
    return batch.select(keep)


PromptLengthFn = Callable[[list[dict]], int]


def screen_llm_rows(rows: pa.Table, cfg: VllmConfig, attempt: int,
                    prompt_length: PromptLengthFn | None) -> tuple[pa.Table, pa.Table]:
    """Split rows bound for the engine into (rows to send, result rows decided here): an
    empty caption, or a prompt whose tokens plus max_tokens exceed max_model_len, is a
    counted rejection that costs no engine time. `prompt_length` counts a chat prompt's
    tokens (None: no length check, e.g. for a server whose tokenizer is not at hand)."""
    send, decided = [], []
    for index, row in enumerate(rows.to_pylist()):
        outcome = empty_caption_outcome(row)
        if outcome is None and prompt_length is not None:
            messages = (repair_messages(row["caption"], row["raw_answer"] or "", row["detail"] or "")
                        if attempt > 0 else extraction_messages(row["caption"]))
            tokens = prompt_length(messages)
            if tokens + cfg.max_tokens > cfg.max_model_len:
                outcome = Outcome("prompt", reason=RejectReason.PROMPT_TOO_LONG, detail=(
                    f"prompt of {tokens} tokens + max_tokens {cfg.max_tokens} > "
                    f"max_model_len {cfg.max_model_len}"), raw_answer=row.get("raw_answer") or "")
        if outcome is None:
            send.append(index)
        else:
            decided.append(outcome_row(row, outcome, attempt=attempt, repair=cfg.repair))
    return (rows.take(pa.array(send, pa.int64())),
            pa.Table.from_pylist(decided, schema=RESULT_SCHEMA))


def run_calls(rows: pa.Table, cfg: VllmConfig, engine: Engine | None,
              attempt: int) -> Iterator[pa.Table]:
    """Result batches of caption rows (attempt 0) or of rows to repair (attempt 1)."""
    # Rows that need no engine call are answered here; the in-process engine's own
    # tokenizer tells whether a prompt fits its context.
    in_process = engine is None and not cfg.server_url
    prompt_length = PromptLength(cfg.model_source) if in_process else None
    rows, decided = screen_llm_rows(rows, cfg, attempt, prompt_length)
    if decided.num_rows:
        yield decided
    if not rows.num_rows:
        return
    ds = ray.data.from_arrow(shard_blocks(rows, cfg.batch_size))
    if engine is None:
        if in_process:
            check_engine_resources(cfg)
        engine = build_engine(cfg)
    if attempt > 0:
        ds = ds.map_batches(_llm_passthrough, batch_format="pyarrow", batch_size=None)
    ds = ds.map_batches(partial(add_prompt_columns, cfg_json=cfg.model_dump_json(),
                                repair=attempt > 0), batch_format="pyarrow", batch_size=None)
    ds = engine(ds)
    ds = ds.map_batches(partial(answer_stage, attempt=attempt, repair=cfg.repair),
                        batch_format="pyarrow", batch_size=None)
    try:
        yield from ds.iter_batches(batch_format="pyarrow", batch_size=None)
    except Exception as err:
        if in_process and ACTORS_TIMED_OUT in str(err):
            raise engines_did_not_start(cfg) from err
        raise


def replay(row: dict, stored: StoredAnswers, repair: bool) -> Outcome:
    """As a live run decides: the answer, then (repair on) the repair call's answer for a
    rejection worth repairing."""
    empty = empty_caption_outcome(row)
    if empty is not None:
        return empty
    calls = [r for r in stored.by_key.values() if r["kind"] in (EXTRACT, REPAIR)]
    calls.sort(key=lambda r: r["kind"] == REPAIR)
    first = stored.by_key.get((EXTRACT, None, 0))
    if first is None:
        return Outcome("inference", reason=RejectReason.INFERENCE_ERROR,
                       detail="no stored answer for the extract call")
    outcome = llm_outcome(row, first.get("answer"), first.get("error") or
                          (None if first.get("answer") is not None else "no answer"))
    second = stored.by_key.get((REPAIR, None, 0))
    if repair and is_repairable(outcome) and second is not None:
        outcome = llm_outcome(row, second.get("answer"), second.get("error") or
                              (None if second.get("answer") is not None else "no answer"))
        outcome = replace(outcome, stage=f"repair_{outcome.stage}")
    return replace(outcome, calls=calls)


def requests(row: dict, stored: StoredAnswers, cfg: VllmConfig) -> list[dict]:
    """The extract request, and the repair request when one was answered."""
    if (EXTRACT, None, 0) not in stored.by_key:
        return []
    params = sampling_params(cfg)
    schema = params.pop("structured_outputs")
    # vLLM's defaults for what our requests leave unset.
    params = {"n": 1, **params, "top_k": 0, "repetition_penalty": 1.0, "stop": [],
              "skip_special_tokens": True}
    head = {"sample_id": row["sample_id"], "caption_index": row["caption_index"], "entity": None,
            "occurrence": 0}
    common = {"chat_template_kwargs": {"enable_thinking": False}, "sampling_params": params,
              "structured_outputs": schema, "model": cfg.model_source}
    out = [{"kind": EXTRACT, **head, "messages": extraction_messages(row["caption"]), **common}]
    if (REPAIR, None, 0) in stored.by_key:
        first = stored.get(EXTRACT)
        detail = llm_outcome(row, first, None).detail
        out.append({"kind": REPAIR, **head,
                    "messages": repair_messages(row["caption"], first or "", detail), **common})
    return out


class CsclipPromptSet:
    """The PromptSet of csclip.extract.prompts: one answer, one repair."""

    name = NAME
    source = "vllm"
    call_kinds = (EXTRACT, REPAIR)

    def schemas(self) -> dict[str, dict]:
        return {EXTRACT: UNITS_ANSWER_SCHEMA, REPAIR: UNITS_ANSWER_SCHEMA}

    def run(self, rows: pa.Table, cfg: VllmConfig, engine: Engine | None,
            attempt: int) -> Iterator[pa.Table]:
        return run_calls(rows, cfg, engine, attempt)

    def outcome(self, row: dict, answers: StoredAnswers, repair: bool) -> Outcome:
        return replay(row, answers, repair)

    def requests(self, row: dict, answers: StoredAnswers, cfg: VllmConfig) -> list[dict]:
        return requests(row, answers, cfg)

"""Raw LLM answers: stored beside the units table, replayed without an LLM, and the
requests they answered (`--dump-prompts`).

A vllm run writes `answers/part-K.jsonl` next to `units/part-K.parquet`: one object per
call, `kind` (extract | entity_foils | relation_foils; `repair` for csclip's repair call),
`sample_id`, `caption_index` (the caption's position in the input, sorted by sample_id as
the shards are cut), `entity` (for entity_foils, else null), `occurrence` (0, or 1, 2, ...
when the same prompt is sent again for one caption), `answer` (the raw text, null after an
inference error), `error`, `prompts` (the prompt set). `backend.name: replay` reads such
files and derives every caption's units from them with the same code a live run uses, so
changing a filter costs seconds, not GPU hours. Pure: no Ray.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from csclip.authors import RecordError, expand_uri, parse_record
from csclip.errors import DataError
from csclip.extract import authors_prompts as ap
from csclip.extract.backends import Outcome, empty_caption_outcome, finish, llm_outcome
from csclip.progress import progress
from csclip.units import RejectReason

if TYPE_CHECKING:
    import pyarrow as pa

    from csclip.config.extract import BackendConfig

ANSWERS_COLUMN = "answers_json"  # replay: the caption's stored answers, on its caption row
REPAIR = "repair"  # csclip's prompt set: the one repair call after a rejected answer
# The units table's `source` of each prompt set, for a live run and its replay alike.
SOURCE = {"csclip": "vllm", "authors": "vllm_authors"}


def call_record(call: ap.Call, answer: str | None, error: str = "", prompts: str = "authors") -> dict:
    return {**call.head(), "answer": answer, "error": error, "prompts": prompts}


def _key(record: dict) -> tuple:
    return (record["kind"], record.get("entity"), int(record.get("occurrence") or 0))


class StoredAnswers:
    """A caption's stored answers as an `answer_of` for authors_prompts.derive."""

    def __init__(self, records: Iterable[dict]):
        self.by_key = {_key(r): r for r in records}

    def get(self, kind: str, entity: str | None = None, occurrence: int = 0) -> str | None:
        record = self.by_key.get((kind, entity, occurrence))
        return None if record is None else record.get("answer")

    def __call__(self, call: ap.Call) -> str:
        record = self.by_key.get((call.kind, call.entity, call.occurrence))
        if record is None:
            raise ap.MissingAnswer(f"no stored answer for {_describe(call)}")
        if record.get("answer") is None:
            raise ap.MissingAnswer(f"{_describe(call)}: {record.get('error') or 'no answer'}")
        return record["answer"]


def _describe(call: ap.Call) -> str:
    entity = f" {call.entity!r}" if call.entity is not None else ""
    return f"the {call.kind} call{entity} #{call.occurrence}"


# ---------------------------------------------------------------------------------------
# A caption's outcome under the authors' prompt set
# ---------------------------------------------------------------------------------------

def derived_outcome(row: dict, derived: ap.Derived, prompts: str = "authors") -> Outcome:
    """The Outcome of one caption after its three calls: the entry in the authors' format
    read by csclip.authors (as `--backend authors` reads their files) and validated, every
    item their filters or ours dropped kept as a rejection."""
    calls = [call_record(c, a, prompts=prompts) for c, a in derived.calls]
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
    record = replace(parsed.record, source=SOURCE[prompts], image_bytes=row.get("image_bytes"))
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


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------

def replay_outcome(row: dict) -> Outcome:
    """`backend.name: replay`: one caption row carrying its stored answers."""
    payload = json.loads(row[ANSWERS_COLUMN])
    stored = StoredAnswers(payload["answers"])
    if payload["prompts"] == "authors":
        return authors_outcome_from(row, stored)
    return _csclip_replay(row, stored, payload["repair"])


def _csclip_replay(row: dict, stored: StoredAnswers, repair: bool) -> Outcome:
    # As pipeline.run_extraction: the answer, then (repair on) the repair call's answer
    # for a rejection worth repairing.
    from csclip.extract.backends import is_repairable

    empty = empty_caption_outcome(row)
    if empty is not None:
        return empty
    calls = [r for r in stored.by_key.values() if r["kind"] in ("extract", REPAIR)]
    calls.sort(key=lambda r: r["kind"] == REPAIR)
    first = stored.by_key.get(("extract", None, 0))
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


def read_answers(uri: str, endpoint_url: str | None = None) -> dict[str, list[dict]]:
    """Every answer record under `uri` (a .jsonl file, a folder of them or a glob), by
    sample_id. Raises DataError for a file that is not answer records."""
    from csclip import storage

    fs, _ = storage.filesystem_for(uri, endpoint_url)
    try:
        paths = [p for p in expand_uri(uri, endpoint_url) if p.endswith(".jsonl")]
    except DataError as err:
        raise DataError(f"{uri}: no answers (*.jsonl) found; point backend.answers at the "
                        "answers/ folder of a vllm run") from err
    by_sample: dict[str, list[dict]] = defaultdict(list)
    for path in progress(paths, desc="replay: read answers", unit="file"):
        text = storage.read_bytes(fs, path).decode("utf-8")
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                by_sample[str(record["sample_id"])].append(record)
                _key(record)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
                raise DataError(f"{path}:{number}: not an answer record ({err}); each line "
                                "needs kind, sample_id, entity, occurrence, answer") from err
    if not by_sample:
        raise DataError(f"{uri}: no answer records in {len(paths)} file(s)")
    return by_sample


def attach_answers(captions: pa.Table, backend: BackendConfig,
                   endpoint_url: str | None = None) -> pa.Table:
    """The caption table with ANSWERS_COLUMN: each caption's stored answers (a caption
    without any is answered by nothing and rejected as an inference error)."""
    import pyarrow as pa

    by_sample = read_answers(backend.answers, endpoint_url)
    prompts = {r.get("prompts") for records in by_sample.values() for r in records} - {None}
    if prompts - {backend.prompts}:
        raise DataError(f"{backend.answers}: answers of the {', '.join(sorted(prompts))} prompt "
                        f"set, but backend.prompts={backend.prompts}; set it to match")
    column = [json.dumps({"prompts": backend.prompts, "repair": backend.vllm.repair,
                          "answers": by_sample.get(sample_id, [])})
              for sample_id in captions.column("sample_id").to_pylist()]
    return captions.append_column(ANSWERS_COLUMN, pa.array(column, pa.string()))


# ---------------------------------------------------------------------------------------
# Files beside the units table
# ---------------------------------------------------------------------------------------

def answers_lines(results: Iterable[dict]) -> bytes:
    """answers/part-K.jsonl of a shard's result rows (sorted by sample_id)."""
    lines = [json.dumps(call, ensure_ascii=False)
             for row in results if row.get("calls_json")
             for call in json.loads(row["calls_json"])]
    return "".join(line + "\n" for line in lines).encode()


def authors_file(results: Iterable[dict]) -> bytes:
    """authors/part-K.json: the shard's entries in the authors' released unit format (a
    JSON list, as their unit_pipeline/main.py writes it), captions they skip left out."""
    entries = [json.loads(row["authors_json"]) for row in results if row.get("authors_json")]
    return (json.dumps(entries, indent=2, ensure_ascii=False) + "\n").encode()


# ---------------------------------------------------------------------------------------
# --dump-prompts
# ---------------------------------------------------------------------------------------

def _csclip_requests(row: dict, stored: StoredAnswers, model: str, vllm_cfg) -> Iterator[dict]:
    from csclip.extract.prompts import extraction_messages, repair_messages
    from csclip.extract.vllm import sampling_params

    params = sampling_params(vllm_cfg)
    schema = params.pop("structured_outputs")
    # vLLM's defaults for what our requests leave unset.
    params = {"n": 1, **params, "top_k": 0, "repetition_penalty": 1.0, "stop": [],
              "skip_special_tokens": True}
    head = {"sample_id": row["sample_id"], "caption_index": row["caption_index"], "entity": None,
            "occurrence": 0}
    common = {"chat_template_kwargs": {"enable_thinking": False}, "sampling_params": params,
              "structured_outputs": schema, "model": model}
    first = stored.get("extract")
    if ("extract", None, 0) not in stored.by_key:
        return
    yield {"kind": "extract", **head, "messages": extraction_messages(row["caption"]), **common}
    if (REPAIR, None, 0) in stored.by_key:
        detail = llm_outcome(row, first, None).detail
        yield {"kind": REPAIR, **head,
               "messages": repair_messages(row["caption"], first or "", detail), **common}


def prompt_requests(row: dict, records: list[dict], prompts: str, vllm_cfg) -> list[dict]:
    """The requests of one caption, rebuilt from its stored answers (calls two and three
    follow from the first call's answer)."""
    stored = StoredAnswers(records)
    model = vllm_cfg.model_source
    if prompts == "csclip":
        return list(_csclip_requests(row, stored, model, vllm_cfg))
    requests: list[dict] = []

    def answer_of(call: ap.Call) -> str:
        requests.append(call.request(model))
        return stored(call)

    ap.derive(row["sample_id"], int(row["caption_index"]), row["caption"], row.get("image_path"),
              answer_of)
    return requests


def dump_prompts(fs, answers_dir: str, captions: pa.Table, config) -> int:
    """Write `config.output.dump_prompts`: every request of the run, one JSON object a
    line, rebuilt from the answers stored under `answers_dir` (for a replay: the calls its
    stored answers imply). Returns the number of requests."""
    from csclip import storage

    by_sample: dict[str, list[dict]] = defaultdict(list)
    for path in progress(storage.list_files(fs, answers_dir, ".jsonl"),
                         desc="dump prompts: read answers", unit="file"):
        for line in storage.read_bytes(fs, path).decode("utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                by_sample[record["sample_id"]].append(record)
    columns = ["sample_id", "caption_index", "caption", "image_path", "image_id", "split"]
    lines = []
    for row in progress(captions.select(columns).to_pylist(), desc="dump prompts",
                        unit="caption"):
        records = by_sample.get(row["sample_id"])
        if records:
            lines += [json.dumps(r, ensure_ascii=False) for r in prompt_requests(
                row, records, config.backend.prompts, config.backend.vllm)]
    target_fs, target = storage.filesystem_for(config.output.dump_prompts,
                                               config.output.endpoint_url)
    storage.write_bytes_atomic(target_fs, target, "".join(x + "\n" for x in lines).encode())
    return len(lines)


def with_earlier_calls(row: dict, earlier: dict) -> dict:
    """A repaired result row with the calls of its first attempt before its own."""
    if row is earlier or not earlier.get("calls_json"):
        return row
    calls = json.loads(earlier["calls_json"]) + json.loads(row.get("calls_json") or "[]")
    return {**row, "calls_json": json.dumps(calls)}

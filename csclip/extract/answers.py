"""Raw LLM answers: stored beside the units table, replayed without an LLM, and the
requests they answered (`--dump-prompts`).

A vllm run writes `answers/part-K.jsonl` next to `units/part-K.parquet`: one object per
call, `kind` (extract | entity_foils | relation_foils; `repair` for csclip's repair call),
`sample_id`, `caption_index` (the caption's position in the input, sorted by sample_id as
the shards are cut), `entity` (for entity_foils, else null), `occurrence` (0, or 1, 2, ...
when the same prompt is sent again for one caption), `answer` (the raw text, null after an
inference error), `error`, `prompts` (the prompt set). `backend.name: replay` reads such
files and derives every caption's units from them with the same code a live run uses (the
prompt set's `outcome`), so changing a filter costs seconds, not GPU hours.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable

import pyarrow as pa

from csclip import storage
from csclip.authors import authors_entry, expand_uri
from csclip.config.extract import BackendConfig, ExtractConfig, VllmConfig
from csclip.errors import DataError
from csclip.extract.backends import Outcome
from csclip.extract.prompt_sets import get_prompt_set
from csclip.extract.prompt_sets.base import PromptSet, StoredAnswers, answer_key
from csclip.progress import progress
from csclip.units import RejectReason

ANSWERS_COLUMN = "answers_json"  # replay: the caption's stored answers, on its caption row


# ---------------------------------------------------------------------------------------
# Replay
# ---------------------------------------------------------------------------------------

def replay_outcome(row: dict, prompt_set: PromptSet | None = None) -> Outcome:
    """`backend.name: replay`: one caption row carrying its stored answers, decided by
    `prompt_set` (default: the registered one its answers name)."""
    payload = json.loads(row[ANSWERS_COLUMN])
    prompt_set = prompt_set or get_prompt_set(payload["prompts"])
    try:
        return prompt_set.outcome(row, StoredAnswers(payload["answers"]), payload["repair"])
    except RecursionError:
        # An answer nested deeper than Python's JSON parser recurses: this caption's
        # rejection, not the extraction's end.
        return Outcome("parse", reason=RejectReason.MALFORMED_JSON,
                       detail="an answer nests deeper than the JSON parser reads")


def read_answers(uri: str, endpoint_url: str | None = None) -> dict[str, list[dict]]:
    """Every answer record under `uri` (a .jsonl file, a folder of them or a glob), by
    sample_id. Raises DataError for a file that is not answer records."""
    fs, _ = storage.filesystem_for(uri, endpoint_url)
    try:
        paths = [p for p in expand_uri(uri, endpoint_url) if p.endswith(".jsonl")]
    except DataError as err:
        raise DataError(f"{uri}: no answers (*.jsonl) found; point backend.answers at the "
                        "answers/ folder of a vllm run") from err
    by_sample: dict[str, list[dict]] = defaultdict(list)
    for path in progress(paths, desc="replay: read answers", unit="file"):
        for number, raw in enumerate(storage.read_bytes(fs, path).splitlines(), 1):
            if not raw.strip():
                continue
            record = _answer_record(raw, f"{path}:{number}")
            by_sample[str(record["sample_id"])].append(record)
    if not by_sample:
        raise DataError(f"{uri}: no answer records in {len(paths)} file(s)")
    return by_sample


def _answer_record(raw: bytes, where: str) -> dict:
    """One line of an answers file as its record. An answer the prompt set cannot read (the
    line not UTF-8, the answer not a string) becomes a failed call, so its caption is a
    counted inference_error rejection; a line that is not an answer record at all (not
    JSON, nested past the parser, keys missing) is a DataError naming `where`."""
    problem = None
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw.decode("utf-8", errors="replace")
        problem = f"not UTF-8 ({err.reason} at byte {err.start})"
    try:
        record = json.loads(line)
        answer_key(record)
        str(record["sample_id"])
    except RecursionError as err:
        raise DataError(f"{where}: not an answer record (JSON nested deeper than the parser "
                        "reads)") from err
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise DataError(f"{where}: not an answer record ({err}); each line needs kind, "
                        "sample_id, entity, occurrence, answer") from err
    answer = record.get("answer")
    if problem is None and answer is not None and not isinstance(answer, str):
        problem = f"the answer is {type(answer).__name__}, not a string"
    if problem is not None:
        record = {**record, "answer": None, "error": f"{where}: {problem}"}
    return record


def attach_answers(captions: pa.Table, backend: BackendConfig,
                   endpoint_url: str | None = None) -> pa.Table:
    """The caption table with ANSWERS_COLUMN: each caption's stored answers (a caption
    without any is answered by nothing and rejected as an inference error)."""
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
    JSON list, as their unit_pipeline/main.py writes it, with their sample ids:
    csclip.authors.authors_entry), captions they skip left out."""
    entries = [authors_entry(json.loads(row["authors_json"]))
               for row in results if row.get("authors_json")]
    return (json.dumps(entries, indent=2, ensure_ascii=False) + "\n").encode()


# ---------------------------------------------------------------------------------------
# --dump-prompts
# ---------------------------------------------------------------------------------------

def prompt_requests(row: dict, records: list[dict], prompts: str,
                    vllm_cfg: VllmConfig) -> list[dict]:
    """The requests of one caption, rebuilt from its stored answers by its prompt set."""
    return get_prompt_set(prompts).requests(row, StoredAnswers(records), vllm_cfg)


def dump_prompts(fs, answers_dir: str, captions: pa.Table, config: ExtractConfig) -> int:
    """Write `config.output.dump_prompts`: every request of the run, one JSON object a
    line, rebuilt from the answers stored under `answers_dir` (for a replay: the calls its
    stored answers imply). Returns the number of requests."""
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

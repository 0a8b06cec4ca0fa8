"""The Ray Data extraction pipeline: reader -> backend -> validation ->
units table + rejects table, sharded Parquet (local or s3://), resumable, accounted.

Captions are sorted by sample_id and cut into shards of `output.shard_size`. One Ray Data
execution streams all unfinished shards through the backend; the driver writes each
shard as soon as all its rows are back: `units/part-K.parquet`, `rejects/part-K.parquet`,
then the marker `_done/part-K.json` (its counts). A rerun skips shards with a marker and
rewrites the others under the same names, so rows are never duplicated. After the summary
the output gets `_complete.json`: until then every reader of the folder refuses it
(csclip.units.check_extraction_complete). Shards with rows
that failed LLM validation first park them in `_stage1/part-K.parquet`; one repair pass
re-prompts those rows and then finishes the shards. Webdataset input (csclip.extract.shards)
goes through the same stages and shard files, one shard per input shard named by its stem.
"""

from __future__ import annotations

import io
import json
import logging
import tempfile
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import ray.data

from csclip import storage, tracking
from csclip.config import flatten
from csclip.config.extract import (
    ExtractConfig,
    OutputConfig,
)
from csclip.errors import ConfigError, DataError
from csclip.extract import answers, backends, swap_negatives
from csclip.extract.authors import authors_caption_table
from csclip.extract.backends import RESULT_SCHEMA, Status
from csclip.extract.captions import caption_table, resolve_format
from csclip.extract.prompt_sets import DEFAULT_PROMPT_SET, get_prompt_set
from csclip.extract.prompt_sets.base import PromptSet
from csclip.extract.vllm import Engine
from csclip.ownership import output_lease
from csclip.units import (
    EXTRACTION_COMPLETE,
    EXTRACTION_DONE_DIR,
    EXTRACTION_MANIFEST,
    UnitsRecord,
    records_to_table,
)

log = logging.getLogger(__name__)

REJECTS_SCHEMA = pa.schema([
    pa.field("sample_id", pa.string(), nullable=False),
    pa.field("level", pa.string(), nullable=False),  # record: the caption; item: a unit/foil
    pa.field("stage", pa.string()),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("detail", pa.string()),
    pa.field("raw_answer", pa.string()),
])
MANIFEST = EXTRACTION_MANIFEST








@dataclass(frozen=True)
class ExtractSummary:
    """Accounting over all shards of the output (including ones finished earlier)."""

    read: int
    with_units: int
    rejected: int
    rejected_by_reason: dict[str, int]
    items_rejected_by_reason: dict[str, int]
    num_shards: int
    shards_written: int
    shards_skipped: int
    units_uri: str
    rejects_uri: str
    mlflow_run_id: str | None = None

    def format(self) -> str:
        lines = [f"read {self.read} = with units {self.with_units} + rejected {self.rejected}",
                 f"shards: {self.num_shards} ({self.shards_written} written, "
                 f"{self.shards_skipped} already done)"]
        lines += [f"  rejected {reason}: {n}" for reason, n in sorted(self.rejected_by_reason.items())]
        if self.items_rejected_by_reason:
            lines.append("units/foils dropped by validation: " + ", ".join(
                f"{r} {n}" for r, n in sorted(self.items_rejected_by_reason.items())))
        lines += [f"units:   {self.units_uri}", f"rejects: {self.rejects_uri}"]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Ray Data stages (module-level functions so they pickle to workers)
# ---------------------------------------------------------------------------------------

_ROW_BACKENDS = {"gold": backends.gold_outcome, "rules": backends.rules_outcome,
                 "authors": backends.authors_outcome, "replay": answers.replay_outcome}


def backend_stage(batch: pa.Table, *, backend: str, prompt_set: PromptSet | None = None
                  ) -> pa.Table:
    """gold / rules / authors / replay: caption rows -> result rows. prompt_set: replay's,
    resolved by the driver (a prompt set registered there is unknown to the workers)."""
    outcome_of = _ROW_BACKENDS[backend]
    if prompt_set is not None:
        outcome_of = partial(outcome_of, prompt_set=prompt_set)
    rows = [backends.outcome_row(row, outcome_of(row)) for row in batch.to_pylist()]
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


def _run_backend(rows: pa.Table, config: ExtractConfig, engine: Engine | None,
                 attempt: int) -> Iterable[pa.Table]:
    """Stream result batches for `rows` (caption rows with `shard`, or rows to repair):
    the LLM's through its prompt set, the others row by row."""
    name = config.backend.name
    if name == "vllm":
        yield from get_prompt_set(config.backend.prompts).run(rows, config.backend.vllm, engine,
                                                               attempt)
        return
    prompt_set = get_prompt_set(config.backend.prompts) if name == "replay" else None
    ds = ray.data.from_arrow(backends.shard_blocks(rows, 500))
    ds = ds.map_batches(partial(backend_stage, backend=name, prompt_set=prompt_set),
                        batch_format="pyarrow", batch_size=None)
    yield from ds.iter_batches(batch_format="pyarrow", batch_size=None)


def run_backend(rows: pa.Table, config: ExtractConfig, engine: Engine | None,
                attempt: int) -> Iterable[pa.Table]:
    """_run_backend, for drivers of other inputs (csclip.extract.shards); looked up when
    called, so a test's stand-in for _run_backend serves them too."""
    return _run_backend(rows, config, engine, attempt)


# ---------------------------------------------------------------------------------------
# Shard files
# ---------------------------------------------------------------------------------------

class Output:
    """Paths and writes under output.uri."""

    def __init__(self, cfg: OutputConfig):
        self.uri = cfg.uri.rstrip("/")
        self.fs, self.root = storage.filesystem_for(cfg.uri, cfg.endpoint_url)

    def path(self, *parts: str) -> str:
        return storage.join(self.root, *parts)

    def uri_of(self, *parts: str) -> str:
        return storage.join(self.uri, *parts)

    def write_parquet(self, table: pa.Table, *parts: str) -> None:
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        storage.write_bytes_atomic(self.fs, self.path(*parts), buffer.getvalue())

    def read_parquet(self, *parts: str) -> pa.Table:
        return pq.read_table(io.BytesIO(storage.read_bytes(self.fs, self.path(*parts))))

    def done_shards(self) -> dict[int | str, dict]:
        """The done markers' counts by shard: its number (`part-K`) or its stem. Read 32 at
        a time: on S3 each is a GET, and a LAION-sized run has ~41k shards."""
        markers = storage.list_files(self.fs, self.path(EXTRACTION_DONE_DIR), ".json")
        names = [p.rsplit("/", 1)[-1][: -len(".json")] for p in markers]
        with ThreadPoolExecutor(max_workers=32) as pool:
            counts = pool.map(lambda p: json.loads(storage.read_bytes(self.fs, p)), markers)
            return {int(name[5:]) if name.startswith("part-") else name: c
                    for name, c in zip(names, counts, strict=True)}

    def has(self, *parts: str) -> bool:
        return storage.exists(self.fs, self.path(*parts))


def _part(shard: int | str, suffix: str) -> str:
    """A shard's file name: `part-00003` for a shard cut from a caption table, an input
    shard's own stem (csclip.shards.shard_stem) for webdataset input."""
    return f"part-{shard:05d}{suffix}" if isinstance(shard, int) else f"{shard}{suffix}"


def _check_manifest(out: Output, config: ExtractConfig, captions: pa.Table) -> None:
    ids = captions.column("sample_id")
    check_manifest(out, config, {"shard_size": config.output.shard_size,
                                 "num_rows": captions.num_rows, "first_sample_id": ids[0].as_py(),
                                 "last_sample_id": ids[-1].as_py()})


def check_manifest(out: Output, config: ExtractConfig, shards: dict) -> None:
    """Refuse to resume into an output written from other input or shard boundaries
    (`shards` says how the input was cut): its shards would overlap ours and rows would
    be duplicated. The first run writes the manifest."""
    manifest = {"input": config.input.model_dump(mode="json", exclude={"endpoint_url"}),
                "backend": config.backend.name, **shards}
    if config.backend.prompts != DEFAULT_PROMPT_SET:  # absent: older outputs still resume
        manifest["prompts"] = config.backend.prompts
    if config.swap_negatives.enabled:  # likewise: shards with and without them never mix
        manifest["swap_negatives"] = config.swap_negatives.model_dump()
    if out.has(MANIFEST):
        saved = json.loads(storage.read_bytes(out.fs, out.path(MANIFEST)))
        if saved != manifest:
            changed = sorted(k for k in manifest if saved.get(k) != manifest[k])
            raise DataError(f"{out.uri} holds a run with different {', '.join(changed)}; "
                            "resume with the same input/backend/shard_size or use a new output.uri")
        return
    storage.write_bytes_atomic(out.fs, out.path(MANIFEST), json.dumps(manifest, indent=1).encode())


def write_shard(out: Output, shard: int | str, results: pa.Table, expected: int,
                authors_format: bool = False,
                shuffles: Callable[[list[UnitsRecord]], list[UnitsRecord]] | None = None,
                extra: dict | None = None) -> dict:
    """Write units, rejects (the raw answers, the authors' format) of one shard (its number
    or stem: _part); return the counts of its done marker. shuffles: adds the records'
    caption shuffles (swap_negatives.enabled). extra: more fields of the marker."""
    rows = results.to_pylist()
    ids = [r["sample_id"] for r in rows]
    # Every caption of the shard comes back exactly once, or the accounting is wrong.
    assert len(ids) == len(set(ids)) == expected, (shard, len(ids), len(set(ids)), expected)
    ok = sorted((r for r in rows if r["status"] == Status.OK), key=lambda r: r["sample_id"])
    records = [backends.record_from_result(r) for r in ok]
    if shuffles is not None:
        records = shuffles(records)
    rejects: list[dict] = []
    for r in sorted(rows, key=lambda r: r["sample_id"]):
        if r["status"] != Status.OK:
            rejects.append({"sample_id": r["sample_id"], "level": "record", "stage": r["stage"],
                            "reason": r["reason"], "detail": r["detail"], "raw_answer": r["raw_answer"]})
        for reason, detail in json.loads(r["item_rejects_json"] or "[]"):
            rejects.append({"sample_id": r["sample_id"], "level": "item", "stage": r["stage"],
                            "reason": reason, "detail": detail, "raw_answer": None})
    out.write_parquet(records_to_table(records), "units", _part(shard, ".parquet"))
    out.write_parquet(pa.Table.from_pylist(rejects, schema=REJECTS_SCHEMA), "rejects",
                      _part(shard, ".parquet"))
    if any(r.get("calls_json") for r in rows):
        storage.write_bytes_atomic(out.fs, out.path("answers", _part(shard, ".jsonl")),
                                   answers.answers_lines(sorted(rows, key=lambda r: r["sample_id"])))
    if authors_format:
        storage.write_bytes_atomic(out.fs, out.path("authors", _part(shard, ".json")),
                                   answers.authors_file(sorted(rows, key=lambda r: r["sample_id"])))
    counts = {
        "shard": shard, "read": expected, "with_units": len(records),
        "rejected": expected - len(records),
        "rejected_by_reason": dict(Counter(r["reason"] for r in rejects if r["level"] == "record")),
        "items_rejected_by_reason": dict(Counter(r["reason"] for r in rejects if r["level"] == "item")),
        **(extra or {}),
    }
    return counts


def mark_done(out: Output, shard: int | str, counts: dict) -> None:
    """The shard's done marker, after its files: a rerun skips it from now on."""
    storage.write_bytes_atomic(out.fs, out.path(EXTRACTION_DONE_DIR, _part(shard, ".json")),
                               json.dumps(counts).encode())
    if out.has("_stage1", _part(shard, ".parquet")):
        storage.delete_file(out.fs, out.path("_stage1", _part(shard, ".parquet")))


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

ShardCallback = Callable[[int | str], None]  # a shard's number, or its stem (webdataset)


def read_input(config: ExtractConfig) -> pa.Table:
    """The caption rows of `config.input` (CAPTION_SCHEMA), read without Ray: the entry
    point reads them before starting Ray, so a bad input file fails at once.

    The authors' files already hold units: their records are the rows, and a record that
    cannot be read is a row too (rejected by the backend), so read = loaded + rejected."""
    if config.input.format == "webdataset":  # never one table: read shard by shard
        raise ConfigError("input.format=webdataset is extracted per shard by "
                          "csclip.extract.shards.run_shard_extraction (csclip extract runs it)")
    return (authors_caption_table(config.input) if config.backend.name == "authors"
            else caption_table(config.input))


def with_input_format(config: ExtractConfig) -> ExtractConfig:
    """`config` with input.format decided from the file (captions.resolve_format), so the
    run's params and name say which reader ran. The authors' backend reads its own files."""
    if config.backend.name == "authors" or config.input.format is not None:
        return config
    return config.model_copy(update={"input": resolve_format(config.input)})


def checked_output(config: ExtractConfig) -> str:
    """output.uri made absolute, refused (ConfigError) before the output is touched:
    inside a Ray job a relative output or sqlite store would land in the job's temporary
    working directory."""
    output = storage.resolve_output(config.output.uri, "output.uri")
    if config.tracking.enabled:
        tracking.resolve_uri(config.tracking.uri)
    return output


def run_extraction(config: ExtractConfig, engine: Engine | None = None,
                   on_shard_written: ShardCallback | None = None, *,
                   captions: pa.Table | None = None) -> ExtractSummary:
    """_extract under the lease of `config.output.uri` (one writer per output; a second
    one is refused with a DataError naming the holder)."""
    config = with_input_format(config)
    output = checked_output(config)
    if captions is None:  # a bad input fails before the lease, too
        captions = read_input(config)
    with output_lease(output, "csclip extract", config.output.endpoint_url, config=config):
        return _extract(config, engine, on_shard_written, captions=captions)


def _extract(config: ExtractConfig, engine: Engine | None = None,
             on_shard_written: ShardCallback | None = None, *,
             captions: pa.Table | None = None) -> ExtractSummary:
    """Extract units for every caption of `config.input` into `config.output.uri`.

    engine: the LLM stage for backend `vllm` (default: the ray.data.llm vLLM processor);
    tests pass a CPU stand-in. on_shard_written: called after each shard's marker.
    captions: read_input(config) when the caller read it already.
    Raises DataError for unreadable/empty input or an output written by another config,
    ConfigError for a relative output or tracking store inside a Ray job.
    """
    if captions is None:
        captions = read_input(config)
    shard_size = config.output.shard_size
    num_rows = captions.num_rows
    captions = captions.append_column("shard", pa.array(
        [i // shard_size for i in range(num_rows)], pa.int64()))
    captions = captions.append_column("caption_index", pa.array(range(num_rows), pa.int64()))
    if config.backend.name == "replay":
        captions = answers.attach_answers(captions, config.backend, config.input.endpoint_url)
    num_shards = -(-num_rows // shard_size)
    shuffles = shuffles_for(config)
    out = Output(config.output)
    _check_manifest(out, config, captions)

    done = out.done_shards()
    pending = [k for k in range(num_shards) if k not in done]
    parked = [k for k in pending if out.has("_stage1", _part(k, ".parquet"))]
    fresh = [k for k in pending if k not in parked]
    log.info("extract: %d captions in %d shards; %d done, %d to run, %d parked for repair",
             num_rows, num_shards, len(done), len(fresh), len(parked))
    expected = {k: min(shard_size, num_rows - k * shard_size) for k in range(num_shards)}
    written = 0

    def finished(shard: int, results: pa.Table) -> None:
        nonlocal written
        done[shard] = write_shard(out, shard, results, expected[shard],
                                  config.output.format == "authors", shuffles)
        mark_done(out, shard, done[shard])
        written += 1
        log.info("extract: shard %d/%d written (%d/%d shards done)", shard + 1, num_shards,
                 len(done), num_shards)
        if on_shard_written is not None:
            on_shard_written(shard)

    if fresh:
        rows = captions.filter(pc.is_in(captions.column("shard"), pa.array(fresh, pa.int64())))
        collect_shards(out, _run_backend(rows, config, engine, attempt=0), expected, finished,
                       parked)
    if parked:
        repair_parked(out, sorted(parked), config, engine, finished)
    if config.output.dump_prompts:
        answers.dump_prompts(out.fs, out.path("answers"), captions, config)
    summary = summarize(out, config, range(num_shards), written, num_rows)
    write_complete(out, summary)
    return summary


def shuffles_for(config: ExtractConfig) -> Callable[[list[UnitsRecord]], list[UnitsRecord]] | None:
    """The records' caption shuffles when swap_negatives is enabled (its spaCy model loaded
    here: a missing model fails before any work), else None."""
    if not config.swap_negatives.enabled:
        return None
    return partial(swap_negatives.with_swap_negatives, config=config.swap_negatives,
                   nlp=swap_negatives.load_pipeline(config.swap_negatives.spacy_model))


def _same(shard: int) -> int:
    return shard


def collect_shards(out: Output, batches: Iterable[pa.Table], expected: dict[int, int],
                   finished: Callable[[int, pa.Table], None], parked: list[int],
                   name: Callable[[int], int | str] = _same) -> None:
    """Gather result batches by shard: a shard whose `expected` rows are all back is
    finished, or parked in _stage1/ (file `name(shard)`) when rows wait for repair. Only
    the rows of unfinished shards are held."""
    buffers: dict[int, list[pa.Table]] = defaultdict(list)
    counts: Counter[int] = Counter()
    for batch in batches:
        for shard in set(batch.column("shard").to_pylist()):
            part = batch.filter(pc.equal(batch.column("shard"), shard))
            buffers[shard].append(part)
            counts[shard] += part.num_rows
            if counts[shard] == expected[shard]:
                results = pa.concat_tables(buffers.pop(shard))
                if pc.any(pc.equal(results.column("status"), Status.REPAIR)).as_py():
                    out.write_parquet(results, "_stage1", _part(name(shard), ".parquet"))
                    parked.append(shard)
                else:
                    finished(shard, results)
    if buffers:
        raise RuntimeError(f"extract: shards {sorted(buffers)} came back incomplete")


def repair_parked(out: Output, parked: list[int], config: ExtractConfig, engine: Engine | None,
                  finished: Callable[[int, pa.Table], None],
                  name: Callable[[int], int | str] = _same) -> None:
    """One more engine call for every parked row, then finish the parked shards. Only the
    rows to repair are held in memory; each shard is re-read when it is finished."""
    def stage1(shard: int) -> pa.Table:
        return out.read_parquet("_stage1", _part(name(shard), ".parquet"))

    to_repair = pa.concat_tables(
        [t.filter(pc.equal(t.column("status"), Status.REPAIR)) for t in map(stage1, parked)])
    log.info("extract: repairing %d answers in %d shards", to_repair.num_rows, len(parked))
    repaired = {}
    for batch in _run_backend(to_repair, config, engine, attempt=1):
        for row in batch.to_pylist():
            repaired[row["sample_id"]] = row
    for shard in parked:
        rows = [answers.with_earlier_calls(repaired.get(r["sample_id"], r), r)
                if r["status"] == Status.REPAIR else r for r in stage1(shard).to_pylist()]
        finished(shard, pa.Table.from_pylist(rows, schema=RESULT_SCHEMA))


def summarize(out: Output, config: ExtractConfig, shards: Iterable[int | str], written: int,
              num_rows: int | None) -> ExtractSummary:
    """The accounting over the done markers of `shards` (all must be there), checked
    against `num_rows` input captions (None: known only from the markers), logged to
    MLflow when tracking is on."""
    shards = list(shards)
    done = out.done_shards()
    missing = [k for k in shards if k not in done]
    if missing:
        raise RuntimeError(f"extract: shards {missing} have no done marker after the run")
    done = {k: done[k] for k in shards}
    by_reason: Counter[str] = Counter()
    items: Counter[str] = Counter()
    for counts in done.values():
        by_reason.update(counts["rejected_by_reason"])
        items.update(counts["items_rejected_by_reason"])
    read = sum(c["read"] for c in done.values())
    with_units = sum(c["with_units"] for c in done.values())
    rejected = sum(c["rejected"] for c in done.values())
    if not read == with_units + rejected == (read if num_rows is None else num_rows):
        raise RuntimeError(f"extract: accounting broken: read {read} != with units {with_units}"
                           f" + rejected {rejected}, or != {num_rows} captions in the input")
    summary = ExtractSummary(
        read=read, with_units=with_units, rejected=rejected,
        rejected_by_reason=dict(by_reason), items_rejected_by_reason=dict(items),
        num_shards=len(shards), shards_written=written, shards_skipped=len(shards) - written,
        units_uri=out.uri_of("units"), rejects_uri=out.uri_of("rejects"))
    if config.tracking.enabled:
        run_id = log_to_mlflow(summary, config, out)
        summary = replace(summary, mlflow_run_id=run_id)
    return summary


def write_complete(out: Output, summary: ExtractSummary) -> None:
    """The output's last file: readers of the output (csclip.units.check_extraction_complete)
    refuse it until this marker is there."""
    complete = {k: v for k, v in asdict(summary).items() if k != "mlflow_run_id"}
    storage.write_bytes_atomic(out.fs, out.path(EXTRACTION_COMPLETE),
                               json.dumps(complete, indent=1).encode())


def log_to_mlflow(summary: ExtractSummary, config: ExtractConfig, out: Output) -> str:
    """Params (the resolved config), accounting metrics and the rejects table artifact, in
    one run of the tracking store csclip.tracking.resolve_uri picks."""
    client = tracking.client(tracking.resolve_uri(config.tracking.uri))
    experiment = tracking.experiment_id(client, config.tracking.experiment)
    source = "files" if config.backend.name == "authors" else config.input.format
    run_name = config.tracking.run_name or f"extract-{config.backend.name}-{source}"
    run_id = client.create_run(experiment, run_name=run_name).info.run_id
    tracking.log_params(client, run_id, {k: str(v)[:500] for k, v in flatten(config).items()})
    metrics = {"read": summary.read, "with_units": summary.with_units,
               "rejected": summary.rejected, "num_shards": summary.num_shards,
               "shards_written": summary.shards_written}
    metrics.update({f"rejected.{r}": n for r, n in summary.rejected_by_reason.items()})
    metrics.update({f"items_rejected.{r}": n for r, n in summary.items_rejected_by_reason.items()})
    tracking.log_metrics(client, run_id, metrics)
    parts = storage.list_files(out.fs, out.path("rejects"), ".parquet")
    rejects = pa.concat_tables([out.read_parquet("rejects", p.rsplit("/", 1)[1]) for p in parts]) \
        if parts else REJECTS_SCHEMA.empty_table()
    with tempfile.TemporaryDirectory() as tmp:
        pq.write_table(rejects, Path(tmp) / "rejects.parquet")
        (Path(tmp) / "summary.txt").write_text(summary.format() + "\n")
        client.log_artifacts(run_id, tmp, artifact_path="extract")
    client.set_terminated(run_id)
    return run_id

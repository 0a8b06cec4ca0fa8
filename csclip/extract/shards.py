"""Unit extraction from webdataset shards (`csclip extract --format webdataset`): per input
shard `units/{stem}.parquet`, `rejects/{stem}.parquet`, then `_done/{stem}.json`; a rerun
redoes only the shards without a marker.

Reading: a Ray Data task per shard (`from_items` of the URIs, `map_batches` over
csclip.shards.read.iter_shard with images=False), not `ray.data.read_webdataset`: Ray
2.60's reader fails the whole read on a repeated key or member, a shard cut short or bad
JSON, passes a sample without caption on as a row without `txt`, and reads every member's
bytes before its `fileselect` filter. iter_shard yields each bad sample as a rejection with
its reason (stage "read") and never keeps an image's bytes; a task reads its whole shard,
so it knows the shard's row count.

gold, rules: the task that reads a shard also runs the backend (pipeline.backend_stage)
and writes the shard's units and rejects; the driver gets a row per shard (counts, 64-bit
key hashes), checks the keys and writes the marker. It never holds captions or units:
writing them in the driver capped a run at ~3,900 captions per driver CPU-second
(docs/performance.md). vllm: windows of output.shards_per_window shards; the driver reads
a window's captions (the next window's while the engines work), sends them through the
engine stage (pipeline.run_backend) and writes each shard when its last row is back.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import ray.data

from csclip import storage
from csclip.config.extract import ExtractConfig, InputConfig
from csclip.errors import DataError
from csclip.extract.backends import RESULT_SCHEMA, Outcome, outcome_row
from csclip.extract.captions import CAPTION_SCHEMA
from csclip.extract.pipeline import (
    ExtractSummary,
    Output,
    ShardCallback,
    backend_stage,
    check_manifest,
    checked_output,
    collect_shards,
    mark_done,
    repair_parked,
    run_backend,
    shuffles_for,
    summarize,
    write_complete,
    write_shard,
)
from csclip.extract.vllm import Engine
from csclip.ownership import output_lease
from csclip.shards import expand_shards, shard_stem
from csclip.shards.read import BAD_JSON, ShardSample, iter_shard
from csclip.units import RejectReason, UnitsRecord

log = logging.getLogger(__name__)

# One row per sample of a shard: a caption row, plus why the read rejected it (or null)
# and a 64-bit hash of its sample_id (KeyIndex).
SAMPLE_SCHEMA = pa.schema([*CAPTION_SCHEMA, pa.field("shard", pa.int64(), nullable=False),
                           pa.field("caption_index", pa.int64(), nullable=False),
                           pa.field("reject", pa.string()), pa.field("detail", pa.string()),
                           pa.field("key_hash", pa.uint64(), nullable=False)])
SHARD_META_KEY = "shard"  # the units' meta entry naming the input shard's stem
# A shard that could not be opened (missing, no access): not data to count but a run that
# cannot go on, or a wrong credential would mark every shard done with nothing read.
CANNOT_OPEN = "cannot_open"


def shard_uris(cfg: InputConfig) -> list[str]:
    """The shards of input.uri. Raises DataError for a pattern naming no shard, a local
    shard that is missing, or two shards with one stem (their outputs would share a name)."""
    uris = expand_shards(cfg.uri)
    first: dict[str, str] = {}
    for uri in uris:
        other = first.setdefault(shard_stem(uri), uri)
        if other != uri:
            raise DataError(f"shards {other} and {uri} are both named {shard_stem(uri)!r}, "
                            "and their outputs are named by it; extract them into two outputs")
    return uris


def key_hash(sample_id: str) -> int:
    """A sample_id's 64-bit hash (KeyIndex)."""
    return int.from_bytes(hashlib.blake2b(sample_id.encode(), digest_size=8).digest(), "little")


# ---------------------------------------------------------------------------------------
# The read: a Ray Data task per shard
# ---------------------------------------------------------------------------------------

def sample_rows(uri: str, shard: int, split: str, endpoint_url: str | None) -> Iterator[dict]:
    """SAMPLE_SCHEMA rows of one shard, in the tar's order. sample_id is the sample's key;
    image_id and split are its JSON's when it has them (else the key, `split`); the world's
    shards carry their gold units in the JSON's gold_json. A shard that cannot be opened is
    one row marked CANNOT_OPEN, on which the driver stops the run."""
    stem = shard_stem(uri)
    try:
        samples = list(iter_shard(uri, images=False, endpoint_url=endpoint_url))
    except DataError as err:  # raised by the driver, where it ends the run with one line
        samples = [ShardSample(uri, "", reject=CANNOT_OPEN, detail=str(err))]
    seen: dict[str, int] = {}
    for index, sample in enumerate(samples):
        key = sample.key or f"({stem})"  # a cut before any whole sample leaves no key
        seen[key] = seen.get(key, 0) + 1
        # A key the shard repeats is rejected (repeated_key); its row still needs an id.
        sample_id = key if seen[key] == 1 else f"{key}#{seen[key]}"
        gold_json, reject, detail = _gold_json(sample.meta.get("gold_json"), sample_id)
        yield {"sample_id": sample_id, "image_id": str(sample.meta.get("image_id") or key),
               "image_path": None, "caption": sample.caption or "",
               "split": str(sample.meta.get("split") or split), "image_bytes": None,
               "gold_json": gold_json, "shard": shard, "caption_index": index,
               "reject": sample.reject or reject, "detail": sample.detail or detail,
               "key_hash": key_hash(sample_id)}


def _gold_json(text: object, sample_id: str) -> tuple[str | None, str | None, str | None]:
    """(gold_json naming the sample by its key, no rejection), or a bad_json rejection: the
    gold backend takes the record's id from it, and training joins units to shards by key."""
    if text is None:
        return None, None, None
    try:
        gold = json.loads(text) if isinstance(text, str) else None
    except ValueError as err:
        return None, BAD_JSON, f"gold_json: {err}"[:300]
    if not isinstance(gold, dict):
        return None, BAD_JSON, "gold_json is not a JSON object as a string"
    return json.dumps({**gold, "sample_id": sample_id}, sort_keys=True), None, None


def read_shard(uri: str, shard: int, cfg: InputConfig) -> pa.Table:
    """The samples of one shard (SAMPLE_SCHEMA)."""
    return pa.Table.from_pylist(list(sample_rows(uri, shard, cfg.split or "train",
                                                 cfg.endpoint_url)), schema=SAMPLE_SCHEMA)


def read_rejects(samples: pa.Table) -> pa.Table:
    """Result rows (RESULT_SCHEMA) of the samples the read rejected, with the read's reasons
    (csclip.shards.read's, not RejectReason's)."""
    rows = []
    for row in samples.to_pylist():
        outcome = Outcome("read", reason=RejectReason.MISSING_FIELD, detail=row["detail"] or "")
        rows.append({**outcome_row(row, outcome), "reason": row["reject"]})
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


# ---------------------------------------------------------------------------------------
# Keys repeated across shards
# ---------------------------------------------------------------------------------------

class KeyIndex:
    """The 64-bit hashes of the sample_ids of every shard written (8 bytes a sample), so a
    key that another shard holds too is found without keeping the ids; a hash that comes
    back is checked against the written ids before it is called a repeat."""

    # Hashes of new shards wait in `recent` (sorted, each searched) until this many keys or
    # shards, then join `merged`: a linear merge per ~million keys, not one per shard.
    MERGE_AT, MERGE_SHARDS = 1 << 20, 64

    def __init__(self, out: Output):
        self.out = out
        self.merged = np.empty(0, np.uint64)
        self.recent: list[np.ndarray] = []
        self.stems: set[str] = set()

    def seed(self, stems: set[str]) -> None:
        """Add the shards written by an earlier run (read back from their files)."""
        for folder, where in RECORD_ROWS:
            files = [f for f in self._files(folder) if _stem_of(f) in stems]
            if files:
                dataset = pads.dataset(files, filesystem=self.out.fs, format="parquet")
                for batch in dataset.to_batches(columns=["sample_id"], filter=where):
                    self.recent.append(np.sort(np.array(
                        [key_hash(i) for i in batch.column(0).to_pylist()], np.uint64)))
        self.stems |= stems
        self._merge()

    def add(self, stem: str, hashes: np.ndarray, ids: Callable[[], list[str]]) -> None:
        """Add one shard's hashes (`ids`: its ids, asked for only when a hash is known).
        Raises DataError naming a key that a shard added before holds too."""
        hits = np.zeros(len(hashes), bool)
        for known in (self.merged, *self.recent):
            at = np.minimum(np.searchsorted(known, hashes), max(len(known) - 1, 0))
            hits |= known[at] == hashes if len(known) else False
        if hits.any():
            wanted = set(hashes[hits].tolist())
            found = self._written([i for i in ids() if key_hash(i) in wanted])
            if found is not None:
                raise _repeat(found[0], found[1], stem)
        self.recent.append(np.sort(hashes))
        self.stems.add(stem)
        if (len(self.recent) >= self.MERGE_SHARDS
                or sum(len(r) for r in self.recent) >= self.MERGE_AT):
            self._merge()

    def check_window(self, samples: pa.Table, stems: Sequence[str]) -> None:
        """Refuse (DataError) a sample_id that two shards of a window read but not yet
        written hold (`add` checks against written shards only)."""
        ids = samples.column("sample_id")
        counts = pc.value_counts(ids)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(repeated):
            key = repeated[0]["values"].as_py()
            first, second = samples.filter(pc.equal(ids, key)).column("shard").to_pylist()[:2]
            raise _repeat(key, stems[first], stems[second])

    def _merge(self) -> None:
        # Sorted runs: the stable sort (timsort) merges them in about linear time.
        self.merged = np.sort(np.concatenate([self.merged, *self.recent]), kind="stable")
        self.recent = []

    def _written(self, candidates: list[str]) -> tuple[str, str] | None:
        """(sample_id, stem) of a row of an added shard with one of the `candidates` ids,
        or None (their hashes only collided). Rare, so one file after the other."""
        chosen = pc.field("sample_id").isin(candidates)
        for folder, where in RECORD_ROWS:
            for file in self._files(folder):
                if _stem_of(file) in self.stems:
                    table = pq.read_table(file, filesystem=self.out.fs, columns=["sample_id"],
                                          filters=chosen if where is None else where & chosen)
                    if table.num_rows:
                        return table.column("sample_id")[0].as_py(), _stem_of(file)
        return None

    def _files(self, folder: str) -> list[str]:
        return storage.list_files(self.out.fs, self.out.path(folder), ".parquet")


def _repeat(key: str, first: str, second: str) -> DataError:
    return DataError(f"sample key {key!r} is in shard {first} and in shard {second}: samples "
                     "need keys unique across shards (csclip shards makes them from the "
                     "sample ids); fix the shards and extract into a new output.uri")


# The files that hold a sample's row, and which of their rows those are.
RECORD_ROWS = (("units", None), ("rejects", pc.field("level") == "record"))


def _stem_of(path: str) -> str:
    return path.rsplit("/", 1)[-1][: -len(".parquet")]


def written_ids(out: Output, stem: str) -> list[str]:
    """The sample_ids a shard's written units and rejects hold."""
    return [i for folder, where in RECORD_ROWS if out.has(folder, f"{stem}.parquet")
            for i in pq.read_table(out.path(folder, f"{stem}.parquet"), filesystem=out.fs,
                                   columns=["sample_id"], filters=where
                                   ).column("sample_id").to_pylist()]


# ---------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------

class Progress:
    """A log line per finished shard with the captions/s of this run and an ETA."""

    def __init__(self, num_shards: int, num_done: int):
        self.num_shards, self.num_done = num_shards, num_done
        self.written = self.captions = 0
        self.start = time.monotonic()

    def shard_written(self, stem: str, read: int) -> None:
        self.written += 1
        self.num_done += 1
        self.captions += read
        elapsed = max(time.monotonic() - self.start, 1e-9)
        left = timedelta(seconds=round((self.num_shards - self.num_done) * elapsed / self.written))
        log.info("extract: shard %s written (%d/%d shards, %.0f captions/s, ETA %s)", stem,
                 self.num_done, self.num_shards, self.captions / elapsed, left)


def run_shard_extraction(config: ExtractConfig, engine: Engine | None = None,
                         on_shard_written: ShardCallback | None = None) -> ExtractSummary:
    """Extract the units of every shard of input.uri (input.format webdataset) into
    output.uri, under its lease (one writer per output).

    engine: the LLM stage for backend vllm (tests pass a CPU stand-in). on_shard_written:
    called with a shard's stem after its marker. Raises DataError for shards that cannot be
    listed or opened, a sample key in two shards, or an output written from other input or
    backend.
    """
    output = checked_output(config)
    uris = shard_uris(config.input)  # a bad pattern fails before the lease
    with output_lease(output, "csclip extract", config.output.endpoint_url, config=config):
        return _extract_shards(config, uris, engine, on_shard_written)


def _extract_shards(config: ExtractConfig, uris: list[str], engine: Engine | None,
                    on_shard_written: ShardCallback | None) -> ExtractSummary:
    stems = [shard_stem(uri) for uri in uris]
    shuffles = shuffles_for(config)  # a missing spaCy model fails before any work
    out = Output(config.output)
    check_manifest(out, config, {"num_shards": len(uris)})
    done = out.done_shards()
    pending = [k for k, stem in enumerate(stems) if stem not in done]
    waiting = {_stem_of(f) for f in storage.list_files(out.fs, out.path("_stage1"), ".parquet")}
    parked = [k for k in pending if stems[k] in waiting]
    fresh = sorted(set(pending) - set(parked))
    log.info("extract: %d shards; %d done, %d to run, %d parked for repair", len(uris),
             len(uris) - len(pending), len(fresh), len(parked))
    progress = Progress(len(uris), len(uris) - len(pending))

    def mark(shard: int, counts: dict) -> None:
        mark_done(out, stems[shard], counts)
        progress.shard_written(stems[shard], counts["read"])
        if on_shard_written is not None:
            on_shard_written(stems[shard])

    def finished(shard: int, results: pa.Table) -> None:
        mark(shard, write_shard(out, stems[shard], results, results.num_rows,
                                config.output.format == "authors",
                                partial(_tagged, stem=stems[shard], shuffles=shuffles),
                                {"uri": uris[shard]}))

    if parked:  # a killed run's first pass, waiting for its repair
        repair_parked(out, parked, config, engine, finished, stems.__getitem__)
    keys = KeyIndex(out)
    keys.seed(set(stems) - {stems[k] for k in fresh})
    if config.backend.name == "vllm":
        _run_windows(out, fresh, uris, config, engine, keys, finished)
    else:
        _run_tasks(out, fresh, uris, config, keys, mark)
    summary = summarize(out, config, stems, progress.written, None)
    write_complete(out, summary)
    return summary


def _tagged(records: list[UnitsRecord], *, stem: str,
            shuffles: Callable[[list[UnitsRecord]], list[UnitsRecord]] | None
            ) -> list[UnitsRecord]:
    """The records with their shard in meta (and their caption shuffles, when on)."""
    records = [replace(r, meta={**r.meta, SHARD_META_KEY: stem}) for r in records]
    return shuffles(records) if shuffles is not None else records


# ---------------------------------------------------------------------------------------
# gold, rules: a Ray Data task per shard reads, extracts and writes it
# ---------------------------------------------------------------------------------------

TASK_SCHEMA = pa.schema([("shard", pa.int64()), ("counts_json", pa.string()),
                         ("error", pa.string()), ("key_hashes", pa.list_(pa.uint64()))])


@functools.lru_cache(maxsize=1)
def _worker_config(config_json: str) -> tuple[ExtractConfig, Callable | None]:
    """The config a task was sent (validated again) and its shuffles, once per worker."""
    config = ExtractConfig.model_validate_json(config_json)
    return config, shuffles_for(config)


def extract_shard_stage(batch: pa.Table, *, config_json: str) -> pa.Table:
    """Ray Data stage: rows (`shard`, `uri`) -> each shard read, extracted (backend_stage)
    and its units and rejects written; its marker's counts and its keys' hashes go back to
    the driver, which checks the keys and then writes the marker."""
    config, shuffles = _worker_config(config_json)
    out = Output(config.output)
    rows = []
    for shard, uri in zip(batch.column("shard").to_pylist(), batch.column("uri").to_pylist(),
                          strict=True):
        samples = read_shard(uri, shard, config.input)
        if pc.any(pc.equal(samples.column("reject"), CANNOT_OPEN)).as_py():
            rows.append({"shard": shard, "error": samples.column("detail")[0].as_py()})
            continue
        rejected = pc.is_valid(samples.column("reject"))
        kept = samples.filter(pc.invert(rejected)).drop_columns(["reject", "detail", "key_hash"])
        results = pa.concat_tables([read_rejects(samples.filter(rejected)),
                                    backend_stage(kept, backend=config.backend.name)])
        counts = write_shard(out, shard_stem(uri), results, results.num_rows, False,
                             partial(_tagged, stem=shard_stem(uri), shuffles=shuffles),
                             {"uri": uri})
        rows.append({"shard": shard, "counts_json": json.dumps(counts),
                     "key_hashes": samples.column("key_hash").combine_chunks()})
    return pa.Table.from_pylist(rows, schema=TASK_SCHEMA)


def _run_tasks(out: Output, shards: list[int], uris: list[str], config: ExtractConfig,
               keys: KeyIndex, mark: Callable[[int, dict], None]) -> None:
    """One Ray Data execution over every shard to run: the driver gets a row per shard
    (counts and key hashes), never the captions or units."""
    if not shards:
        return
    items = [{"shard": k, "uri": uris[k]} for k in shards]
    ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        partial(extract_shard_stage, config_json=config.model_dump_json()),
        batch_format="pyarrow", batch_size=1)
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        hashes = batch.column("key_hashes")
        for index, row in enumerate(batch.select(["shard", "counts_json", "error"]).to_pylist()):
            if row["error"] is not None:
                raise _cannot_open(row["error"])
            stem = shard_stem(uris[row["shard"]])
            keys.add(stem, hashes[index].values.to_numpy(zero_copy_only=False),
                     partial(written_ids, out, stem))
            mark(row["shard"], json.loads(row["counts_json"]))


def _cannot_open(detail: str) -> DataError:
    return DataError(f"{detail}; check the credentials and input.endpoint_url, or leave the "
                     "shard out of input.uri (and extract into a new output.uri)")


# ---------------------------------------------------------------------------------------
# vllm: windows of shards through the engine stage
# ---------------------------------------------------------------------------------------

def read_window(shards: Sequence[int], uris: Sequence[str], cfg: InputConfig) -> pa.Table:
    """The samples of `shards` (indices into `uris`), one Ray Data task per shard."""
    items = [{"shard": k, "uri": uris[k]} for k in shards]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(partial(read_shards_stage, input_json=cfg.model_dump_json()),
                        batch_format="pyarrow", batch_size=1)
    tables = list(ds.iter_batches(batch_format="pyarrow", batch_size=None))
    samples = pa.concat_tables(tables) if tables else SAMPLE_SCHEMA.empty_table()
    unopened = samples.filter(pc.equal(samples.column("reject"), CANNOT_OPEN))
    if unopened.num_rows:
        raise _cannot_open(unopened.column("detail")[0].as_py())
    return samples


def read_shards_stage(batch: pa.Table, *, input_json: str) -> pa.Table:
    """Ray Data stage: rows (`shard`, `uri`) -> the samples of those shards (SAMPLE_SCHEMA)."""
    cfg = InputConfig.model_validate_json(input_json)
    return pa.concat_tables([read_shard(uri, shard, cfg) for shard, uri in zip(
        batch.column("shard").to_pylist(), batch.column("uri").to_pylist(), strict=True)])


def _run_windows(out: Output, fresh: list[int], uris: list[str], config: ExtractConfig,
                 engine: Engine | None, keys: KeyIndex,
                 finished: Callable[[int, pa.Table], None]) -> None:
    """The engine over windows of output.shards_per_window shards (the next one read while
    the engine works on this one): each window's captions go to the engine stage at once."""
    size = config.output.shards_per_window
    windows = [fresh[i:i + size] for i in range(0, len(fresh), size)]
    with ThreadPoolExecutor(max_workers=1) as reader:
        reads: Iterator[Future] = (reader.submit(read_window, window, uris, config.input)
                                   for window in windows)
        ahead = list(itertools.islice(reads, 1))
        for window in windows:
            ahead.extend(itertools.islice(reads, 1))
            samples = ahead.pop(0).result()
            keys.check_window(samples, [shard_stem(uri) for uri in uris])
            for shard in window:  # before any of the window is written
                mine = samples.filter(pc.equal(samples.column("shard"), shard))
                keys.add(shard_stem(uris[shard]), mine.column("key_hash").to_numpy(),
                         mine.column("sample_id").to_pylist)
            _run_window(out, window, samples, config, engine, finished,
                        lambda k: shard_stem(uris[k]))


def _run_window(out: Output, window: list[int], samples: pa.Table, config: ExtractConfig,
                engine: Engine | None, finished: Callable[[int, pa.Table], None],
                name: Callable[[int], str]) -> None:
    """The backend over one window's samples; each shard finished when all its rows are
    back (the read's rejections first), shards waiting for repair finished after it."""
    counts = pc.value_counts(samples.column("shard"))
    expected = dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(),
                        strict=True))
    for shard in window:
        if shard not in expected:  # a tar without a sample: a marker with read 0
            finished(shard, RESULT_SCHEMA.empty_table())
    rejected = pc.is_valid(samples.column("reject"))
    kept = samples.filter(pc.invert(rejected)).drop_columns(["reject", "detail", "key_hash"])
    batches = itertools.chain([read_rejects(samples.filter(rejected))],
                              run_backend(kept, config, engine, 0) if kept.num_rows else [])
    parked: list[int] = []
    collect_shards(out, batches, expected, finished, parked, name)
    if parked:
        repair_parked(out, sorted(parked), config, engine, finished, name)

"""Unit extraction from webdataset shards (`csclip extract --format webdataset`): per input
shard `units/{stem}.parquet`, `rejects/{stem}.parquet`, then `_done/{stem}.json`; a rerun
redoes only the shards without a marker.

Reading: a Ray Data task per shard (`from_items` of the URIs, `map_batches` over
csclip.shards.read.iter_shard with images=False), not `ray.data.read_webdataset`: Ray
2.60's reader fails the whole read on a repeated key or member, a shard cut short or bad
JSON, passes a sample without caption on as a row without `txt`, and reads every member's
bytes before its `fileselect` filter. iter_shard yields each bad sample as a rejection with
its reason (stage "read") and never keeps an image's bytes. The driver takes the shards in
windows of output.shards_per_window: it reads a window's captions (so it knows each
shard's row count), sends them through the backend (pipeline.run_backend: rules on CPU
tasks, vllm on its GPU actor stage) and writes each shard when its last row is back. It
holds two windows' captions at most (the next one is read while the backend runs), never
all of them.
"""

from __future__ import annotations

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
    check_manifest,
    checked_output,
    collect_shards,
    finish_shard,
    repair_parked,
    run_backend,
    shuffles_for,
    summarize,
    write_complete,
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
    one rejected row (unreadable_shard)."""
    stem = shard_stem(uri)
    try:
        samples = list(iter_shard(uri, images=False, endpoint_url=endpoint_url))
    except DataError as err:  # the driver stops the run (read_window): no marker is written
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


def read_shards_stage(batch: pa.Table, *, split: str, endpoint_url: str | None) -> pa.Table:
    """Ray Data stage: rows (`shard`, `uri`) -> the samples of those shards (SAMPLE_SCHEMA)."""
    rows = [row for shard, uri in zip(batch.column("shard").to_pylist(),
                                      batch.column("uri").to_pylist(), strict=True)
            for row in sample_rows(uri, shard, split, endpoint_url)]
    return pa.Table.from_pylist(rows, schema=SAMPLE_SCHEMA)


def read_window(shards: Sequence[int], uris: Sequence[str], cfg: InputConfig) -> pa.Table:
    """The samples of `shards` (indices into `uris`), one Ray Data task per shard."""
    items = [{"shard": k, "uri": uris[k]} for k in shards]
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(partial(read_shards_stage, split=cfg.split or "train",
                                endpoint_url=cfg.endpoint_url),
                        batch_format="pyarrow", batch_size=1)
    tables = list(ds.iter_batches(batch_format="pyarrow", batch_size=None))
    samples = pa.concat_tables(tables) if tables else SAMPLE_SCHEMA.empty_table()
    unopened = samples.filter(pc.equal(samples.column("reject"), CANNOT_OPEN))
    if unopened.num_rows:
        raise DataError(f"{unopened.column('detail')[0].as_py()} ({unopened.num_rows} of "
                        f"{len(shards)} shards of this window); check the credentials and "
                        "input.endpoint_url, or leave missing shards out of input.uri (then "
                        "into a new output.uri)")
    return samples


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
    """The 64-bit hashes of every sample_id of the output (8 bytes a sample, sorted), so a
    key that another shard holds too is found without keeping the ids; a hash that comes
    back is checked against the written ids before it is called a repeat."""

    def __init__(self, out: Output):
        self.out = out
        self.hashes = np.empty(0, np.uint64)

    def seed(self, stems: set[str]) -> None:
        """Add the ids of shards already written (a resumed run)."""
        for folder, where in self._record_rows():
            files = [f for f in self._files(folder) if _stem_of(f) in stems]
            if files:
                ids = pads.dataset(files, filesystem=self.out.fs, format="parquet").to_table(
                    columns=["sample_id"], filter=where).column("sample_id").to_pylist()
                self._merge(np.array([key_hash(i) for i in ids], np.uint64))

    def add(self, samples: pa.Table, stems: Sequence[str]) -> None:
        """Add a window's samples. Raises DataError naming a sample_id that two of its shards
        hold, or that it shares with a shard written before."""
        ids = samples.column("sample_id")
        counts = pc.value_counts(ids)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        if len(repeated):
            key = repeated[0]["values"].as_py()
            where = samples.filter(pc.equal(ids, key)).column("shard").to_pylist()
            raise self._repeat(key, stems[where[0]], stems[where[1]])
        hashes = samples.column("key_hash").to_numpy()
        at = np.minimum(np.searchsorted(self.hashes, hashes), max(len(self.hashes) - 1, 0))
        hits = self.hashes[at] == hashes if len(self.hashes) else np.zeros(len(hashes), bool)
        if hits.any():
            candidates = pc.filter(ids, pa.array(hits)).to_pylist()
            found = self._written(candidates)
            if found is not None:
                key, stem = found
                shard = samples.filter(pc.equal(ids, key)).column("shard")[0].as_py()
                raise self._repeat(key, stem, stems[shard])
        self._merge(hashes)

    def _merge(self, hashes: np.ndarray) -> None:
        # Two sorted runs: the stable sort (timsort) merges them in linear time.
        self.hashes = np.sort(np.concatenate([self.hashes, np.sort(hashes)]), kind="stable")

    @staticmethod
    def _record_rows() -> list[tuple[str, pc.Expression | None]]:
        """The files that hold a sample's row, and which of their rows those are."""
        return [("units", None), ("rejects", pc.field("level") == "record")]

    def _written(self, candidates: list[str]) -> tuple[str, str] | None:
        """(sample_id, stem) of a written row with one of the `candidates` ids, or None
        (their hashes only collided). Rare, so one file after the other."""
        for folder, where in self._record_rows():
            chosen = pc.field("sample_id").isin(candidates)
            for file in self._files(folder):
                table = pq.read_table(file, filesystem=self.out.fs, columns=["sample_id"],
                                      filters=chosen if where is None else where & chosen)
                if table.num_rows:
                    return table.column("sample_id")[0].as_py(), _stem_of(file)
        return None

    def _files(self, folder: str) -> list[str]:
        return storage.list_files(self.out.fs, self.out.path(folder), ".parquet")

    def _repeat(self, key: str, first: str, second: str) -> DataError:
        return DataError(f"sample key {key!r} is in shard {first} and in shard {second}: samples "
                         "need keys unique across shards (csclip shards makes them from the "
                         "sample ids); fix the shards and extract into a new output.uri")


def _stem_of(path: str) -> str:
    return path.rsplit("/", 1)[-1][: -len(".parquet")]


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
    listed, a sample key in two shards, or an output written from other input or backend.
    """
    output = checked_output(config)
    uris = shard_uris(config.input)  # a bad pattern fails before the lease
    with output_lease(output, "csclip extract", config.output.endpoint_url, config=config):
        return _extract_shards(config, uris, engine, on_shard_written)


def _extract_shards(config: ExtractConfig, uris: list[str], engine: Engine | None,
                    on_shard_written: ShardCallback | None) -> ExtractSummary:
    stems = [shard_stem(uri) for uri in uris]
    shuffles = shuffles_for(config)
    out = Output(config.output)
    check_manifest(out, config, {"num_shards": len(uris)})
    done = out.done_shards()
    pending = [k for k, stem in enumerate(stems) if stem not in done]
    parked = [k for k in pending if out.has("_stage1", f"{stems[k]}.parquet")]
    fresh = [k for k in pending if k not in parked]
    log.info("extract: %d shards; %d done, %d to run, %d parked for repair", len(uris),
             len(uris) - len(pending), len(fresh), len(parked))
    progress = Progress(len(uris), len(uris) - len(pending))

    def finished(shard: int, results: pa.Table) -> None:
        stem = stems[shard]
        counts = finish_shard(out, stem, results, results.num_rows,
                              config.output.format == "authors", partial(
                                  _tagged, stem=stem, shuffles=shuffles), {"uri": uris[shard]})
        progress.shard_written(stem, counts["read"])
        if on_shard_written is not None:
            on_shard_written(stem)

    if parked:  # a killed run's first pass, waiting for its repair
        repair_parked(out, parked, config, engine, finished, stems.__getitem__)
    keys = KeyIndex(out)
    keys.seed({stems[k] for k in range(len(stems)) if k not in fresh})
    windows = [fresh[i:i + config.output.shards_per_window]
               for i in range(0, len(fresh), config.output.shards_per_window)]
    with ThreadPoolExecutor(max_workers=1) as reader:
        # The next window is read while this one is in the backend.
        reads: Iterator[Future] = (reader.submit(read_window, window, uris, config.input)
                                   for window in windows)
        ahead = list(itertools.islice(reads, 1))
        for window in windows:
            ahead.extend(itertools.islice(reads, 1))
            samples = ahead.pop(0).result()
            keys.add(samples, stems)
            _run_window(out, window, samples, config, engine, finished, stems.__getitem__)
    summary = summarize(out, config, stems, progress.written, None)
    write_complete(out, summary)
    return summary


def _tagged(records: list[UnitsRecord], *, stem: str,
            shuffles: Callable[[list[UnitsRecord]], list[UnitsRecord]] | None
            ) -> list[UnitsRecord]:
    """The records with their shard in meta (and their caption shuffles, when on)."""
    records = [replace(r, meta={**r.meta, SHARD_META_KEY: stem}) for r in records]
    return shuffles(records) if shuffles is not None else records


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

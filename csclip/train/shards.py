"""Training from webdataset shards: one streaming data path, no all-to-all in any epoch.

The shards (`data.shards`, a brace pattern, local or s3://) hold the images and captions;
their units come from `csclip extract --format webdataset` (`data.units_uri`: its output,
one `units/{stem}.parquet` and `_done/{stem}.json` per shard). Planning reads only the
per-shard counts (`_done/{stem}.json`'s with_units): the driver's memory and the time
to the first batch grow with the number of shards, not of samples.

Each epoch's order is the large-scale one of open_clip_train's `--dataset-type
webdataset`, made a function of the config alone:
- the shards are permuted, seeded by (run.seed, epoch);
- consecutive shards of that order form groups of at least `data.shard_buffer` samples
  (the bounded sample buffer), and each group's samples are permuted, seeded by (run.seed,
  epoch, group): sample j of group g sits at position offset(g) + permutation(j), where the
  offsets are the groups' prefix sums of counts (known from planning);
- global batch t is positions [tB, (t+1)B), as csclip.train.global_batch defines it.

One Ray Data task reads one group (`read_group`): it joins each shard's units by key
inside the task (no global join), works out the positions from the units' keys, keeps
the positions this dataset serves (with batch_scope "global" one worker's share of every
global batch; with "worker" all, split over the workers by Ray Train) and only then
streams the tars, keeping the image bytes of those samples alone, decoding and
transforming them (or, for shards written with `csclip shards --encoding pixels`, reading
their uint8 pixels: decode-once as a shard encoding). Its rows leave in position order, as
uint8 PIXELS with the caption's tokens: the rows csclip.train.stream.sample_batch draws
each epoch's text slots for. With preserve_order the groups' blocks reach the worker in
group order, so a worker's rows come in position order without a sort.

The shards were written in a seeded order (`csclip shards` permutes the source once), so
COCO's five captions of an image are scattered over the shards, where a buffer shuffle of
the source order would put them into one batch as false negatives of each other.
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from csclip.config.train import DataConfig, SamplingConfig, worker_batch_size
from csclip.errors import ConfigError, DataError
from csclip.shards import PIXELS_SUFFIX, expand_shards, shard_stem
from csclip.shards.read import ShardSample, iter_shard
from csclip.shards.write import sample_key
from csclip.storage import exists, filesystem_for, read_bytes
from csclip.train.holdout import held_out_ids
from csclip.train.shard_members import FOIL_MEMBERS, foil_candidate_columns, pixel_rows
from csclip.train.stream import (
    CAPTION_TOKENS,
    LAYOUT_TARGET,
    PIXELS,
    decode_batch,
    deterministic,
    fixed_size_list,
    image_shape,
    preprocess_key,
    sample_batch,
    text_rows,
)
from csclip.units import EXTRACTION_COMPLETE, EXTRACTION_DONE_DIR, UNITS_SCHEMA

logger = logging.getLogger(__name__)

POSITION = "_position"

# The threads reading the per-shard counts at planning (S3 GETs of a few hundred bytes).
COUNT_READERS = 32
UNIT_COLUMNS = [f.name for f in UNITS_SCHEMA if f.name not in ("image_path", "image_bytes")]


@dataclass(frozen=True)
class TrainShard:
    """One shard of the training data: where it is, where its units are, how many of its
    samples have units (the rows it gives each epoch)."""

    uri: str
    units_uri: str
    rows: int  # with units and not held out
    held: tuple[str, ...] = ()  # its sample ids held out of training (data.val_ratio)


@dataclass(frozen=True)
class ShardGroup:
    """Consecutive shards of one epoch's order, whose samples are permuted together."""

    index: int
    shards: tuple[TrainShard, ...]
    offset: int  # the position of the group's first row in the epoch

    @property
    def rows(self) -> int:
        return sum(shard.rows for shard in self.shards)


def plan_shards(data: DataConfig, seed: int = 0) -> list[TrainShard]:
    """The shards of `data.shards` with their units (`data.units_uri`, an extraction
    output over the same shards) and row counts, in pattern order. With data.val_ratio,
    the held-out ids are drawn by the units table's rule (csclip.train.holdout.held_out_ids,
    seeded by `seed`) over every shard's sample ids, which the driver reads for that.

    Raises DataError for an unfinished extraction, a shard without units, or no rows."""
    if data.shards is None or data.units_uri is None:
        raise DataError("training from shards needs data.shards and data.units_uri")
    uris = expand_shards(data.shards)
    root = data.units_uri.rstrip("/")
    fs, path = filesystem_for(root)
    if not exists(fs, posixpath.join(path, EXTRACTION_COMPLETE)):
        raise DataError(f"data.units_uri: {root} is not a finished extraction (no "
                        f"{EXTRACTION_COMPLETE}); run `csclip extract --format webdataset "
                        f"--input '{data.shards}' --out {root}` to its end")

    def counted(uri: str) -> TrainShard:
        stem = shard_stem(uri)
        marker = posixpath.join(path, EXTRACTION_DONE_DIR, f"{stem}.json")
        try:
            counts = json.loads(read_bytes(fs, marker))
        except DataError as err:
            raise DataError(f"shard {uri} has no units in {root} (no "
                            f"{EXTRACTION_DONE_DIR}/{stem}.json): extract the same shards "
                            "that data.shards names") from err
        return TrainShard(uri, f"{root}/units/{stem}.parquet", int(counts["with_units"]))

    with ThreadPoolExecutor(COUNT_READERS) as pool:
        shards = list(pool.map(counted, uris))
        if data.val_ratio:
            shards = _held_out(shards, list(pool.map(_sample_ids, shards)), data.val_ratio, seed)
    if not sum(shard.rows for shard in shards):
        raise DataError(f"the {len(shards)} shards of {data.shards} hold no sample with units")
    return shards


def _sample_ids(shard: TrainShard) -> list[str]:
    fs, path = filesystem_for(shard.units_uri)
    return pq.read_table(io.BytesIO(read_bytes(fs, path)), columns=["sample_id"]
                         ).column("sample_id").to_pylist()


def _held_out(shards: list[TrainShard], ids: list[list[str]], ratio: float, seed: int
              ) -> list[TrainShard]:
    held = held_out_ids([i for shard_ids in ids for i in shard_ids], ratio, seed)
    if not held:
        raise ConfigError(f"data.val_ratio {ratio}: {sum(map(len, ids))} training rows hold "
                          "no held-out row; raise it or set it to 0")
    out = []
    for shard, shard_ids in zip(shards, ids, strict=True):
        mine = tuple(i for i in shard_ids if i in held)
        out.append(replace(shard, rows=shard.rows - len(mine), held=mine))
    logger.info("data.val_ratio %g: %d of %d training rows held out (seed %d), never trained on",
                ratio, len(held), sum(map(len, ids)), seed)
    return out


def held_out_rows(shards: Sequence[TrainShard], preprocess: tuple, model_name: str) -> list:
    """The held-out rows (units columns and the encoded image's bytes, or from shards of
    uint8 pixels those pixels and the caption's tokens: csclip.train.holdout.HeldOut reads
    either) as Arrow ObjectRefs for rank 0's evaluator (load_held_out): one Ray Data task
    per shard that holds some."""
    import ray.data  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    items = [{"uri": s.uri, "units_uri": s.units_uri, "rows": s.rows + len(s.held),
              "held": list(s.held), "preprocess": json.dumps(preprocess),
              "model_name": model_name} for s in shards if s.held]
    rows = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
        _read_held, batch_size=1, batch_format="pyarrow")
    return rows.materialize().to_arrow_refs()


def _read_held(batch: pa.Table) -> pa.Table:
    [shard] = batch.to_pylist()
    units = _units({**shard, "held": []})  # every row, the held-out ones among them
    held = set(shard["held"])
    table = units.filter(pa.array([i in held for i in units.column("sample_id").to_pylist()]))
    images = _images(shard, held)
    ids = table.column("sample_id").to_pylist()
    if all(images[i][0] == PIXELS_SUFFIX for i in ids):
        preprocess = tuple(tuple(tuple(v) if isinstance(v, list) else v for v in item)
                           for item in json.loads(shard["preprocess"]))
        return pixel_rows(table, [images[i][1] for i in ids], preprocess, shard["model_name"],
                           shard["uri"])
    return table.append_column("image_bytes", pa.array([images[i][1] for i in ids], pa.binary()))


def shard_order(num_shards: int, seed: int, epoch: int) -> np.ndarray:
    """The shards' order in `epoch`: a permutation seeded by (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0]).permutation(num_shards)


def epoch_groups(shards: Sequence[TrainShard], seed: int, epoch: int, buffer_rows: int
                 ) -> list[ShardGroup]:
    """`epoch`'s groups: the shards in shard_order, cut into runs of at least
    `buffer_rows` rows (the last may hold fewer), with their offsets."""
    groups: list[ShardGroup] = []
    current: list[TrainShard] = []
    offset = 0
    for index in shard_order(len(shards), seed, epoch):
        current.append(shards[index])
        if sum(shard.rows for shard in current) >= buffer_rows:
            groups.append(ShardGroup(len(groups), tuple(current), offset))
            offset += groups[-1].rows
            current = []
    if current:
        groups.append(ShardGroup(len(groups), tuple(current), offset))
    return groups


def group_positions(num_rows: int, offset: int, seed: int, epoch: int, group: int
                    ) -> np.ndarray:
    """The epoch position of each of a group's rows (in units order, shard after shard):
    the group's span permuted, seeded by (seed, epoch, group)."""
    return offset + np.random.default_rng([seed, epoch, 1, group]).permutation(num_rows)


def served(positions: np.ndarray, *, rank: int | None, worker_batch: int, num_workers: int,
           kept_rows: int) -> np.ndarray:
    """Which positions a dataset serves: those of the epoch's whole global batches, and
    with `rank` only worker `rank`'s share of each (csclip.train.global_batch's rule)."""
    mine = positions < kept_rows
    if rank is not None:
        mine &= (positions % (worker_batch * num_workers)) // worker_batch == rank
    return mine


def _units(shard: dict) -> pa.Table:
    """The shard's units rows (held-out ones included when the item has no `held`)."""
    fs, path = filesystem_for(shard["units_uri"])
    try:
        table = pq.read_table(io.BytesIO(read_bytes(fs, path)), columns=UNIT_COLUMNS)
    except DataError as err:
        raise DataError(f"shard {shard['uri']}: its units {shard['units_uri']} are missing") from err
    if shard.get("held"):  # data.val_ratio: those never reach training
        held = set(shard["held"])
        table = table.filter(pa.array([i not in held for i in
                                       table.column("sample_id").to_pylist()]))
    if table.num_rows != shard["rows"]:
        raise DataError(f"{shard['units_uri']} holds {table.num_rows} rows, its done marker "
                        f"{shard['rows']}: the extraction output changed since planning")
    return table


def _images(shard: dict, wanted: set[str], members: Sequence[str] = ()
            ) -> dict[str, tuple[str, bytes, dict[str, bytes]]]:
    """The image members (suffix, bytes) of the `wanted` sample ids of one shard, with
    the bytes of the further `members` each has. A sample's key is its id (an extraction
    over shards) or, in shards `csclip shards` wrote, the id made key-safe
    (csclip.shards.write.sample_key). A small shard is read whole and kept by the
    process (_cached_shard), a large one streamed for the wanted samples alone."""
    id_of = {sample_key(i): i for i in wanted}
    id_of.update((i, i) for i in wanted)
    kept = _cached_shard(shard["uri"], tuple(members))
    samples = (iter_shard(shard["uri"], keys=set(id_of), members=members) if kept is None
               else (kept[key] for key in id_of if key in kept))
    found: dict[str, tuple[str, bytes, dict[str, bytes]]] = {}
    for sample in samples:
        if sample.reject is not None:
            raise DataError(f"shard {shard['uri']}: sample {sample.key!r} has units but "
                            f"{sample.reject} ({sample.detail}); the shard changed after "
                            "its extraction")
        found[id_of[sample.key]] = (sample.image_suffix, sample.image, sample.members)
    missing = wanted - found.keys()
    if missing:
        raise DataError(f"shard {shard['uri']} lacks {len(missing)} samples its units name, "
                        f"e.g. {sorted(missing)[0]!r}; the shard changed after its extraction")
    return found


# Each process's layout targets of the last shards' units, by (units uri, question): the
# scenes' answers do not change between epochs (a third of a world epoch's read otherwise).
_LAYOUT_TARGETS: OrderedDict[tuple, dict[str, np.ndarray]] = OrderedDict()
LAYOUT_TARGETS_KEPT = 64


def _layout_targets(units_uri: str, units: pa.Table, layout) -> dict[str, np.ndarray]:
    """The layout warm start's targets of a shard's units rows (by sample_id), computed
    once per process (csclip.train.warm_start.layout_targets, from the scenes)."""
    key = (units_uri, layout)
    known = _LAYOUT_TARGETS.setdefault(key, {})
    _LAYOUT_TARGETS.move_to_end(key)
    ids = units.column("sample_id").to_pylist()
    new = [index for index, sample_id in enumerate(ids) if sample_id not in known]
    if new:
        from csclip.train.warm_start import layout_targets  # noqa: PLC0415  imports torch, which Ray Data's tasks never need otherwise

        rows = units.take(pa.array(new, pa.int64())).to_pylist()
        known.update(zip((ids[i] for i in new), layout_targets(rows, layout), strict=True))
    while len(_LAYOUT_TARGETS) > LAYOUT_TARGETS_KEPT:
        _LAYOUT_TARGETS.popitem(last=False)
    return known


# The shards this process read whole lately, by (uri, size, members): every epoch reads the
# same shards, and a task process (which Ray reuses) of a small dataset (the world's 4
# shards of 1,000, a COCO-sized table's first ones) then parses each tar once rather than
# every epoch (~75 us of tarfile a member: 1.5 s an epoch of the demo's world). A shard
# over a quarter of the budget (LAION's 10,000 images) is streamed every time.
SHARD_CACHE_MB = 512
_SHARD_CACHE: OrderedDict[tuple, dict[str, ShardSample]] = OrderedDict()


def _cached_shard(uri: str, members: tuple[str, ...]) -> dict[str, ShardSample] | None:
    """Every sample of the shard at `uri` by key, read whole once per process and kept
    while the process's shards fit SHARD_CACHE_MB; None for a shard too large to keep."""
    fs, path = filesystem_for(uri)
    size = fs.get_file_info(path).size or 0
    budget = SHARD_CACHE_MB << 20
    if size > budget // 4:
        return None
    key = (uri, size, members)
    if key in _SHARD_CACHE:
        _SHARD_CACHE.move_to_end(key)
        return _SHARD_CACHE[key]
    samples = {sample.key: sample for sample in iter_shard(uri, members=members)}
    _SHARD_CACHE[key] = samples
    while sum(k[1] for k in _SHARD_CACHE) > budget:
        _SHARD_CACHE.popitem(last=False)
    return samples


def read_group(group: dict, *, seed: int, epoch: int, rank: int | None, worker_batch: int,
               num_workers: int, kept_rows: int, preprocess: tuple, model_name: str,
               augment: bool = False, image_foils: bool = False, layout=None) -> pa.Table:
    """One ShardGroup (an item of group_items) read: the rows this dataset serves, in
    position order, as TEXT_COLUMNS (+ meta), PIXELS, CAPTION_TOKENS and POSITION (and the image-foil candidates / layout targets when the
    objective needs them: csclip.train.stream.decode_batch)."""
    units = [_units(shard) for shard in group["shards"]]
    table = pa.concat_tables(units) if len(units) > 1 else units[0]
    positions = group_positions(table.num_rows, group["offset"], seed, epoch, group["index"])
    mine = served(positions, rank=rank, worker_batch=worker_batch, num_workers=num_workers,
                  kept_rows=kept_rows)
    shard_of = np.repeat(np.arange(len(units)), [u.num_rows for u in units])
    ids = table.column("sample_id").to_pylist()
    images: dict[str, tuple[str, bytes, dict[str, bytes]]] = {}
    for index, shard in enumerate(group["shards"]):
        wanted = {ids[i] for i in np.flatnonzero(mine & (shard_of == index))}
        if wanted:
            images.update(_images(shard, wanted, FOIL_MEMBERS if image_foils else ()))
    order = np.flatnonzero(mine)[np.argsort(positions[mine], kind="stable")]
    rows = table.take(pa.array(order, pa.int64()))
    kept_ids = rows.column("sample_id").to_pylist()
    if not kept_ids:
        return _empty(rows, preprocess)
    if all(images[key][0] == PIXELS_SUFFIX for key in kept_ids):
        uri = group["shards"][0]["uri"]
        if augment:
            raise DataError(f"shard {uri} holds uint8 pixels, the eval transform's image "
                            "only; data.augment draws a new crop from the encoded image "
                            "(csclip shards --encoding original)")
        out = pixel_rows(rows, [images[key][1] for key in kept_ids], preprocess, model_name,
                         uri)
        if image_foils:
            for name, column in foil_candidate_columns(
                    [images[key][2] for key in kept_ids], image_shape(dict(preprocess)),
                    uri).items():
                out = out.append_column(name, column)
        if layout is not None:
            targets: dict[str, np.ndarray] = {}
            for shard, shard_units in zip(group["shards"], units, strict=True):
                targets.update(_layout_targets(shard["units_uri"], shard_units, layout))
            out = out.append_column(LAYOUT_TARGET, fixed_size_list(
                np.stack([targets[key] for key in kept_ids])))
    else:
        rows = rows.append_column("image_bytes", pa.array([images[key][1] for key in kept_ids],
                                                          pa.binary()))
        out = decode_batch(rows, preprocess=preprocess, model_name=model_name, augment=augment,
                           seed=seed, epoch=epoch, layout=layout, pixels=True,
                           image_foils=image_foils)
        if out.num_rows != len(kept_ids):
            failed = sorted(set(kept_ids) - set(out.column("sample_id").to_pylist()))
            raise DataError(f"{len(failed)} images of {[s['uri'] for s in group['shards']]} "
                            f"do not decode, e.g. {failed[0]!r}: write the shards with "
                            "`csclip shards`, which checks every image and rejects those")
    return out.append_column(POSITION, pa.array(np.sort(positions[mine]), pa.int64()))


def _empty(rows: pa.Table, preprocess: tuple) -> pa.Table:
    size = int(np.prod(image_shape(dict(preprocess))))
    return (text_rows(rows).append_column(PIXELS, pa.array([], pa.binary(size)))
            .append_column(CAPTION_TOKENS, pa.array([], pa.list_(pa.int64(), 1)))
            .append_column(POSITION, pa.array([], pa.int64())))


def group_items(groups: Sequence[ShardGroup]) -> list[dict]:
    """The groups as Ray Data items (one per block: one read task each)."""
    return [{"index": g.index, "offset": g.offset,
             "shards": [{"uri": s.uri, "units_uri": s.units_uri, "rows": s.rows,
                         "held": list(s.held)} for s in g.shards]} for g in groups]


# Each process's last epoch orders (group_task): a task recomputes its epoch's groups from
# the shard list rather than the driver holding every epoch's groups.
_GROUPS: dict[tuple, tuple[list[ShardGroup], list[tuple[int, int]]]] = {}
# A task reads consecutive groups until it holds this many rows: a task costs Ray Data a few
# ms, which small shards would pay per sample (a LAION shard of 10k is one task alone).
MIN_ROWS_PER_TASK = 1024
# Rows a task samples and yields at a time (what a row gets does not depend on its block).
SAMPLED_ROWS = 256


def task_spans(groups: Sequence[ShardGroup], min_rows: int = MIN_ROWS_PER_TASK
               ) -> list[tuple[int, int]]:
    """[start, end) of the groups each task reads: consecutive groups, at least
    `min_rows` rows a task (the last may hold fewer)."""
    spans, start, rows = [], 0, 0
    for index, group in enumerate(groups):
        rows += group.rows
        if rows >= min_rows:
            spans.append((start, index + 1))
            start, rows = index + 1, 0
    if start < len(groups):
        spans.append((start, len(groups)))
    return spans


def _epoch_plan(shards: list, seed: int, epoch: int, buffer_rows: int
                ) -> tuple[list[ShardGroup], list[tuple[int, int]]]:
    ref = shards[0]
    key = (ref.hex() if hasattr(ref, "hex") else id(ref), seed, epoch, buffer_rows)
    if key not in _GROUPS:
        import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

        while _GROUPS:
            _GROUPS.pop(next(iter(_GROUPS)))
        groups = epoch_groups(ray.get(ref) if hasattr(ref, "hex") else ref, seed, epoch,
                              buffer_rows)
        _GROUPS[key] = groups, task_spans(groups)
    return _GROUPS[key]


def group_task(batch: pa.Table, *, shards: list, seed: int, epoch: int, buffer_rows: int,
               read_kwargs: dict, sample_kwargs: dict) -> Iterator[dict[str, np.ndarray]]:
    """Map function over one task index of `epoch` (a one-row batch of ray.data.range):
    the rows of its span of groups read (read_group, group after group: position order)
    and their text slots drawn for the epoch (csclip.train.stream.sample_batch), in one
    task, yielded SAMPLED_ROWS at a time in position order (a block reaches the worker
    while the task samples the next: its first batch does not wait for the whole span).
    shards: a one-element list holding the ObjectRef of the run's TrainShard list (put
    once, shared by every epoch)."""
    [index] = batch.column("id").to_pylist()
    groups, spans = _epoch_plan(shards, seed, epoch, buffer_rows)
    start, end = spans[index]
    tables = [read_group(item, seed=seed, epoch=epoch, **read_kwargs)
              for item in group_items(groups[start:end])]
    rows = tables[0] if len(tables) == 1 else pa.concat_tables(
        [t for t in tables if t.num_rows] or tables[:1])
    for start in range(0, rows.num_rows, SAMPLED_ROWS):
        out = sample_batch(rows.slice(start, SAMPLED_ROWS), seed=seed, epoch=epoch,
                           **sample_kwargs)
        if out:
            yield out


def shard_datasets(shards: Sequence[TrainShard], *, data: DataConfig, sampling: SamplingConfig,
                   preprocess_cfg: dict, model_name: str, seed: int, num_epochs: int,
                   steps_per_epoch: int, num_workers: int, objective, dataset_name) -> dict:
    """Ray Train's datasets of a run on shards, by name: one per epoch (batch_scope
    "worker", split over the workers) or one per epoch and worker ("global"). Lazy: an
    epoch no worker asks for never reads a shard. dataset_name(epoch, rank).

    One task reads and samples a span of groups of at least MIN_ROWS_PER_TASK rows
    (group_task): as two map_batches, Ray Data fused them into tasks of 128 groups (the
    larger batch size of the two), which made the first batch wait for 128 groups. The
    driver holds the shard list once (an ObjectRef) and, per epoch, a ray.data.range over
    the task indices: no per-group item."""
    import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    worker_batch = worker_batch_size(data.batch_size, data.batch_scope, num_workers)
    kept_rows = steps_per_epoch * worker_batch * num_workers
    ranks: list[int | None] = (list(range(num_workers)) if data.batch_scope == "global"
                               else [None])
    preprocess = preprocess_key(preprocess_cfg)
    sample_kwargs = {"sampling": sampling.model_dump(mode="json"), "model_name": model_name,
                     "columns": list(objective.columns),
                     "image_shape": image_shape(preprocess_cfg), "preprocess": preprocess,
                     "normalize": False}
    shards_ref = [ray.put(list(shards))]
    datasets = {}
    for epoch in range(num_epochs):
        num_tasks = len(task_spans(epoch_groups(shards, seed, epoch, data.shard_buffer)))
        for rank in ranks:
            read_kwargs = {"rank": rank, "worker_batch": worker_batch, "num_workers": num_workers,
                           "kept_rows": kept_rows, "preprocess": preprocess,
                           "model_name": model_name, "augment": data.augment,
                           "image_foils": "image_foil" in objective.image_columns,
                           "layout": objective.layout}
            groups = deterministic(ray.data.range(num_tasks, override_num_blocks=num_tasks))
            datasets[dataset_name(epoch, rank or 0)] = groups.map_batches(
                group_task, batch_size=1, batch_format="pyarrow", fn_kwargs={
                    "shards": shards_ref, "seed": seed, "epoch": epoch,
                    "buffer_rows": data.shard_buffer, "read_kwargs": read_kwargs,
                    "sample_kwargs": sample_kwargs})
    return datasets

"""Training from webdataset shards (csclip.train.shards): the epoch's order is the shards
permuted plus a bounded buffer, a function of the config alone; no epoch moves the data
all-to-all; every global batch holds the same rows on 1, 2 or 4 workers; a run on 1 and
on 2 gloo workers trains the same losses, and a killed run resumes mid-epoch with the
losses of an uninterrupted one."""

from __future__ import annotations

import collections
import contextlib
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image
from shard_helpers import write_world_shards
from train_helpers import read_loss_log

from csclip.config import load_config
from csclip.config.shards import ShardsOutputConfig
from csclip.config.train import DataConfig, TrainConfig
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.model import spec_from_config
from csclip.shards.read import iter_shard
from csclip.train import finished_result, run
from csclip.train.loop import WorkerHooks
from csclip.train.shards import (
    POSITION,
    epoch_groups,
    group_items,
    plan_shards,
    read_group,
    shard_order,
)
from csclip.train.stream import preprocess_key
from csclip.units import EXTRACTION_COMPLETE, EXTRACTION_DONE_DIR, records_to_table

WORLD = WorldConfig(num_train=30, image_size=32)


@pytest.fixture(scope="module")
def world_shards(tmp_path_factory):
    return write_world_shards(tmp_path_factory.mktemp("shards"), WORLD, 4)


def test_each_epoch_permutes_the_shards_and_groups_them_into_buffers(world_shards):
    pattern, units = world_shards
    shards = plan_shards(DataConfig(shards=pattern, units_uri=units, shard_buffer=10))
    assert [s.rows for s in shards] == [8, 8, 8, 6]
    orders = {tuple(shard_order(4, 0, epoch)) for epoch in range(6)}
    assert len(orders) > 1  # a new order each epoch
    assert tuple(shard_order(4, 0, 3)) == tuple(shard_order(4, 0, 3))  # the same on a rerun
    groups = epoch_groups(shards, 0, 0, 10)
    assert [g.rows for g in groups] in ([16, 14], [14, 16])  # two shards reach 10 rows
    assert [g.offset for g in groups] == [0, groups[0].rows]
    assert sum((list(g.shards) for g in groups), []) == [shards[i] for i in shard_order(4, 0, 0)]


def _read(items, *, rank, workers, worker_batch, kept_rows, epoch=0, seed=0) -> pa.Table:
    cfg = spec_from_config(load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32"]).model).preprocess_cfg
    tables = [read_group(item, seed=seed, epoch=epoch, rank=rank,
                         worker_batch=worker_batch, num_workers=workers, kept_rows=kept_rows,
                         preprocess=preprocess_key(cfg), model_name="csclip-tiny")
              for item in items]
    return pa.concat_tables(tables)


def test_every_global_batch_holds_the_same_rows_on_any_worker_count(world_shards):
    pattern, units = world_shards
    shards = plan_shards(DataConfig(shards=pattern, units_uri=units))
    items = group_items(epoch_groups(shards, 0, 0, 10))
    batch, steps = 8, 3  # 30 rows: 3 global batches of 8, 6 rows left out
    [one] = [_read(items, rank=0, workers=1, worker_batch=batch, kept_rows=steps * batch)]
    # One worker reads the epoch's positions in order: a permutation of the 24 kept rows.
    assert one.column(POSITION).to_pylist() == list(range(24))
    ids = one.column("sample_id").to_pylist()
    assert len(set(ids)) == 24
    for workers in (2, 4):
        share = batch // workers
        ranks = [_read(items, rank=r, workers=workers, worker_batch=share,
                       kept_rows=steps * batch) for r in range(workers)]
        for step in range(steps):  # global batch t: every worker's t-th share, in rank order
            rows = [i for r in ranks
                    for i in r.column("sample_id").to_pylist()[step * share:(step + 1) * share]]
            assert rows == ids[step * batch:(step + 1) * batch]
    # The images are the world's, transformed: the same bytes on every worker count.
    assert one.column("pixels").type.byte_width == 3 * 32 * 32


def test_samples_are_mixed_across_the_shards_of_a_buffer(world_shards):
    pattern, units = world_shards
    shards = plan_shards(DataConfig(shards=pattern, units_uri=units))
    groups = epoch_groups(shards, 0, 0, 10)
    rows = _read(group_items(groups), rank=0, workers=1, worker_batch=30, kept_rows=30)
    first = rows.column("sample_id").to_pylist()[:groups[0].rows]
    stems = {s.uri: s for s in groups[0].shards}
    from_shard = {s.uri: set(pa.parquet.read_table(s.units_uri).column("sample_id").to_pylist())
                  for s in stems.values()}
    # The first group's rows interleave its two shards, not one shard after the other.
    runs = sum(1 for a, b in zip(first, first[1:], strict=False)
               if any(a in ids and b not in ids for ids in from_shard.values()))
    assert runs >= 3
    another = _read(group_items(epoch_groups(shards, 0, 1, 10)), rank=0, workers=1,
                    worker_batch=30, kept_rows=30)
    assert another.column("sample_id").to_pylist() != rows.column("sample_id").to_pylist()


def test_a_shard_that_lost_samples_since_its_extraction_is_a_data_error(tmp_path):
    pattern, units = write_world_shards(tmp_path, WorldConfig(num_train=8, image_size=32), 1)
    shard = tmp_path / "shards" / "00000.tar"
    shard.write_bytes(shard.read_bytes()[:4096])  # cut after the first sample or two
    items = group_items(epoch_groups(plan_shards(DataConfig(shards=pattern, units_uri=units)),
                                     0, 0, 10))
    with pytest.raises(DataError, match="changed after its extraction"):
        _read(items, rank=0, workers=1, worker_batch=8, kept_rows=8)


def test_held_out_rows_are_the_units_tables_draw_and_never_trained_on(world_shards):
    from csclip.train.holdout import held_out_ids

    pattern, units = world_shards
    shards = plan_shards(DataConfig(shards=pattern, units_uri=units, val_ratio=0.2), seed=7)
    ids = [i for s in plan_shards(DataConfig(shards=pattern, units_uri=units))
           for i in pa.parquet.read_table(s.units_uri).column("sample_id").to_pylist()]
    held = {i for s in shards for i in s.held}
    assert held == held_out_ids(ids, 0.2, 7) and len(held) == 6
    assert sum(s.rows for s in shards) == 24
    rows = _read(group_items(epoch_groups(shards, 0, 0, 10)), rank=0, workers=1,
                 worker_batch=8, kept_rows=24)
    assert not held & set(rows.column("sample_id").to_pylist())
    assert rows.column(POSITION).to_pylist() == list(range(24))


def test_shards_need_a_finished_extraction_and_refuse_what_they_cannot_do(tmp_path, world_shards):
    pattern, units = world_shards
    with pytest.raises(DataError, match="not a finished extraction"):
        plan_shards(DataConfig(shards=pattern, units_uri=str(tmp_path)))
    for overrides, message in [([f"data.shards={pattern}"], "needs data.units_uri"),
                               ([f"data.shards={pattern}", f"data.units_uri={units}",
                                 "data.prepare_images=true"], "written once as shards")]:
        with pytest.raises(ConfigError, match=message):
            load_config(TrainConfig, None, overrides)


def _config(tmp_path, mlflow_uri, world_shards, *overrides: str) -> TrainConfig:
    pattern, units = world_shards
    return load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", f"data.shards={pattern}",
        f"data.units_uri={units}", "data.shard_buffer=10", "data.batch_size=8",
        "data.batch_scope=global", "data.shuffle_buffer=0", "optim.max_steps=5",
        "optim.warmup_steps=0", "optim.lr=1e-3", "run.checkpoint_every=2", "run.log_every=1",
        f"run.storage_path={tmp_path / 'runs'}", f"tracking.uri={mlflow_uri}", *overrides])


def test_no_epoch_of_a_run_on_shards_shuffles_or_sorts(world_shards, tmp_path, ray_session,
                                                       mlflow_uri):
    from csclip.model import spec_from_config
    from csclip.train.loop import _shard_training, step_options

    for scope in ("global", "worker"):
        config = _config(tmp_path, mlflow_uri, world_shards, f"data.batch_scope={scope}",
                         "run.num_workers=2", "data.batch_size=4")
        plan, datasets, _, _ = _shard_training(config, config.data,
                                               spec_from_config(config.model),
                                               step_options(config).objective)
        assert len(datasets) == plan.num_epochs * (2 if scope == "global" else 1)
        for dataset in datasets.values():
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                dataset.explain()  # Ray Data's logical and physical plans
            operators = printed.getvalue()
            assert "MapBatches(group_task)" in operators, operators
            for all_to_all in ("Shuffle", "Sort", "Repartition", "Aggregate", "Join", "Zip"):
                assert all_to_all not in operators, operators


@pytest.mark.slow
def test_one_and_two_workers_train_the_same_steps_on_shards_and_a_kill_resumes_mid_epoch(
        world_shards, ray_session, tmp_path, mlflow_uri):
    def trained(workers: int, *overrides: str, hooks=None) -> dict:
        losses = tmp_path / f"losses-{workers}-{len(overrides)}"
        run(_config(tmp_path, mlflow_uri, world_shards, f"run.num_workers={workers}",
                    *overrides), hooks=hooks or WorkerHooks(loss_log=str(losses)))
        return read_loss_log(losses)

    # 30 rows, 8 per step: 3 steps an epoch (6 rows left out), steps 4-5 in epoch 2.
    [[one]] = trained(1).values()
    assert [step for step, _ in one] == [1, 2, 3, 4, 5]
    expected = [loss for _, loss in one]
    assert len(set(expected)) == 5  # the model learns: the steps are not one number
    two = trained(2)
    for rank in (0, 1):  # each worker computes the loss of the whole global batch
        [attempt] = two[rank]
        assert [step for step, _ in attempt] == [1, 2, 3, 4, 5]
        assert [loss for _, loss in attempt] == pytest.approx(expected, rel=1e-4, abs=1e-6)
    # Killed after step 4, one step into the second epoch; the rerun resumes from the
    # checkpoint of step 4 (or 2) and trains what the uninterrupted run trained.
    killed = _config(tmp_path, mlflow_uri, world_shards, "run.num_workers=1", "run.name=killed")
    losses = tmp_path / "losses-killed"
    with pytest.raises(Exception, match="health check failed"):
        run(killed, hooks=WorkerHooks(fail_after_step=4, fail_by="sigkill", loss_log=str(losses)))
    assert finished_result(killed) is None
    result = run(killed, hooks=WorkerHooks(loss_log=str(losses)))
    resumed = result.metrics["resumed_from"]
    assert resumed in (2, 4)
    [before, after] = read_loss_log(losses)[0]
    assert before == one[:4]
    assert after == one[resumed:]  # to the last bit


def test_a_task_reads_consecutive_groups_until_it_holds_enough_rows(world_shards):
    from csclip.train.shards import task_spans

    pattern, units = world_shards
    shards = plan_shards(DataConfig(shards=pattern, units_uri=units))
    groups = epoch_groups(shards, 0, 0, 1)  # a group per shard: 8, 8, 8, 6 rows in some order
    assert task_spans(groups, 1) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    spans = task_spans(groups, 16)
    assert spans[0] == (0, 2) and spans[-1][1] == 4  # every group once, in order
    assert [g for a, b in spans for g in range(a, b)] == [0, 1, 2, 3]
    assert task_spans(groups, 1000) == [(0, 4)]


def _same_image_pairs(image_ids: list[str], batch: int) -> int:
    """Pairs of rows of one image inside a global batch, over every whole batch."""
    pairs = 0
    for start in range(0, len(image_ids) - batch + 1, batch):
        counts = collections.Counter(image_ids[start:start + batch])
        pairs += sum(n * (n - 1) // 2 for n in counts.values())
    return pairs


def test_an_epoch_holds_no_more_same_image_pairs_than_a_global_shuffle(tmp_path):
    # COCO's layout: five captions an image, side by side in the source (sorted by id).
    # `csclip shards` permutes them once when it writes; an epoch then permutes shards and
    # groups of them only, and its batches hold about the pairs of a global shuffle, which
    # is what today's per-epoch global shuffle exists for (false negatives of each other).
    from csclip.shards.write import write_shards
    from csclip.units import UnitsRecord

    png = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(png, format="PNG")
    rows = [{"sample_id": f"coco_{image:03d}_{k}", "image_id": str(image), "image_path": None,
             "caption": f"photo {image} caption {k}", "split": "train",
             "image_bytes": png.getvalue(), "gold_json": None}
            for image in range(40) for k in range(5)]
    out = tmp_path / "shards"
    write_shards(rows, ShardsOutputConfig(uri=str(out), samples_per_shard=25, seed=3,
                                          encoding="original"))
    units = tmp_path / "units"
    (units / "units").mkdir(parents=True)
    (units / EXTRACTION_DONE_DIR).mkdir()
    for tar in sorted(out.glob("*.tar")):
        ids = [sample.key for sample in iter_shard(str(tar), images=False)]
        records = [UnitsRecord(i, i.split("_")[1].lstrip("0") or "0", f"caption of {i}", "train")
                   for i in ids]
        pq.write_table(records_to_table(records), units / "units" / f"{tar.stem}.parquet")
        (units / EXTRACTION_DONE_DIR / f"{tar.stem}.json").write_text(
            json.dumps({"with_units": len(ids)}))
    (units / EXTRACTION_COMPLETE).write_text("{}")
    shards = plan_shards(DataConfig(shards=f"{out}/{{00000..00007}}.tar", units_uri=str(units)))
    batch = 20
    ours = []
    for epoch in range(3):
        read = _read(group_items(epoch_groups(shards, 0, epoch, 50)), rank=0, workers=1,
                     worker_batch=batch, kept_rows=200, epoch=epoch)
        assert read.num_rows == 200
        ours.append(_same_image_pairs(read.column("image_id").to_pylist(), batch))
    image_ids = [row["image_id"] for row in rows]
    shuffled = [_same_image_pairs([image_ids[i] for i in np.random.default_rng(s).permutation(200)],
                                  batch) for s in range(50)]
    # A global shuffle: 10 batches x 190 pairs x 4/199 ~ 38 pairs; the source order: 400.
    assert _same_image_pairs(image_ids, batch) == 400
    assert np.mean(ours) <= 1.5 * np.mean(shuffled), (ours, np.mean(shuffled))


def test_a_small_shard_is_parsed_once_per_process_and_a_large_one_streamed(world_shards,
                                                                           monkeypatch):
    """Every epoch reads the same shards: a task process keeps the small ones it read
    whole (the world's, a COCO-sized table's) and reads the same rows from them; a shard
    over the budget is streamed each time."""
    from csclip.train import shards as module

    pattern, units = world_shards
    items = group_items(epoch_groups(plan_shards(DataConfig(shards=pattern, units_uri=units)),
                                     0, 0, 10))
    opened: list[str] = []
    real = module.iter_shard
    monkeypatch.setattr(module, "iter_shard", lambda uri, **kw: opened.append(uri) or real(
        uri, **kw))
    module._SHARD_CACHE.clear()
    kwargs = {"rank": 0, "workers": 1, "worker_batch": 8, "kept_rows": 24}
    first = _read(items, **kwargs)
    assert len(opened) == 4 and first.num_rows == 24  # each shard parsed once, whole
    assert _read(items, **kwargs).equals(first) and len(opened) == 4  # then kept
    assert _read(items, epoch=1, **kwargs).column("sample_id").to_pylist() != \
        first.column("sample_id").to_pylist() and len(opened) == 4
    monkeypatch.setattr(module, "SHARD_CACHE_MB", 0)  # every shard over the budget
    module._SHARD_CACHE.clear()
    assert _read(items, **kwargs).equals(first) and len(opened) == 8
    assert _read(items, **kwargs).equals(first) and len(opened) == 12 and not module._SHARD_CACHE

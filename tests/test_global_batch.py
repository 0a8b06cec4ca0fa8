"""data.batch_scope global: the same optimisation on any number of workers
(csclip.train.global_batch). The pure pieces without Ray (which positions of an epoch of
shards each worker serves), then the same config trained on 1 and 2 gloo workers: every
step's loss the same."""

from __future__ import annotations

import pytest
from train_helpers import read_loss_log

from csclip.config import load_config
from csclip.config.train import DataConfig, TrainConfig
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.train import run, run_name
from csclip.train.loop import WorkerHooks
from csclip.train.shards import TrainShard, epoch_groups, group_positions, served
from csclip.train.source_shards import source_shards
from csclip.units import write_units
from csclip.world import world_record


def _shards(ids: list[str], per_shard: int) -> tuple[list[TrainShard], dict[str, list[str]]]:
    """`ids` cut into shards of `per_shard` rows (the last may hold fewer), and each
    shard's ids in units order. No files: the positions need only the counts."""
    chunks = [ids[i:i + per_shard] for i in range(0, len(ids), per_shard)]
    shards = [TrainShard(f"shard-{n}", f"units-{n}", len(chunk)) for n, chunk in enumerate(chunks)]
    return shards, {shard.uri: chunk for shard, chunk in zip(shards, chunks, strict=True)}


def _ranks(shards: list[TrainShard], ids_of: dict[str, list[str]], *, epoch: int,
           num_workers: int, worker_batch: int, kept_rows: int) -> list[list[tuple[int, str]]]:
    """Each rank's (position, sample id) in the order it reads them: every group's rows
    at their positions (csclip.train.shards.group_positions), the ones served() gives the
    rank, by position (as read_group gives them)."""
    ranks: list[list[tuple[int, str]]] = [[] for _ in range(num_workers)]
    for group in epoch_groups(shards, 3, epoch, buffer_rows=25):
        ids = [i for shard in group.shards for i in ids_of[shard.uri]]
        positions = group_positions(len(ids), group.offset, 3, epoch, group.index)
        for rank in range(num_workers):
            mine = served(positions, rank=rank, worker_batch=worker_batch,
                          num_workers=num_workers, kept_rows=kept_rows)
            ranks[rank].extend((int(p), i) for p, i, m in zip(positions, ids, mine, strict=True)
                               if m)
    return [sorted(rows) for rows in ranks]


def test_every_global_batch_holds_the_same_rows_on_any_worker_count():
    ids = [f"img{i // 5}_cap{i % 5}" for i in range(103)]  # COCO's five captions an image
    shards, ids_of = _shards(ids, 10)  # 10 shards of 10 rows and one of 3
    global_batch, steps = 16, 103 // 16
    kept = steps * global_batch  # 96: the last partial global batch is read by no one
    [one] = _ranks(shards, ids_of, epoch=1, num_workers=1, worker_batch=16, kept_rows=kept)
    assert [p for p, _ in one] == list(range(kept))  # every kept position once, in order
    order = [i for _, i in one]
    assert len(set(order)) == kept and set(order) < set(ids)
    assert order != ids[:kept]  # a shuffled order, not the units'
    for workers in (2, 4, 8):
        share = global_batch // workers
        ranks = _ranks(shards, ids_of, epoch=1, num_workers=workers, worker_batch=share,
                       kept_rows=kept)
        assert all(len(rows) == steps * share for rows in ranks)
        for t in range(steps):  # global batch t: every rank's t-th share, in rank order
            rows = [i for mine in ranks for _, i in mine[t * share:(t + 1) * share]]
            assert rows == order[t * global_batch:(t + 1) * global_batch]
    # Another epoch, another order (the shards permuted again, then each group's rows).
    [other] = _ranks(shards, ids_of, epoch=2, num_workers=1, worker_batch=16, kept_rows=kept)
    assert [i for _, i in other] != order


def test_repeated_sample_ids_are_refused_before_any_shard_is_written(tmp_path):
    # A sample is found in its shard by its id (its key there), so two rows of one id
    # would be ambiguous: the units table is refused before anything is written.
    world = WorldConfig(image_size=32)
    records = [world_record(world, "train", i) for i in range(3)]
    units = tmp_path / "out" / "units.parquet"
    units.parent.mkdir()
    write_units([*records, records[0]], str(units))
    with pytest.raises(DataError, match="1 sample_ids occur more than once"):
        source_shards(DataConfig(units_uri=str(units)), seed=0, preprocess_cfg={"size": 32},
                      model_name="csclip-tiny")
    assert not (tmp_path / "out" / "train_shards").exists()


@pytest.mark.parametrize(("overrides", "message"), [
    (["data.batch_size=9", "run.num_workers=2"], "use a multiple of 2"),
    (["loss.gather=false"], "needs loss.gather true"),
    (["data.shuffle_buffer=16"], "set data.shuffle_buffer=0"),
    (["data.batch_size=8", "run.num_workers=2", "optim.accum_freq=8"],
     "a worker's batch of 4 rows is not a multiple of optim.accum_freq 8"),
])
def test_configs_that_cannot_be_one_optimisation_are_refused(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, None, ["data.batch_scope=global", "data.shuffle_buffer=0",
                                        *overrides])


def test_batch_scope_names_a_run_only_when_global(tmp_path):
    base = ["data.shuffle_buffer=0"]
    worker = load_config(TrainConfig, None, base)
    assert run_name(worker) == run_name(load_config(TrainConfig, None,
                                                    [*base, "data.batch_scope=worker"]))
    assert run_name(worker) != run_name(load_config(TrainConfig, None,
                                                    [*base, "data.batch_scope=global"]))


@pytest.mark.slow
def test_one_and_two_workers_train_the_same_steps(ray_session, tmp_path, mlflow_uri):
    def trained(workers: int) -> dict:
        config = load_config(TrainConfig, None, [
            "model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
            "data.world.num_train=28", "data.batch_size=8", "data.batch_scope=global",
            "data.shuffle_buffer=0", "optim.max_steps=4", "optim.warmup_steps=0",
            "optim.lr=1e-3", "run.checkpoint_every=4", "run.log_every=1",
            f"run.num_workers={workers}", f"run.storage_path={tmp_path / 'runs'}",
            f"tracking.uri={mlflow_uri}"])
        losses = tmp_path / f"losses-{workers}"
        run(config, hooks=WorkerHooks(loss_log=str(losses)))
        return {rank: attempt for rank, [attempt] in read_loss_log(losses).items()}

    one, two = trained(1), trained(2)
    # 28 rows, 8 per step: 3 steps an epoch (4 rows left out), the 4th step in epoch 2.
    assert [step for step, _ in one[0]] == [1, 2, 3, 4]
    expected = [loss for _, loss in one[0]]
    assert len(set(expected)) == 4  # the model learns: the steps are not one number
    for rank in (0, 1):  # each worker computes the loss of the whole global batch
        assert [step for step, _ in two[rank]] == [1, 2, 3, 4]
        assert [loss for _, loss in two[rank]] == pytest.approx(expected, rel=1e-4, abs=1e-6)

"""data.batch_scope global: the same optimisation on any number of workers
(csclip.train.global_batch). The pure pieces without Ray, then the same config trained on
1 and 2 gloo workers: every step's loss the same."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from train_helpers import read_loss_log

from csclip.config import load_config
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError
from csclip.train import run, run_name
from csclip.train.global_batch import epoch_keys, rank_rows
from csclip.train.loop import WorkerHooks


def _positions(ids: list[str], *, num_workers: int, worker_batch: int, kept_rows: int,
               keys: np.ndarray) -> list[list[str]]:
    """Each rank's sample ids in the order it reads them (rank_rows, then by position)."""
    table = pa.table({"sample_id": ids})
    ranks = []
    for rank in range(num_workers):
        mine = rank_rows(table, keys=keys, seed=3, epoch=1, rank=rank, worker_batch=worker_batch,
                         num_workers=num_workers, kept_rows=kept_rows).to_pydict()
        ranks.append([sid for _, sid in sorted(zip(mine["_position"], mine["sample_id"],
                                                   strict=True))])
    return ranks


def test_every_global_batch_holds_the_same_rows_on_any_worker_count():
    ids = [f"img{i // 5}_cap{i % 5}" for i in range(103)]  # COCO's five captions an image
    keys = epoch_keys(ids, seed=3, epoch=1)
    global_batch, steps = 16, 103 // 16
    [one] = _positions(ids, num_workers=1, worker_batch=16, kept_rows=steps * 16, keys=keys)
    assert len(one) == steps * global_batch and len(set(one)) == len(one)
    assert one != sorted(one)  # a shuffled order, not the table's
    batches = [set(one[t * global_batch:(t + 1) * global_batch]) for t in range(steps)]
    for workers in (2, 4, 8):
        share = global_batch // workers
        ranks = _positions(ids, num_workers=workers, worker_batch=share,
                           kept_rows=steps * global_batch, keys=keys)
        assert all(len(rows) == steps * share for rows in ranks)
        for t, expected in enumerate(batches):  # step t: the union of every rank's t-th batch
            assert set().union(*(rows[t * share:(t + 1) * share] for rows in ranks)) == expected
    # Another epoch, another order; a row whose image does not decode is read by no one.
    assert epoch_keys(ids, seed=3, epoch=2).tolist() != keys.tolist()
    usable = epoch_keys(ids[1:], seed=3, epoch=1)
    [rows] = _positions(ids, num_workers=1, worker_batch=16, kept_rows=96, keys=usable)
    assert ids[0] not in rows and len(rows) == 96


def test_repeated_sample_ids_are_refused():
    with pytest.raises(ValueError, match="1 sample ids are repeated"):
        epoch_keys(["a", "b", "a"], seed=0, epoch=0)


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

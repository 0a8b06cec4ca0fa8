"""The same optimisation on 1, 2, 4 or 8 workers (`data.batch_scope: global`).

With batch_scope "worker" (ours: configs/coco.yaml) `data.batch_size` is each worker's
batch, so W workers take W x batch_size rows per optimizer step: the step count, the
negatives per loss and the learning rate per row change with W. With "global" (the
paper's run, configs/paper.yaml) `data.batch_size` is the rows of one optimizer step, and
a run on any number of workers is the same optimisation:

- each epoch's order is a seeded permutation of the rows, by a key per row (a hash of
  the seed, the epoch and the sample id), not by which worker reads it;
- global batch t is positions [tB, (t+1)B) of that order; worker r reads the positions p
  with (p mod B) // b == r (b = B / W), in order, and the last partial batch is dropped;
- features are gathered with gradient (loss.gather, required), so every worker computes
  the loss of the whole global batch (csclip.loss) and DDP's mean of the workers'
  gradients is that loss's gradient; text slots are drawn per sample (sampling.py).

So the global batch, the negatives per loss, the steps and the learning rate of each step
do not depend on run.num_workers (tests/test_global_batch.py compares the per-step losses
of 1 and 2 gloo workers). Each worker reads a dataset of its own (no SplitCoordinator).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from csclip.config.train import worker_batch_size
from csclip.train.stream import epoch_dataset_name

POSITION = "_position"  # a row's place in its epoch's order (dropped by the preparation)


def rank_dataset_name(epoch: int, rank: int) -> str:
    """The Ray Train dataset that worker `rank` reads in `epoch` (batch_scope global)."""
    return f"train_epoch_{epoch}_rank_{rank}"


def row_keys(sample_ids: Sequence[str], seed: int, epoch: int) -> np.ndarray:
    """One uint64 per row: the sort key of `epoch`'s order (blake2b of seed, epoch, id)."""
    prefix = f"{seed}:{epoch}:".encode()
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(prefix + str(sample_id).encode(),
                                        digest_size=8).digest(), "little")
         for sample_id in sample_ids), dtype=np.uint64, count=len(sample_ids))


def epoch_keys(sample_ids: Sequence[str], seed: int, epoch: int) -> np.ndarray:
    """The sorted keys of the usable rows of `epoch`: position p holds the p-th row.
    Raises ValueError on repeated sample ids (their rows would share one position)."""
    keys = np.sort(row_keys(sample_ids, seed, epoch))
    if len(keys) > 1 and (keys[1:] == keys[:-1]).any():
        repeated = len(sample_ids) - len(set(sample_ids))
        raise ValueError(f"data.batch_scope global orders rows by sample_id, and {repeated} "
                         "sample ids are repeated in the training data; make them unique")
    return keys


def rank_rows(batch: pa.Table, *, keys, seed: int, epoch: int, rank: int, worker_batch: int,
              num_workers: int, kept_rows: int) -> pa.Table:
    """The rows of `batch` that worker `rank` reads in `epoch`, with their POSITION.

    keys: epoch_keys of the usable rows, or a one-element list holding its ObjectRef (a
    large array travels once through the object store). A row whose key is not among them
    (its image does not decode) and the rows past the epoch's last whole global batch
    (kept_rows) are read by no worker.
    """
    if isinstance(keys, list):
        import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

        keys = ray.get(keys[0])
    if batch.num_rows == 0:
        return batch.append_column(POSITION, pa.array([], pa.int64()))
    own = row_keys(batch.column("sample_id").to_pylist(), seed, epoch)
    position = np.searchsorted(keys, own)
    found = position < len(keys)
    found[found] = keys[position[found]] == own[found]
    global_batch = worker_batch * num_workers
    mine = found & (position < kept_rows) & ((position % global_batch) // worker_batch == rank)
    return batch.filter(pa.array(mine)).append_column(
        POSITION, pa.array(position[mine].astype(np.int64)))


def rank_orders(*, sample_ids: Sequence[str], seed: int, worker_batch: int, num_workers: int,
                steps_per_epoch: int) -> list:
    """One `order(rows, epoch)` per worker for csclip.train.stream.epoch_datasets: worker
    r's share of every global batch of the epoch, in position order. The epoch's keys go
    through the object store once, shared by every worker's tasks."""
    import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    keys_by_epoch: dict[int, list] = {}

    def order_for(rank: int):
        def order(rows, epoch: int):
            if epoch not in keys_by_epoch:
                keys_by_epoch[epoch] = [ray.put(epoch_keys(sample_ids, seed, epoch))]
            return rows.map_batches(rank_rows, batch_format="pyarrow", fn_kwargs={
                "keys": keys_by_epoch[epoch], "seed": seed, "epoch": epoch, "rank": rank,
                "worker_batch": worker_batch, "num_workers": num_workers,
                "kept_rows": steps_per_epoch * worker_batch * num_workers}).sort(POSITION)
        return order

    return [order_for(rank) for rank in range(num_workers)]


def training_datasets(build, plan, batch_scope: str, seed: int, num_workers: int,
                      batch_size: int) -> dict:
    """Ray Train's datasets of a run, by name. build(order=None): epoch_datasets' list,
    one dataset per epoch. "worker" scope: one per epoch, split over the workers. "global":
    one per epoch and worker (rank_orders), each read whole by its worker."""
    if batch_scope != "global":
        return {epoch_dataset_name(epoch): dataset for epoch, dataset in enumerate(build())}
    orders = rank_orders(sample_ids=plan.sample_ids, seed=seed, num_workers=num_workers,
                         worker_batch=worker_batch_size(batch_size, batch_scope, num_workers),
                         steps_per_epoch=plan.steps_per_epoch)
    return {rank_dataset_name(epoch, rank): dataset for rank, order in enumerate(orders)
            for epoch, dataset in enumerate(build(order=order))}


def shard_name(epoch: int, rank: int, batch_scope: str) -> str:
    """The dataset worker `rank` reads in `epoch` (training_datasets' names)."""
    return rank_dataset_name(epoch, rank) if batch_scope == "global" else epoch_dataset_name(epoch)

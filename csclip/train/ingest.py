"""Ray Train ingest with one dataset per epoch: the split of an epoch ends with the epoch.

Each epoch is its own Ray Train dataset (csclip.train.shards.shard_datasets), so a
resumed run never executes the epochs before the one it resumes in. With several workers
Ray Data splits each with a SplitCoordinator actor (a process, ~200 MB), and Ray Train's
DatasetManager keeps every coordinator until the worker group ends: 65 of them in the
demo's 2000-step layout warm start. Here the workers end each epoch's coordinator once
all of them are past the epoch (release_epoch).

Ray Train's DatasetManager would then find dead coordinators when the group ends (it asks
each to shut its executor down) and log an ActorDiedError traceback on the driver's
console. So the split iterators reach it wrapped (EpochSplit, not a
StreamSplitDataIterator), it never lists them, and their lifetime is this module's:
released after their epoch, or ended with the DatasetManager that owns them when a group
fails. Written against Ray 2.60 (pyproject pins it); tests/test_eval_periodic.py's
two-worker run and the two-node scenario check the lifetimes on every run of the suite.

Imported by the DatasetManager (it unpickles the DataConfig): no torch at import.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import ray
from ray.data import DataIterator
from ray.data._internal.iterator.stream_split_iterator import StreamSplitDataIterator
from ray.train import DataConfig

if TYPE_CHECKING:
    from ray.data import DataContext


class EpochSplit(DataIterator):
    """One worker's split of one epoch's dataset: Ray Data's StreamSplitDataIterator,
    whose coordinator the workers end after the epoch (release)."""

    def __init__(self, split: StreamSplitDataIterator):
        self._split = split

    def _to_ref_bundle_iterator(self):
        return self._split._to_ref_bundle_iterator()

    def _on_iteration_end(self, executor) -> None:
        self._split._on_iteration_end(executor)

    def _get_dataset_tag(self) -> dict:
        return self._split._get_dataset_tag()

    def stats(self) -> str:
        return self._split.stats()

    def schema(self):
        return self._split.schema()

    def get_context(self) -> DataContext:
        return self._split.get_context()

    def world_size(self) -> int:
        return self._split.world_size()

    def release(self) -> None:
        """End the coordinator (every split of the epoch shares it)."""
        ray.kill(self._split._coord_actor, no_restart=True)


class EpochSplitConfig(DataConfig):
    """ray.train.DataConfig whose split shards are EpochSplits (unsplit ones, for a
    single worker, have no coordinator and pass through)."""

    def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
        shards = super().configure(datasets, world_size, worker_handles, worker_node_ids,
                                   **kwargs)
        return [{name: EpochSplit(shard) if isinstance(shard, StreamSplitDataIterator)
                 else shard for name, shard in worker.items()} for worker in shards]


def release_epoch(shard, rank: int) -> None:
    """After a worker's last batch of an epoch: once every worker is there (the barrier:
    a worker still reading would lose its blocks), rank 0 ends the epoch's coordinator.
    Every worker calls it; a shard without a coordinator returns at once."""
    if not isinstance(shard, EpochSplit):
        return
    import torch.distributed as dist  # noqa: PLC0415  Ray Train's dataset actors unpickle this module and never need torch

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    if rank == 0:
        shard.release()

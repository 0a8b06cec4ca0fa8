"""The same optimisation on 1, 2, 4 or 8 workers (`data.batch_scope: global`).

With batch_scope "worker" (ours: configs/coco.yaml) `data.batch_size` is each worker's
batch, so W workers take W x batch_size rows per optimizer step: the step count, the
negatives per loss and the learning rate per row change with W. With "global" (the
paper's run, configs/paper.yaml) `data.batch_size` is the rows of one optimizer step, and
a run on any number of workers is the same optimisation:

- each epoch's order is a function of the seed and the epoch (csclip.train.shards: the
  shards permuted, then the samples within each group of shards), not of which worker
  reads it;
- global batch t is positions [tB, (t+1)B) of that order; worker r reads the positions p
  with (p mod B) // b == r (b = B / W), in order, and the last partial batch is dropped
  (csclip.train.shards.served);
- features are gathered with gradient (loss.gather, required), so every worker computes
  the loss of the whole global batch (csclip.loss) and DDP's mean of the workers'
  gradients is that loss's gradient; text slots are drawn per sample (sampling.py).

So the global batch, the negatives per loss, the steps and the learning rate of each step
do not depend on run.num_workers (tests/test_global_batch.py compares the per-step losses
of 1 and 2 gloo workers). Each worker reads a dataset of its own (no SplitCoordinator).
"""

from __future__ import annotations


def rank_dataset_name(epoch: int, rank: int) -> str:
    """The Ray Train dataset that worker `rank` reads in `epoch` (batch_scope global)."""
    return f"train_epoch_{epoch}_rank_{rank}"


def epoch_dataset_name(epoch: int) -> str:
    """The name of epoch `epoch`'s dataset among Ray Train's datasets (batch_scope worker)."""
    return f"train_epoch_{epoch}"


def shard_name(epoch: int, rank: int, batch_scope: str) -> str:
    """The dataset worker `rank` reads in `epoch` (csclip.train.shards.shard_datasets's
    names)."""
    return rank_dataset_name(epoch, rank) if batch_scope == "global" else epoch_dataset_name(epoch)

"""The lines a training prints to the console: what is being trained, at once (the data
plan, Ray's start and the first batch can take minutes), the first step, then one line
every `run.log_every` steps from rank 0 (Ray forwards a worker's stderr to the driver,
prefixed with `(RayTrainWorker pid=...)`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csclip.config.train import TrainConfig


def start_line(config: TrainConfig, name: str) -> str:
    """`train: run csclip-1a2b3c: csclip on ViT-B-32 (openai), 200 steps, batch 32 x 2 CPU
    workers, data s3://b/units, storage runs/train/csclip-1a2b3c; a line every 10 steps`."""
    optim, run, data = config.optim, config.run, config.data
    steps = f"{optim.max_steps} steps" if optim.max_steps else f"{optim.epochs} epochs"
    weights = f" ({config.model.pretrained})" if config.model.pretrained else ""
    source = data.units_uri or f"the synthetic world ({data.world.num_train} scenes)"
    workers = f"{run.num_workers} {'GPU' if run.use_gpu else 'CPU'} worker" + (
        "s" if run.num_workers > 1 else "")
    storage = f"{run.storage_path.rstrip('/')}/{name}"
    return (f"train: run {name}: {config.loss.method} on {config.model.name}{weights}, "
            f"{steps}, batch {data.batch_size} x {workers}, data {source}, storage {storage}; "
            f"a line every {run.log_every} steps")


def first_step_line(method: str, step: int, total: int, seconds: float) -> str:
    """The first step of a worker (fresh or resumed): training has begun."""
    return (f"{method} step {step}/{total}: training started, {seconds:.0f} s after the "
            "loop began (the wait for the first batch included)")


def step_line(method: str, step: int, total: int, metrics: Mapping[str, float],
              lr: float) -> str:
    """`csclip step 50/600 loss 8.6604 (full 1.2960 unit 2.2224 image_foil 2.5710) lr
    9.94e-04 166 samples/s (data wait 30%)` from the published step's metrics."""
    image_foil = (f" image_foil {metrics['loss_image_foil']:.4f}"
                  if "loss_image_foil" in metrics else "")
    return (f"{method} step {step}/{total} loss {metrics['loss']:.4f} "
            f"(full {metrics['loss_full']:.4f} unit {metrics['loss_unit']:.4f}{image_foil}) "
            f"lr {lr:.2e} {metrics['samples_per_s']:.0f} samples/s "
            f"(data wait {100 * metrics['data_wait_frac']:.0f}%)")

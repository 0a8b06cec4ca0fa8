"""Training throughput: csclip's training step against open_clip's own loop.

    python benchmarks/bench_train.py [--model csclip-tiny] [--image-size 64] [--batch 64]
                                     [--steps 30] [--ray]

In one process, on the same model config, the same pre-processed world batches and the
same seed, it times:
  baseline  open_clip_train.train.train_one_epoch with open_clip.ClipLoss (fp32, AdamW,
            cosine schedule, grad clipping) over an in-memory DataLoader;
  clip      csclip's step (csclip.train.step.train_step with --method clip) over the same batches;
  csclip    the same step with --method csclip (N = 2: 6 texts per image instead of 1).
It prints samples/s and the ratios clip/baseline (throughput) and csclip/clip (step time).
With --ray it also runs the full Ray Train pipeline (Ray Data feed, 1 worker) with
--method clip and reports its median per-step samples/s against the same baseline.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from types import SimpleNamespace

import torch


def make_batches(model_name: str, image_size: int, batch: int, steps: int) -> list[dict]:
    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import prepare_batch, preprocess_key
    from csclip.units import records_to_table
    from csclip.world import world_record

    world = WorldConfig(image_size=min(max(image_size, 32), 96))
    spec = spec_of(create_bundle(model_name, image_size=image_size).model, model_name)
    records = [world_record(world, "train", i) for i in range(batch * steps)]
    batches = []
    for start in range(0, len(records), batch):
        columns = prepare_batch(records_to_table(records[start:start + batch]),
                                sampling=SamplingConfig().model_dump(),
                                preprocess=preprocess_key(spec.preprocess_cfg),
                                model_name=model_name, seed=0, epoch=0)
        batches.append({k: torch.as_tensor(v) for k, v in columns.items()})
    return batches


def fresh_model(model_name: str, image_size: int) -> torch.nn.Module:
    from csclip.model import create_bundle

    torch.manual_seed(0)
    model = create_bundle(model_name, image_size=image_size).model
    model.train()
    return model


def time_open_clip(model_name: str, image_size: int, batches: list[dict], warmup: int) -> float:
    """Samples/s of open_clip_train's train_one_epoch (after `warmup` untimed steps)."""
    import open_clip
    from open_clip_train.scheduler import cosine_lr
    from open_clip_train.train import train_one_epoch

    model = fresh_model(model_name, image_size)
    model.output_dict = True  # as open_clip_train creates it
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    batch_size = batches[0]["image"].shape[0]
    args = SimpleNamespace(
        device="cpu", precision="fp32", distill=False, accum_freq=1, skip_scheduler=False,
        grad_clip_norm=1.0, horovod=False, log_every_n_steps=10**9, batch_size=batch_size,
        world_size=1, rank=0, local_rank=0, wandb=False, save_logs=False, distributed=False)
    scheduler = cosine_lr(optimizer, 1e-4, 10, len(batches))

    def loader(items):
        data = [(b["image"], b["caption"]) for b in items]
        return _Loader(data, len(data) * batch_size)

    loss = open_clip.ClipLoss()
    train_one_epoch(model, {"train": DataInfo(loader(batches[:warmup]))}, loss, 0, optimizer, None,
                    scheduler, None, args)
    started = time.perf_counter()
    train_one_epoch(model, {"train": DataInfo(loader(batches[warmup:]))}, loss, 1, optimizer, None,
                    scheduler, None, args)
    return batch_size * (len(batches) - warmup) / (time.perf_counter() - started)


class DataInfo:
    # open_clip_train.data.DataInfo, minus its webdataset import (not installed here).
    def __init__(self, dataloader):
        self.dataloader = dataloader

    def set_epoch(self, epoch: int) -> None:
        pass


class _Loader:
    """The attributes train_one_epoch reads from a DataLoader, over in-memory batches."""

    def __init__(self, data: list, num_samples: int):
        self.data, self.num_batches, self.num_samples = data, len(data), num_samples

    def __iter__(self):
        return iter(self.data)

    def __len__(self):
        return len(self.data)


def time_csclip(model_name: str, image_size: int, batches: list[dict], warmup: int,
                method: str) -> float:
    """Samples/s of csclip's training step (schedule + loss + clip + logit clamp)."""
    from csclip.config.train import TrainConfig
    from csclip.train.loop import step_options
    from csclip.train.optim import lr_at
    from csclip.train.step import build_training, train_step

    config = TrainConfig.model_validate({
        "loss": {"method": method}, "optim": {"lr": 1e-4, "weight_decay": 0.1, "warmup_steps": 10}})
    training = build_training(fresh_model(model_name, image_size), config.optim,
                              step_options(config), torch.device("cpu"))
    started = 0.0
    for index, batch in enumerate(batches):
        if index == warmup:
            started = time.perf_counter()
        for group in training.optimizer.param_groups:
            group["lr"] = lr_at(index, config.optim, len(batches), len(batches))
        train_step(training, batch)
    batch_size = batches[0]["image"].shape[0]
    return batch_size * (len(batches) - warmup) / (time.perf_counter() - started)


def ray_clip_samples_per_s(model_name: str, image_size: int, batch: int, steps: int) -> float:
    """Median per-step samples/s of a full Ray Train run (Ray Data feed) with method clip."""
    import ray

    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.tracking import run_metrics
    from csclip.train import run

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        config = load_config(TrainConfig, None, [
            f"model.name={model_name}", f"model.image_size={image_size}",
            f"data.world.image_size={min(max(image_size, 32), 96)}",
            f"data.world.num_train={batch * steps}", f"data.batch_size={batch}",
            "loss.method=clip", f"optim.max_steps={steps}", f"run.checkpoint_every={steps}",
            f"run.storage_path={tmp}/runs", f"tracking.uri={uri}", "run.log_every=5"])
        result = run(config)
        values = [v for _, v in run_metrics(uri, result.mlflow_run_id, "samples_per_s")]
    ray.shutdown()
    return statistics.median(values[min(5, len(values) - 1):])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="csclip-tiny")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30, help="timed steps (after 5 warmup)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (median)")
    parser.add_argument("--ray", action="store_true", help="also time the full Ray Train run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warmup = 5
    batches = make_batches(args.model, args.image_size, args.batch, args.steps + warmup)
    loops = {
        "baseline (open_clip train_one_epoch)": lambda: time_open_clip(
            args.model, args.image_size, batches, warmup),
        "csclip --method clip": lambda: time_csclip(args.model, args.image_size, batches, warmup,
                                                    "clip"),
        "csclip --method csclip": lambda: time_csclip(args.model, args.image_size, batches,
                                                      warmup, "csclip"),
    }
    # Interleaved repeats, medians: other processes' load shifts over a run.
    samples: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.repeats):
        for name, loop in loops.items():
            samples[name].append(loop())
    results = {name: statistics.median(values) for name, values in samples.items()}
    if args.ray:
        results["csclip --method clip, Ray Train + Ray Data"] = ray_clip_samples_per_s(
            args.model, args.image_size, args.batch, args.steps + warmup)
    base = results["baseline (open_clip train_one_epoch)"]
    print(f"model {args.model}, {args.image_size} px, batch {args.batch}, {args.steps} timed "
          f"steps, {args.threads} thread(s), median of {args.repeats} interleaved repeats")
    print("| loop | samples/s | vs baseline |")
    print("|---|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.1f} | {value / base:.2f} |")
    clip, cs = results["csclip --method clip"], results["csclip --method csclip"]
    print(f"step-time ratio csclip/clip: {clip / cs:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many SplitCoordinator processes a multi-worker run holds at once, and their memory.

    python benchmarks/bench_coordinators.py [--epochs 10]

Trains csclip-tiny with two workers on 16 world scenes at 32 px (batch 4: two steps an
epoch) for `--epochs` epochs in a local Ray with 4 logical CPUs, polling `ps` twice a
second for `ray::SplitCoordinator` processes; prints the peak count and their peak total
RSS. Every epoch is its own split dataset: Ray Train alone keeps each one's coordinator
until the run ends (the count grows to `--epochs`); csclip.train.ingest ends each after
its epoch. Run it on a commit before that module for the baseline (docs/performance.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def coordinators_rss_kb() -> list[int]:
    out = subprocess.run(["ps", "-eo", "rss,args"], capture_output=True, text=True).stdout
    return [int(line.split()[0]) for line in out.splitlines() if "ray::SplitCoordinator" in line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args(argv)
    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.entry.ray_init import init_ray
    from csclip.train import run

    init_ray(num_cpus=4)
    tmp = tempfile.mkdtemp()
    config = load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
        "data.world.num_train=16", "data.world.num_val=4", "data.batch_size=4",
        "data.shuffle_buffer=0", f"optim.max_steps={2 * args.epochs}", "optim.warmup_steps=1",
        f"run.checkpoint_every={2 * args.epochs}", "run.log_every=10",
        f"run.storage_path={tmp}/runs", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
        "run.num_workers=2", "run.cpus_per_worker=1"])
    peak = {"count": 0, "rss_mb": 0.0}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            rss = coordinators_rss_kb()
            peak["count"] = max(peak["count"], len(rss))
            peak["rss_mb"] = max(peak["rss_mb"], sum(rss) / 1024)
            time.sleep(0.5)

    threading.Thread(target=poll, daemon=True).start()
    started = time.perf_counter()
    result = run(config)
    done.set()
    print(f"{result.metrics['step']} steps, {args.epochs} epochs, two workers: "
          f"{time.perf_counter() - started:.0f} s; at most {peak['count']} SplitCoordinator "
          f"processes at once, {peak['rss_mb']:.0f} MB RSS together")
    return 0


if __name__ == "__main__":
    sys.exit(main())

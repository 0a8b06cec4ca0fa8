"""Ray Data's scheduling loop paced (run.data_loop_period_s 0.02, csclip.train.pace) against
Ray's own loop (null), in one process, the variants alternating.

    python benchmarks/bench_pace.py [--steps 60] [--order paced,unpaced,unpaced,paced]

Each run is a CLIP fine-tuning of the world of configs/default.yaml with the image tower
locked, as the demo's CLIP-FT stage, for `--steps` steps, in a fresh storage directory
(nothing resumed), on a local Ray started once (csclip.entry.ray_init.init_ray). Prints
one JSON line per run: its wall seconds and the run's metrics. The worker's step lines
("N samples/s" every run.log_every steps) give the training's own pace; the first run
also renders the world (kept for the later runs of this driver).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--order", default="paced,unpaced,unpaced,paced")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.entry.ray_init import init_ray
    from csclip.train.loop import run

    init_ray()
    root = tempfile.mkdtemp(prefix="bench-pace-")
    for index, variant in enumerate(args.order.split(",")):
        period = {"paced": "0.02", "unpaced": "null"}[variant]
        config = load_config(TrainConfig, str(ROOT / "configs" / "default.yaml"), [
            "loss.method=clip", "model.lock.image=true", f"optim.max_steps={args.steps}",
            "optim.warmup_steps=5", f"run.checkpoint_every={args.steps}",
            f"run.log_every={max(1, args.steps // 3)}", f"run.data_loop_period_s={period}",
            f"run.storage_path={root}/{index}", "tracking.enabled=false"])
        started = time.perf_counter()
        result = run(config)
        metrics = {k: v for k, v in result.metrics.items() if isinstance(v, int | float)}
        print(json.dumps({"variant": variant, "wall_s": round(time.perf_counter() - started, 1),
                          **metrics}), flush=True)


if __name__ == "__main__":
    main()

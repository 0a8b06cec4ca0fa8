"""What a fresh Ray Data task worker pays before its first training batch: the CPU time of
a new interpreter that decodes, transforms and tokenizes world rows (decode_batch) and
samples and tokenizes their text slots (sample_batch).

    python benchmarks/bench_task_start.py [--rows 16] [--repeats 5] [--write-docs]

Two variants, interleaved, each in its own interpreter every time: csclip.preprocess's
transform and tokenizer (without open_clip), and the baseline, which imports open_clip
first as the tasks did before (so the same functions take open_clip's own tokenizer
module). The ratio is of their median CPU seconds (user + system of the child).
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfdoc import publish  # noqa: E402

HEADING = "## A data task's start (benchmarks/bench_task_start.py)"
REPO = Path(__file__).resolve().parents[1]

TASK = """
import sys
if sys.argv[1] == "open_clip":
    import open_clip  # what every task imported before csclip.preprocess
from csclip.train.sampling import SamplingConfig
from csclip.train.stream import decode_batch, image_shape, preprocess_key, sample_batch
from csclip.units import records_to_table
from csclip.world import WorldConfig, world_record
cfg = {"size": 64, "mode": "RGB", "mean": [0.48145466, 0.4578275, 0.40821073],
       "std": [0.26862954, 0.26130258, 0.27577711], "interpolation": "bicubic",
       "resize_mode": "shortest", "fill_color": 0}
rows = int(sys.argv[2])
table = records_to_table([world_record(WorldConfig(), "train", i) for i in range(rows)])
decoded = decode_batch(table, preprocess=preprocess_key(cfg), model_name="csclip-tiny")
sample_batch(decoded, sampling=SamplingConfig().model_dump(mode="json"),
             model_name="csclip-tiny", seed=0, epoch=0, image_shape=image_shape(cfg))
"""


def _cpu_seconds(variant: str, rows: int) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", TASK, variant, str(rows)], cwd=REPO, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {"open_clip": [], "csclip.preprocess": []}
    _cpu_seconds("csclip.preprocess", args.rows)  # warm the file cache
    for _ in range(args.repeats):
        for variant in times:
            times[variant].append(_cpu_seconds(variant, args.rows))
    base = statistics.median(times["open_clip"])
    rows = "\n".join(
        f"| {variant} | {statistics.median(t):.2f} | {statistics.median(t) / base:.2f}x |"
        for variant, t in times.items())
    section = (
        f"{HEADING}\n\n"
        f"Command: `python benchmarks/bench_task_start.py --rows {args.rows} --repeats "
        f"{args.repeats}` ({platform.machine()}, Python {platform.python_version()}). CPU "
        "seconds (user + system) of a fresh interpreter, as a new Ray Data task worker is, "
        f"that runs decode_batch and sample_batch on {args.rows} world rows (64 px, "
        "csclip-tiny, CS-CLIP columns); median of the repeats, variants interleaved.\n\n"
        "| transform and tokenizer | CPU s | vs open_clip |\n|---|---|---|\n"
        f"{rows}\n\n"
        "Every task worker that prepares training batches starts this way once (more "
        "when Ray replaces idle workers); the training workers still import open_clip for "
        "the model.\n")
    publish(HEADING, section, args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

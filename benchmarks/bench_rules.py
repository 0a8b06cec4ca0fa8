"""Rules-backend throughput and memory: captions per CPU-second on one core over the
SugarCrepe captions (goal: 5,000), against a tokenize-only baseline in the same run, and
peak RSS of fresh subprocesses at 1x and 10x input (captions repeated, streamed: memory
should stay flat). CPU time, not wall time: on a shared machine the wall clock counts the
other programs' turns too.

    .venv/bin/python benchmarks/bench_rules.py            # full: 1x and 10x
    .venv/bin/python benchmarks/bench_rules.py --multiplier 2   # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extraction_quality import DEFAULT_DATA, load_sugarcrepe  # noqa: E402

from csclip.extract.rules import extract_units, tokenize  # noqa: E402

GOAL_PER_CPU_S = 5_000


def pin_to_one_core() -> None:
    # "Per core": the extractor is single-threaded; pinning keeps the number honest on a
    # machine where other work runs.
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})


def throughput(captions: list[str]) -> dict[str, float]:
    repeats = 20  # one pass of tokenize() is too short for the CPU clock's resolution
    start_cpu = time.process_time()
    for _ in range(repeats):
        for caption in captions:
            tokenize(caption)
    baseline_cpu = (time.process_time() - start_cpu) / repeats
    start, start_cpu = time.perf_counter(), time.process_time()
    num_units = 0
    for caption in captions:
        result = extract_units(caption)
        num_units += len(result.entities) + len(result.relations)
    elapsed = time.perf_counter() - start
    # CPU time as well: on a shared machine the wall-clock rate drops with other load.
    cpu = time.process_time() - start_cpu
    return {"captions": len(captions), "seconds": elapsed,
            "captions_per_s": len(captions) / elapsed,
            "captions_per_cpu_s": len(captions) / cpu,
            "tokenize_captions_per_cpu_s": len(captions) / baseline_cpu,
            "slowdown_vs_tokenize": cpu / baseline_cpu, "units": num_units}


def child(data: Path, multiplier: int) -> None:
    """Stream the captions `multiplier` times, keeping only counts; print peak RSS."""
    captions = load_sugarcrepe(data)
    num_units = done = 0
    for _ in range(multiplier):
        for caption in captions:
            result = extract_units(caption)
            num_units += len(result.entities) + len(result.relations)
            done += 1
            if done % 10_000 == 0:  # progress on stderr; stdout carries the result
                print(f"  {multiplier}x: {done} captions", file=sys.stderr, flush=True)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    print(json.dumps({"multiplier": multiplier, "captions": len(captions) * multiplier,
                      "units": num_units, "peak_rss_mib": peak_kib / 1024}))


def peak_rss(data: Path, multiplier: int) -> dict:
    print(f"peak RSS run, {multiplier}x input, in a fresh process ...", flush=True)
    out = subprocess.run([sys.executable, __file__, "--child", str(multiplier),
                          "--data", str(data)], stdout=subprocess.PIPE, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--multiplier", type=int, default=10, help="the large input, x captions")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    pin_to_one_core()
    if args.child is not None:
        child(args.data, args.child)
        return 0

    captions = load_sugarcrepe(args.data)
    speed = throughput(captions)
    print(f"throughput, 1 core, {speed['captions']} captions: "
          f"{speed['captions_per_s']:.0f} captions/s wall, "
          f"{speed['captions_per_cpu_s']:.0f} per CPU-second ({speed['seconds']:.1f} s, "
          f"{speed['units']} units); tokenize-only baseline "
          f"{speed['tokenize_captions_per_cpu_s']:.0f} per CPU-second; "
          f"ratio extract/tokenize CPU time {speed['slowdown_vs_tokenize']:.0f}x; goal "
          f"{GOAL_PER_CPU_S:,} per CPU-second: "
          f"{'met' if speed['captions_per_cpu_s'] >= GOAL_PER_CPU_S else 'not met'}")
    runs = {m: peak_rss(args.data, m) for m in (0, 1, args.multiplier)}
    for m, run in runs.items():
        label = "import + load only (baseline)" if m == 0 else f"{m}x input"
        print(f"peak RSS, {label}: {run['peak_rss_mib']:.1f} MiB ({run['captions']} captions)")
    ratio = runs[args.multiplier]["peak_rss_mib"] / runs[1]["peak_rss_mib"]
    print(f"peak RSS ratio {args.multiplier}x / 1x: {ratio:.3f} (flat = 1.0); "
          f"1x over baseline: {runs[1]['peak_rss_mib'] - runs[0]['peak_rss_mib']:+.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

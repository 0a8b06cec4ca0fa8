"""World generation throughput and peak memory at two sizes; memory must stay flat.

    .venv/bin/python benchmarks/bench_world.py                 # 10k and 100k samples
    .venv/bin/python benchmarks/bench_world.py --sizes 1000 10000 --write-docs

Each size runs `write_world` (generate + render + encode + sharded Parquet) in a fresh
subprocess writing to a temporary directory, so peak RSS is that run's alone. The
smallest size is the baseline: the report gives samples/s and peak RSS, and their ratios
to the baseline (a memory ratio near 1.0 means generation streams).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from perfdoc import publish  # benchmarks/perfdoc.py (scripts run from benchmarks/)

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## World generation (benchmarks/bench_world.py)"


def child(num_samples: int, image_size: int, out_dir: str) -> dict:
    """One measured run; called in a fresh interpreter."""
    from csclip.config.world import WorldConfig
    from csclip.world import write_world

    config = WorldConfig(seed=0, image_size=image_size, num_train=num_samples, num_val=0,
                         num_test=0)
    start, cpu_start = time.perf_counter(), time.process_time()
    summary = write_world(config, out_dir, splits=["train"])
    seconds = time.perf_counter() - start
    # CPU time too: on a shared 2-core machine wall time depends on the neighbours.
    cpu_seconds = time.process_time() - cpu_start
    size = sum(p.stat().st_size for p in Path(out_dir).rglob("*.parquet"))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"num_samples": num_samples, "seconds": seconds,
            "samples_per_s": num_samples / seconds, "files": len(summary.files),
            "samples_per_cpu_s": num_samples / cpu_seconds,
            "megabytes_written": size / 2**20,
            # ru_maxrss is in KiB on Linux: the peak resident set of this process.
            "peak_rss_mb": usage.ru_maxrss / 1024}


def measure(num_samples: int, image_size: int) -> dict:
    with tempfile.TemporaryDirectory() as out_dir:
        command = [sys.executable, __file__, "--child", str(num_samples),
                   "--image-size", str(image_size), "--out", out_dir]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


NOTES = """Peak RSS is flat because `write_world` holds one Parquet row group (1,000 samples,
PNGs included) at a time and every sample comes from its own seeded RNG. Wall-clock rates
depend on what else runs on the machine; the CPU rate (the process's own CPU time) is the
one to compare across runs."""


def report(results: list[dict], image_size: int, command: str,
           load: tuple[float, float]) -> str:
    base = results[0]
    lines = [SECTION, "",
             f"Command: `{command}` ({platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores, load average {load[0]:.1f} at start and {load[1]:.1f} "
             f"at end; {image_size}px images, one process, sharded Parquet to a temp dir; "
             f"baseline = {base['num_samples']} samples).", "",
             "| samples | seconds | samples/s (wall) | samples/s (CPU) | peak RSS (MB) | "
             "MB written | samples/s (CPU) vs baseline | peak RSS vs baseline |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['num_samples']} | {r['seconds']:.1f} | {r['samples_per_s']:.0f} | "
                     f"{r['samples_per_cpu_s']:.0f} | {r['peak_rss_mb']:.0f} | "
                     f"{r['megabytes_written']:.1f} | "
                     f"{r['samples_per_cpu_s'] / base['samples_per_cpu_s']:.2f} | "
                     f"{r['peak_rss_mb'] / base['peak_rss_mb']:.2f} |")
    return "\n".join(lines + ["", NOTES]) + "\n"



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="sizes 1000 and 10000")
    parser.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.image_size, args.out)))
        return 0
    sizes = [1_000, 10_000] if args.quick else sorted(args.sizes)
    results, load_start = [], os.getloadavg()[0]
    for size in sizes:
        print(f"generating {size} samples ...", file=sys.stderr, flush=True)
        results.append(measure(size, args.image_size))
        print(f"  {results[-1]['samples_per_s']:.0f} samples/s, "
              f"peak RSS {results[-1]['peak_rss_mb']:.0f} MB", file=sys.stderr, flush=True)
    command = "python benchmarks/bench_world.py " + " ".join(argv or sys.argv[1:])
    section = report(results, args.image_size, command.strip(),
                     (load_start, os.getloadavg()[0]))
    publish(SECTION, section, args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

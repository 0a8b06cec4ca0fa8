"""Reading a units table for training: Ray Data's default Parquet reader in Ray 2.60
(DataSourceV2, which lists the files on a pool of 32 FooterReader actors started anew at
every execution) against csclip's `read_units_parquet` (the first reader: files listed
in the driver), on the same table in the same Ray instance.

    python benchmarks/bench_units_read.py [--parts 3] [--rows 400] [--executions 3]
        [--repeats 3] [--num-cpus 2] [--write-docs]

A training run executes its source several times (the data check, every epoch, every
restart); each execution here is `count()` of the table filtered to its split, as
csclip.train.stream's source is. Per variant and repeat: wall seconds for the executions,
the machine's busy CPU seconds over them (from /proc/stat: run it on a quiet machine),
and the FooterReader actors created. Variants interleaved; medians; ratio against the
default reader.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfdoc import publish  # noqa: E402

HEADING = "## Reading a units table for training (benchmarks/bench_units_read.py)"


def _busy_cpu_seconds() -> float:
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _footer_readers() -> int:
    import ray._private.state

    return sum(a["ActorClassName"] == "FooterReader" for a in ray._private.state.actors().values())


def _write_table(directory: Path, parts: int, rows: int) -> None:
    import pyarrow.parquet as pq

    from csclip.config.world import WorldConfig
    from csclip.units import records_to_table
    from csclip.world import world_record

    world = WorldConfig(image_size=32)
    per_part = rows // parts
    for part in range(parts):
        records = [world_record(world, "train", part * per_part + i) for i in range(per_part)]
        pq.write_table(records_to_table(records), directory / f"part-{part:05d}.parquet")


def _measure(variant: str, directory: Path, executions: int) -> dict[str, float]:
    import pyarrow.fs as pafs
    import ray.data

    from csclip.train.stream import read_units_parquet

    readers, cpu, started = _footer_readers(), _busy_cpu_seconds(), time.perf_counter()
    for _ in range(executions):
        if variant == "default":
            source = ray.data.read_parquet(str(directory), filesystem=pafs.LocalFileSystem())
        else:
            source = read_units_parquet(str(directory), pafs.LocalFileSystem())
        source.filter(lambda row: row["split"] == "train").count()
    return {"wall": time.perf_counter() - started, "cpu": _busy_cpu_seconds() - cpu,
            "actors": _footer_readers() - readers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=3)
    parser.add_argument("--rows", type=int, default=400)
    parser.add_argument("--executions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)

    import ray

    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    results: dict[str, list[dict[str, float]]] = {"default": [], "read_units_parquet": []}
    with tempfile.TemporaryDirectory() as tmp:
        _write_table(Path(tmp), args.parts, args.rows)
        _measure("read_units_parquet", Path(tmp), 1)  # warm: workers and imports
        for _ in range(args.repeats):
            for variant in results:
                results[variant].append(_measure(variant, Path(tmp), args.executions))
    ray.shutdown()

    def median(variant: str, key: str) -> float:
        return statistics.median(r[key] for r in results[variant])

    base_wall, base_cpu = median("default", "wall"), median("default", "cpu")
    lines = [
        HEADING, "",
        f"Command: `python benchmarks/bench_units_read.py --parts {args.parts} --rows {args.rows} "
        f"--executions {args.executions} --repeats {args.repeats} --num-cpus {args.num_cpus}` "
        f"({platform.machine()}, Python {platform.python_version()}, one local Ray instance "
        f"with {args.num_cpus} logical CPUs). A units table of {args.parts} part files "
        f"({args.rows} world rows) executed {args.executions} times per repeat, as a training "
        "run executes its source (data check, epochs, restarts); medians of the repeats, the "
        "variants interleaved. CPU: the whole machine's busy seconds over the executions.",
        "",
        "| reader | wall s | vs default | machine CPU s | vs default | FooterReader actors |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for variant in results:
        wall, cpu = median(variant, "wall"), median(variant, "cpu")
        lines.append(f"| {variant} | {wall:.1f} | {wall / base_wall:.2f}x | {cpu:.1f} | "
                     f"{cpu / base_cpu:.2f}x | {median(variant, 'actors'):.0f} |")
    lines += ["", "The default reader's actors list the files for predicate push-down (row-group "
              "statistics); the training source filters its split per row and has no predicate "
              "to push. Each actor is a worker process of its own (a Python interpreter "
              "importing Ray and pyarrow)."]
    publish(HEADING, "\n".join(lines), args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

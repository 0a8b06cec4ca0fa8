"""Ray Tune ablations in the layout of the paper's Tables 16-17.

    python tune/ablate.py --grid lr,units                       # paper values, default config
    python tune/ablate.py --config configs/coco.yaml --grid lr=1e-6,5e-6 units=1,2
    python tune/ablate.py --grid lr,units --full-grid           # cross product
    python tune/ablate.py --grid lr,units --address 127.0.0.1:6379   # on a running Ray head
    ray job submit --working-dir . -- python tune/ablate.py --config configs/coco.yaml --grid lr

Axes: lr units relfrac swapfrac wd bs (see docs/ablation.md). Rerunning the same command
resumes the sweep: finished trials are kept. The table, CSV and plot are written next to
the sweep and logged to the sweep's MLflow parent run. Without --address (or RAY_ADDRESS,
or inside `ray job submit`) the sweep starts a local Ray; with it the trials run on that
cluster, and the project directory is shipped to its workers (docs/cluster.md).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from csclip.config import add_config_arguments, config_from_args
from csclip.errors import CsclipError

PROJECT_ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, str(PROJECT_ROOT / "configs" / "default.yaml"))
    parser.add_argument("--grid", nargs="+", required=True, metavar="AXIS[=V1,V2]",
                        help="axes to vary: names (paper values) or name=v1,v2 (explicit)")
    parser.add_argument("--full-grid", action="store_true",
                        help="cross product of the axes (default: one axis at a time)")
    parser.add_argument("--address", default=None, metavar="HOST:PORT",
                        help="a running Ray cluster's address (its head's GCS port, e.g. "
                             "127.0.0.1:6379, or 'auto'); default: $RAY_ADDRESS, else a local Ray")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="trials at once (default: what the cluster holds at its largest: "
                             "the autoscaler's maximum on a `ray up` head, else the resources "
                             "present now)")
    parser.add_argument("--reevaluate", action="store_true",
                        help="evaluate finished trials' checkpoints again (no retraining)")
    parser.add_argument("--suite", default=None, metavar="NAMES",
                        help="real-data suites to evaluate every trial on (comma separated, "
                        "as pipelines/evaluate.py); with --reevaluate, no retraining")
    parser.add_argument("--data-root", default=None, metavar="PATH",
                        help="folder or s3:// prefix holding the --suite data")
    parser.add_argument("--results-doc", default=None, metavar="PATH",
                        help="also write the table into the ablation section of this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from csclip import train
    from csclip.ablation import grid as grids
    from csclip.ablation import report, sweep

    try:
        base = config_from_args(train.TrainConfig, args)
        grid = grids.expand_grid(base, grids.parse_grid(args.grid), full=args.full_grid)
        suites = None
        if args.suite:  # checked before Ray starts; the root made absolute for the trials
            from csclip.config import validate_config
            from csclip.eval.suites import SuitesConfig

            root = sweep.absolute_uri(args.data_root) if args.data_root else None
            suites = validate_config(SuitesConfig, {"names": args.suite, "data_root": root},
                                     origin="--suite/--data-root").model_dump(mode="json")
        max_concurrent = args.max_concurrent
        if init_ray(args.address) and max_concurrent is None:
            # A local Ray counts more logical CPUs than cores (see init_ray); how many
            # fine-tunes run at once follows the real cores.
            max_concurrent = sweep.max_concurrent_trials(
                {"CPU": os.cpu_count() or 1}, base.run.num_workers, base.run.use_gpu,
                base.run.cpus_per_worker)
        result = sweep.run_sweep(base, grid, max_concurrent=max_concurrent,
                                reevaluate=args.reevaluate, suites=suites)
        if args.results_doc:
            report.update_results_doc(args.results_doc, result, command=" ".join(
                ["python", "tune/ablate.py", *(argv if argv is not None else sys.argv[1:])]))
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(result.table.markdown())
    print(f"sweep {result.name}: {result.num_trials} trials in {result.seconds:.0f} s "
          f"({'resumed' if result.resumed else 'new'}); report in {result.report.markdown.parent}; "
          f"MLflow parent run {result.parent_run_id}")
    if result.errors:
        for key, error in result.errors.items():
            print(f"trial {key} failed: {error}", file=sys.stderr)
        print("rerun the same command to resume the failed trials", file=sys.stderr)
        return 1
    return 0


def init_ray(address: str | None = None) -> bool:
    """Join a cluster (`address`, else RAY_ADDRESS; inside `ray job submit` the job's own
    cluster) or start a local Ray; True when started locally. A driver that joins from
    outside a job ships the project directory to the cluster's workers (its .gitignore
    applies), so trials import this csclip, not whatever a node has installed."""
    import ray

    from csclip.cluster import ray_process

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        runtime_env = None
        if ray_process() is None:
            # .gitignore and .rayignore apply (no venv, runs or databases travel).
            runtime_env = {"working_dir": str(PROJECT_ROOT), "excludes": [".git"]}
        ray.init(address=address, runtime_env=runtime_env, configure_logging=False)
        return False
    # A Tune trial + a Train worker + a Data task deadlock with 2 logical CPUs on a 2-core
    # machine (RAY_NOTES.md); logical CPUs are only accounting, so count at least 4.
    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             configure_logging=False)
    return True


if __name__ == "__main__":
    sys.exit(main())

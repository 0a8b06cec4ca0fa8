"""Ray Tune ablations in the layout of the paper's Tables 16-17.

    python tune/ablate.py --grid lr,units                       # paper values, default config
    python tune/ablate.py --config configs/coco.yaml --grid lr=1e-6,5e-6 units=1,2
    python tune/ablate.py --grid lr,units --full-grid           # cross product

Axes: lr units relfrac swapfrac wd bs (see docs/ablation.md). Rerunning the same command
resumes the sweep: finished trials are kept. The table, CSV and plot are written next to
the sweep and logged to the sweep's MLflow parent run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from csclip.config import add_config_arguments, config_from_args
from csclip.errors import CsclipError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, "configs/default.yaml")
    parser.add_argument("--grid", nargs="+", required=True, metavar="AXIS[=V1,V2]",
                        help="axes to vary: names (paper values) or name=v1,v2 (explicit)")
    parser.add_argument("--full-grid", action="store_true",
                        help="cross product of the axes (default: one axis at a time)")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="trials at once (default: derived from the cluster)")
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
        if init_ray() and max_concurrent is None:
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


def init_ray() -> bool:
    """Join the cluster (RAY_ADDRESS) or start a local Ray; True when started locally."""
    import ray

    if ray.is_initialized():
        return False
    if os.environ.get("RAY_ADDRESS"):
        ray.init(configure_logging=False)
        return False
    # A Tune trial + a Train worker + a Data task deadlock with 2 logical CPUs on a 2-core
    # machine (RAY_NOTES.md); logical CPUs are only accounting, so count at least 4.
    ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False,
             configure_logging=False)
    return True


if __name__ == "__main__":
    sys.exit(main())

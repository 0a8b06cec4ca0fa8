"""`csclip ablate` / tune/ablate.py: Ray Tune ablations in the layout of the paper's
Tables 16-17."""

from __future__ import annotations

import argparse
import os
import sys

from csclip.ablation import grid as grids
from csclip.ablation.grid import AXES, paper_rows_help
from csclip.config import apply_overrides, read_yaml, refuse_given, validate_config
from csclip.config.eval import CHECKPOINT_SELECTIONS, SuitesConfig
from csclip.config.train import TrainConfig
from csclip.entry.common import (
    default_config_path,
    make_parser,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.entry.ray_init import init_ray, prepare_ray_env
from csclip.errors import ConfigError

DESCRIPTION = """\
Ray Tune ablations in the layout of the paper's Tables 16-17 (docs/ablation.md).

Each axis is varied around the base config (--config, --set and the shortcuts), one axis
at a time unless --full-grid. Rerunning the same command resumes the sweep: finished
trials are kept. The table, CSV and plot are written next to the sweep and logged to the
sweep's MLflow parent run. Without --address (or RAY_ADDRESS, or inside `ray job submit`)
the sweep starts a local Ray; with it the trials run on that cluster, and the project
directory is shipped to its workers (docs/cluster.md)."""

EXAMPLES = (
    "%(prog)s --grid lr,units                        # the paper's values, default config",
    "%(prog)s --config configs/coco.yaml --grid paper   # the rows the authors trained (below)",
)


def _axes_help() -> str:
    return ", ".join(f"{name} ({axis.field})" for name, axis in AXES.items())


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, f"{DESCRIPTION}\n\n{paper_rows_help()}", EXAMPLES,
                         default_config_path("default.yaml"))
    parser.add_argument("--grid", nargs="+", required=True, metavar="AXIS[=V1,V2]",
                        help="axes to vary: names (the paper's values) or name=v1,v2 "
                             f"(explicit). Axes: {_axes_help()}. Or `paper`: the rows the "
                             "authors trained (paper=<groups or row ids> selects some; "
                             "listed below)")
    parser.add_argument("--full-grid", action="store_true",
                        help="cross product of the axes (default: one axis at a time)")
    parser.add_argument("--address", default=None, metavar="HOST:PORT",
                        help="a running Ray cluster's address (its head's GCS port, e.g. "
                             "127.0.0.1:6379, or 'auto'); default: $RAY_ADDRESS, else a local Ray")
    parser.add_argument("--max-concurrent", type=int, default=None, metavar="N",
                        help="trials at once (default: what the cluster holds at its largest: "
                             "the autoscaler's maximum on a `ray up` head, else the resources "
                             "present now)")
    parser.add_argument("--reevaluate", action="store_true",
                        help="evaluate finished trials' checkpoints again (no retraining)")
    parser.add_argument("--suite", default=None, metavar="NAMES",
                        help="real-data suites to evaluate every trial on (comma separated, "
                             "as `csclip evaluate --suite`); with --reevaluate, no retraining")
    parser.add_argument("--data-root", default=None, metavar="PATH",
                        help="folder or s3:// prefix holding the --suite data")
    parser.add_argument("--select", choices=CHECKPOINT_SELECTIONS, default="final",
                        help="which checkpoint of each trial is evaluated: final (default) or "
                             "paper: as `csclip evaluate --select paper`, the kept step at "
                             "run.checkpoint_every with the highest mean I2T on the benchmarks "
                             "evaluated (the report says 'selected on the test benchmarks'), "
                             "half-truth from best/ when data.val_ratio kept one")
    parser.add_argument("--results-doc", default=None, metavar="PATH",
                        help="also write the table into the ablation section of this file")
    shortcuts = parser.add_argument_group("shortcuts for the base config (each sets one field)")
    shortcuts.add_argument("--method", choices=["clip", "negclip", "csclip"],
                           help="loss.method")
    shortcuts.add_argument("--max-steps", type=int, metavar="N",
                           help="steps per trial: optim.max_steps")
    shortcuts.add_argument("--units", metavar="URI", help="units table: data.units_uri")
    shortcuts.add_argument("--out", metavar="PATH",
                           help="where trials and the report go: run.storage_path")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    command = " ".join([prog or "csclip ablate", *argv])
    return run_guarded(lambda: _ablate(args, command),
                       kept="finished trials and their checkpoints are kept; rerun the same "
                            "command to resume the sweep")


# Fields of the base config the sweep sets itself, refused when given (not overwritten).
SET_BY_THE_SWEEP = {
    "run.name": "the sweep names each trial's run <sweep>-<setting> (so a restarted trial "
                "resumes its own run)",
    "tracking.enabled": "the sweep logs every trial to MLflow (its table is built from the "
                        "parent and child runs)",
}


def base_config(args: argparse.Namespace):
    """The sweep's base TrainConfig: --config, then the shortcuts, then --set; the fields
    the sweep sets itself (SET_BY_THE_SWEEP) refused in one line."""
    overrides = shortcut_overrides({
        "loss.method": args.method, "optim.max_steps": args.max_steps,
        "data.units_uri": args.units, "run.storage_path": args.out,
    }, args.overrides)
    data = apply_overrides(read_yaml(args.config), overrides)
    refuse_given(data, SET_BY_THE_SWEEP, accepted={"run.name": None, "tracking.enabled": True})
    return validate_config(TrainConfig, data, origin=str(args.config))


def _ablate(args: argparse.Namespace, command: str) -> int:
    base = base_config(args)
    if printed_config(args, base):
        return 0
    refuse_file_as_folder(base.run.storage_path, "--out (run.storage_path)")
    prepare_ray_env(args.address, num_cpus=max(4, os.cpu_count() or 1))  # before ray's import
    from csclip.ablation import sweep  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked

    if grids.is_paper_grid(args.grid):
        if args.full_grid:
            raise ConfigError("--full-grid: the authors' rows (--grid paper) are one-at-a-time; "
                              "drop --full-grid")
        grid = grids.expand_paper_grid(base, grids.parse_paper_grid(args.grid))
        for row in grid.rows:
            if row.unavailable:
                print(f"row {row.label} not run: {row.unavailable}", file=sys.stderr)
    else:
        grid = grids.expand_grid(base, grids.parse_grid(args.grid), full=args.full_grid)
    suites = None
    if args.suite:  # checked before Ray starts; the root made absolute for the trials
        root = sweep.absolute_uri(args.data_root) if args.data_root else None
        suites = validate_config(SuitesConfig, {"names": args.suite, "data_root": root},
                                 origin="--suite/--data-root").model_dump(mode="json")
    max_concurrent = args.max_concurrent
    # A Tune trial + a Train worker + a Data task deadlock with 2 logical CPUs on a 2-core
    # machine (RAY_NOTES.md); logical CPUs are only accounting, so count at least 4.
    if init_ray(args.address, num_cpus=max(4, os.cpu_count() or 1)) and max_concurrent is None:
        # How many fine-tunes run at once follows the real cores.
        max_concurrent = sweep.max_concurrent_trials(
            {"CPU": os.cpu_count() or 1}, base.run.num_workers, base.run.use_gpu,
            base.run.cpus_per_worker)
    if args.select == "paper":
        print(f"--select paper: each trial's kept checkpoints (run.num_to_keep="
              f"{base.run.num_to_keep}, one every run.checkpoint_every="
              f"{base.run.checkpoint_every} steps) are evaluated; the best by mean I2T is "
              "reported, selected on the test benchmarks, with the half-truth of best/ "
              "(held-out captions) when the run keeps one", file=sys.stderr)
    result = sweep.run_sweep(base, grid, max_concurrent=max_concurrent,
                             reevaluate=args.reevaluate, suites=suites, select=args.select)
    if args.results_doc:
        sweep.update_results_doc(args.results_doc, result, command=command)
    print(result.table.markdown())
    print(f"sweep {result.name}: {result.num_trials} trials in {result.seconds:.0f} s "
          f"({'resumed' if result.resumed else 'new'}); report in "
          f"{result.report_uri}; MLflow parent run {result.parent_run_id}")
    if result.errors:
        for key, error in result.errors.items():
            print(f"trial {key} failed: {error}", file=sys.stderr)
        print("rerun the same command to resume the failed trials", file=sys.stderr)
        return 1
    return 0

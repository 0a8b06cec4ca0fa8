"""`csclip report --paper RUN...` / pipelines/report.py: our evaluations and ablation sweeps
beside the paper's Tables 1, 6, 7, 16 and 17 (csclip.report.paper)."""

from __future__ import annotations

import argparse
import sys

from csclip.config import apply_overrides, read_yaml, validate_config
from csclip.config.report import ReportConfig
from csclip.entry.common import (
    make_parser,
    mlflow_line,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)

DESCRIPTION = """\
Put the output of the paper's walk-through beside the paper's tables (docs/paper_report.md):
Tables 1, 6 and 7 from `csclip evaluate` folders (one row per model, matched to the
paper's CLIP, CLIP-FT, NegCLIP, CS-CLIP, ... row by what it is: a checkpoint by its run's
loss.method, an open_clip tag, a weights file by its name; --label names it otherwise),
Tables 16 and 17 from `csclip ablate` reports (ablation.csv; rows matched to the
authors' by axis and value). Each cell: ours / paper / ours - paper, as markdown, CSV
and a PNG per table, all logged to one MLflow run. The paper's numbers are the
authors' own outputs (kargibora/CS-CLIP@16276c7), each with its source file."""

EXAMPLES = (
    "%(prog)s --paper runs/eval/clip runs/eval/csclip-paper runs/train/tune/<sweep>-report "
    "--out runs/paper",
    "%(prog)s --paper runs/eval/mine --label runs/eval/mine=CS-CLIP --out runs/paper "
    "--no-tracking",
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, None)
    parser.add_argument("--paper", nargs="+", required=True, metavar="RUN",
                        help="--out folders of `csclip evaluate` (finished: .evaluation_complete) "
                             "and `csclip ablate` reports (holding ablation.csv)")
    parser.add_argument("--label", action="append", default=[], metavar="RUN=NAME",
                        help="the paper row a RUN (or a model's label in it) is, when it "
                             "cannot be told (CLIP, CLIP-FT, NegCLIP, CS-CLIP, ...; any "
                             "other name: ours alone); repeatable")
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--out", metavar="DIR",
                           help="where the tables go: out_dir (default runs/paper-report)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    return run_guarded(lambda: _report(args),
                       kept="rerun the same command to build the report again")


def report_config(args: argparse.Namespace):
    """The ReportConfig of the parsed flags: --config, then --out, then --set."""
    origin = str(args.config) if args.config else "csclip report"
    data = apply_overrides(read_yaml(args.config) if args.config else {},
                           shortcut_overrides({"out_dir": args.out}, args.overrides))
    return validate_config(ReportConfig, data, origin=origin)


def _report(args: argparse.Namespace) -> int:
    config = report_config(args)
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.out_dir, "--out (out_dir)")
    from csclip.report.paper import parse_labels, run_report  # noqa: PLC0415  the report reads checkpoints with torch; loaded once the config is checked

    report = run_report(config, args.paper, parse_labels(args.label))
    print(report.markdown)
    print(f"tables {', '.join(report.comparisons)} written to {config.out_dir}")
    if report.mlflow_run_id:
        print(mlflow_line(report.mlflow_run_id, config.tracking))
    return 0

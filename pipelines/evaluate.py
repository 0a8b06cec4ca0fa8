"""Evaluate a CLIP model on the half-truth benchmark (SPEC §4).

    python pipelines/evaluate.py --model ViT-B-32 --pretrained openai --units s3://bucket/units
    python pipelines/evaluate.py --checkpoint runs/demo/checkpoint --out runs/eval
    python pipelines/evaluate.py --model csclip-tiny --set data.world.num_val=50
    python pipelines/evaluate.py --model ViT-B-32 --pretrained openai \
        --suite aro,sugarcrepe,winoground,coco_retrieval,zeroshot --data-root s3://bucket/bench

Without --units the synthetic world's validation split is generated on the fly. Writes
table1/6/7, image_side, suites (retrieval, compositional, zero-shot) and, with --suite,
benchmarks and capabilities as .md/.csv, figure3.png and
benchmark.parquet to --out, prints the tables, and logs them to MLflow (tracking.uri;
`--set tracking.enabled=false` to skip).
"""

from __future__ import annotations

import argparse
import logging
import sys

from csclip.config import add_config_arguments, load_config
from csclip.errors import CsclipError
from csclip.eval.pipeline import EvalConfig, run_evaluation


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(parser, default_config=None)
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model", help="open_clip model name (e.g. ViT-B-32, csclip-tiny)")
    source.add_argument("--checkpoint", help="a csclip checkpoint directory")
    parser.add_argument(
        "--pretrained", help="open_clip pretrained tag or weights file (with --model)"
    )
    parser.add_argument("--units", help="units table URI (default: synthetic world val split)")
    parser.add_argument("--out", help="output directory for tables and figure")
    parser.add_argument("--sugarcrepe", help="SugarCrepe JSON folder (also runs SugarCrepe)")
    parser.add_argument("--coco-images", help="COCO val2017 image folder for --sugarcrepe")
    parser.add_argument("--suite", help="real-data suites, comma separated (aro, winoground, "
                        "sugarcrepe, ..., coco_retrieval, zeroshot; docs/evaluation.md)")
    parser.add_argument("--data-root", help="folder (or s3:// prefix) with one sub-folder per "
                        "suite in its published layout")
    return parser.parse_args(argv)


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own."""
    flags = {
        "model.name": args.model,
        "model.pretrained": args.pretrained,
        "checkpoint": args.checkpoint,
        "data.units_uri": args.units,
        "out_dir": args.out,
        "suites.sugarcrepe_dir": args.sugarcrepe,
        "suites.coco_images": args.coco_images,
        "suites.names": args.suite,
        "suites.data_root": args.data_root,
    }
    # Quote values so YAML keeps tags like "openai" or paths with colons as strings.
    shortcuts = [f"{key}='{value}'" for key, value in flags.items() if value is not None]
    return shortcuts + list(args.overrides)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        config = load_config(EvalConfig, args.config, overrides_from_args(args))
        report = run_evaluation(config)
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.markdown)
    print(f"tables and figure written to {config.out_dir}")
    if report.mlflow_run_id:
        print(f"MLflow run {report.mlflow_run_id} in experiment {config.tracking.experiment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

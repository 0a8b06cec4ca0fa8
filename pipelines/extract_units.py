"""Extract units and foils from captions into a sharded units table (issue 5).

    python pipelines/extract_units.py                      # synthetic world, gold units
    python pipelines/extract_units.py --backend authors --input 'units/*.json' --out runs/authors
    python pipelines/extract_units.py --set backend.name=rules --set input.format=sugarcrepe \
        --set input.uri=../shared/data/sugarcrepe --set output.uri=runs/sugarcrepe
    ray job submit --working-dir . -- python pipelines/extract_units.py \
        --set input.format=karpathy --set input.uri=s3://bucket/dataset_coco.json \
        --set backend.name=vllm --set backend.vllm.num_engines=8 --set output.uri=s3://bucket/units

A rerun with the same config skips finished shards. Prints the accounting (read = with
units + rejected, by reason) and logs it to MLflow (`--set tracking.uri=null` to skip).
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import get_args

from csclip.config import add_config_arguments, config_from_args
from csclip.errors import CsclipError
from csclip.extract.backends import BackendName
from csclip.extract.pipeline import ExtractConfig, run_extraction


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(parser, default_config=None)
    parser.add_argument("--backend", choices=get_args(BackendName),
                        help="shortcut for --set backend.name=...")
    parser.add_argument("--input", metavar="PATH_OR_GLOB", help="shortcut for --set input.uri=...")
    parser.add_argument("--out", metavar="DIR", help="shortcut for --set output.uri=...")
    args = parser.parse_args(argv)
    # Quoted, so a glob like '*.json' is read as text, not as a YAML alias.
    shortcuts = [f"{key}='{value.replace(chr(39), chr(39) * 2)}'" for key, value in (
        ("backend.name", args.backend), ("input.uri", args.input), ("output.uri", args.out))
        if value is not None]
    args.overrides = shortcuts + args.overrides
    try:
        config = config_from_args(ExtractConfig, args)
        summary = run_extraction(config)
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary.format())
    if summary.mlflow_run_id:
        print(f"MLflow run {summary.mlflow_run_id} at {config.tracking.uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Extract units and foils from captions into a sharded units table (issue 5).

    python pipelines/extract_units.py                      # synthetic world, gold units
    python pipelines/extract_units.py --set backend.name=rules --set input.format=sugarcrepe \
        --set input.uri=../shared/data/sugarcrepe --set output.uri=runs/sugarcrepe
    ray job submit --working-dir . -- python pipelines/extract_units.py \
        --set input.format=karpathy --set input.uri=s3://bucket/dataset_coco.json \
        --set backend.name=vllm --set backend.vllm.num_engines=8 --set output.uri=s3://bucket/units

A rerun with the same config skips finished shards. Prints the accounting (read = with
units + rejected, by reason) and logs it to MLflow (tracking.uri, else $MLFLOW_TRACKING_URI;
`--set tracking.enabled=false` to skip).
"""

from __future__ import annotations

import argparse
import logging
import sys

from csclip.config import add_config_arguments, config_from_args
from csclip.errors import CsclipError
from csclip.extract.pipeline import ExtractConfig, run_extraction


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_config_arguments(parser, default_config=None)
    args = parser.parse_args(argv)
    try:
        config = config_from_args(ExtractConfig, args)
        summary = run_extraction(config)
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(summary.format())
    if summary.mlflow_run_id:
        print(f"MLflow run {summary.mlflow_run_id} in experiment {config.tracking.experiment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

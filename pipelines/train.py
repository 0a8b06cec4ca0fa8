"""Fine-tune a CLIP model on Ray Train: CS-CLIP, or the CLIP / NegCLIP baselines.

    python pipelines/train.py                                  # the demo (synthetic world, CPU)
    python pipelines/train.py --config configs/default.yaml --method clip
    python pipelines/train.py --config configs/coco.yaml --set optim.lr=1e-5
    python pipelines/train.py --demo --set pretrain.optim.max_steps=300   # demo overrides

Rerunning the same command resumes from the last checkpoint (the run name is a hash of
the resolved config); a finished run is not trained again.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from csclip.config import add_config_arguments, apply_overrides, read_yaml, validate_config
from csclip.errors import CsclipError

DEFAULT_CONFIG = str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arguments(parser, DEFAULT_CONFIG)
    parser.add_argument("--method", choices=["clip", "negclip", "csclip"],
                        help="objective; shortcut for --set loss.method=...")
    parser.add_argument("--demo", action="store_true",
                        help="run the demo (the default without arguments); --set paths are "
                             "then relative to csclip.demo.DemoConfig (train.*, pretrain.*)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("csclip").setLevel(logging.INFO)
    try:
        if args.demo or not argv:
            return run_demo(args)
        from csclip.train import TrainConfig, run

        overrides = args.overrides + ([f"loss.method={args.method}"] if args.method else [])
        data = apply_overrides(read_yaml(args.config), overrides)
        config = validate_config(TrainConfig, data, origin=args.config)
        result = run(config)
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"run {result.run_name}: final checkpoint {result.checkpoint_uri}")
    print(f"MLflow run {result.mlflow_run_id}; step {result.metrics.get('step')}, "
          f"loss {result.metrics.get('loss')}")
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from csclip.demo import DemoConfig, run_demo

    # The demo fine-tunes with both methods, so --method does not apply to it.
    data = apply_overrides({"train": read_yaml(args.config)}, args.overrides)
    command = " ".join(["python pipelines/train.py", *sys.argv[1:]]).strip()
    result = run_demo(validate_config(DemoConfig, data, origin=f"demo with {args.config}"),
                      command=command)
    print(result.markdown)
    print(f"demo finished in {result.seconds:.0f} s; tables and figures in {result.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`csclip train` / pipelines/train.py: fine-tune on Ray Train (CS-CLIP, CLIP or NegCLIP)."""

from __future__ import annotations

import argparse
import logging
import sys

from csclip.config import load_config
from csclip.config.train import TrainConfig
from csclip.entry.common import (
    add_address_argument,
    announce,
    default_config_path,
    make_parser,
    mlflow_line,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.entry.ray_init import init_ray, prepare_ray_env
from csclip.pretrained import resolve_tag_weights
from csclip.train.console import start_line

DESCRIPTION = """\
Fine-tune a CLIP model on Ray Train: CS-CLIP, or the CLIP / NegCLIP baselines.

Without arguments it runs the demo (csclip demo). Rerunning the same command resumes from
the last checkpoint (the run name is a hash of the resolved config); a finished run is
not trained again. Fields not given take configs/default.yaml's values, then
csclip.config.train.TrainConfig's defaults (docs/training.md)."""

KEPT = ("the checkpoints saved so far are kept; rerun the same command to resume from "
        "the last one")

EXAMPLES = (
    "%(prog)s --method clip --max-steps 200        # CLIP-FT on the synthetic world",
    "%(prog)s --config configs/laion.yaml --shards 's3://bucket/laion/{00000..41407}.tar' "
    "--units s3://bucket/laion-units --out s3://bucket/runs",
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, default_config_path("default.yaml"))
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--method", choices=["clip", "negclip", "csclip"],
                           help="objective: loss.method")
    shortcuts.add_argument("--model", metavar="NAME",
                           help="open_clip model name (csclip-tiny, ViT-B-32, ...): model.name")
    shortcuts.add_argument("--pretrained", metavar="TAG|FILE|DIR",
                           help="weights to start from (openai, a state-dict file, a csclip "
                                "checkpoint directory): model.pretrained")
    shortcuts.add_argument("--units", metavar="URI",
                           help="units table (Parquet, local or s3://) to train on instead of "
                                "the synthetic world: data.units_uri (with --shards: the "
                                "output of csclip extract --format webdataset over them)")
    shortcuts.add_argument("--image-root", metavar="DIR|URI",
                           help="folder of the units table's relative image paths: "
                                "data.image_root")
    shortcuts.add_argument("--shards", metavar="PATTERN",
                           help="webdataset shards to train on, a brace pattern, local or "
                                "s3:// ('DIR/{00000..00099}.tar'): data.shards")
    shortcuts.add_argument("--out", metavar="PATH",
                           help="where runs and checkpoints go (local or s3://): run.storage_path")
    shortcuts.add_argument("--max-steps", type=int, metavar="N", help="optim.max_steps")
    shortcuts.add_argument("--lr", type=float, help="optim.lr")
    shortcuts.add_argument("--batch-size", type=int, metavar="N",
                           help="per-worker batch: data.batch_size")
    shortcuts.add_argument("--workers", type=int, metavar="N", help="run.num_workers")
    shortcuts.add_argument("--gpu", action="store_true", default=None,
                           help="one GPU per worker: run.use_gpu=true")
    shortcuts.add_argument("--name", help="run name instead of the config hash: run.name")
    add_address_argument(parser)
    parser.add_argument("--demo", action="store_true",
                        help="run the demo (the default without arguments); the other flags "
                             "are then csclip demo's")
    return parser


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own."""
    return shortcut_overrides({
        "loss.method": args.method, "model.name": args.model,
        "model.pretrained": args.pretrained, "data.units_uri": args.units,
        "data.shards": args.shards, "data.image_root": args.image_root,
        "run.storage_path": args.out, "optim.max_steps": args.max_steps, "optim.lr": args.lr,
        "data.batch_size": args.batch_size, "run.num_workers": args.workers,
        "run.use_gpu": args.gpu, "run.name": args.name,
    }, args.overrides)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or "--demo" in argv:
        from csclip.entry import demo  # noqa: PLC0415  the demo's entry is the other command behind this one

        # The demo's parser takes the rest; its usage names the command as typed.
        typed = f"{prog} --demo" if prog and argv else prog
        return demo.main([a for a in argv if a != "--demo"], prog=typed)
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    return run_guarded(lambda: _train(args), kept=KEPT)


def _train(args: argparse.Namespace) -> int:
    # The whole config is checked before csclip.train.loop (and torch) is imported.
    config = load_config(TrainConfig, args.config, overrides_from_args(args))
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.run.storage_path, "--out (run.storage_path)")
    steps = (f"{config.optim.max_steps} steps" if config.optim.max_steps
             else f"{config.optim.epochs} epochs")
    announce("train", f"{config.loss.method} on {config.model.name}, {steps}, runs under "
             f"{config.run.storage_path}", "torch and Ray (a finished run is answered "
             "without starting Ray)")
    prepare_ray_env(args.address)  # before the training imports ray
    from csclip.train import finished_result, run, run_name  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked

    result = finished_result(config)  # a finished run is answered without Ray
    if result is None:
        # What is being trained, before Ray, the data plan and the workers take their minutes.
        logging.getLogger("csclip.train").info(start_line(config, run_name(config)))
        # A pretrained tag neither cached nor downloadable: one line before Ray starts.
        resolve_tag_weights(config.model.name, config.model.pretrained)
        init_ray(args.address)
        result = run(config)
    print(f"run {result.run_name}: final checkpoint {result.checkpoint_uri}")
    print(f"step {result.metrics.get('step')}, loss {result.metrics.get('loss')}")
    if result.mlflow_run_id:
        print(mlflow_line(result.mlflow_run_id, config.tracking))
    return 0

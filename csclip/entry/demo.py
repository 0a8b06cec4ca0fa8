"""`csclip demo` / `python pipelines/train.py` without arguments: the embedded default."""

from __future__ import annotations

import argparse
import sys

from csclip.config import apply_overrides, read_yaml, validate_config
from csclip.config.demo import DemoConfig
from csclip.entry.common import (
    add_address_argument,
    default_config_path,
    make_parser,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.entry.ray_init import init_ray, prepare_ray_env

DESCRIPTION = """\
The demo, on CPU in about 12 minutes: generate the synthetic world, pretrain a small CLIP
on it (cached after the first run: it stands in for zero-shot CLIP), fine-tune it with
CLIP-FT and with CS-CLIP on the same budget, and compare the three on the half-truth
benchmark. Prints a table per stage and the results; writes them under runs/demo/ (--out),
logs every run to MLflow. `--publish` copies the last demo's results and stage timings
from there into docs/results.md and docs/performance.md (and trains nothing).

--config is the fine-tuning YAML, or a whole demo YAML with `train:` and its deltas
(`pretrain:`, ...; configs/world_gpu.yaml); --set paths are those of csclip.config.demo.DemoConfig:
train.* (the fine-tuning config), and the demo's deltas on top of it, each a partial
training config: pretrain.*, warm_start.* (ours: the layout warm start, loss.method
layout; null: none) and finetune.* (both fine-tunings; ours: model.lock.image, CS-CLIP's
loss.image_foil_weight), eval_seed, out_dir."""

# Top-level keys that make --config a demo YAML rather than a fine-tuning config.
DEMO_SECTIONS = {"train", "pretrain", "warm_start", "finetune"}

KEPT = ("the checkpoints of the finished stages are kept; rerun the same command to resume "
        "from them")

EXAMPLES = (
    "%(prog)s",
    "%(prog)s --publish   # the last demo's tables into docs/results.md, docs/performance.md",
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, default_config_path("default.yaml"),
                         tracking_field="train.tracking.enabled")
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--max-steps", type=int, metavar="N",
                           help="fine-tuning steps of CLIP-FT and CS-CLIP: train.optim.max_steps")
    shortcuts.add_argument("--pretrain-steps", type=int, metavar="N",
                           help="pretraining steps: pretrain.optim.max_steps")
    shortcuts.add_argument("--layout-steps", type=int, metavar="N",
                           help="the image tower's layout warm start before pretraining "
                                "(ours): warm_start.optim.max_steps; 0: no warm start "
                                "(warm_start=null, and no tower locked: "
                                "pretrain.model.lock.image=false, finetune.model.lock.image=false)")
    shortcuts.add_argument("--out", metavar="DIR", help="tables and figures: out_dir")
    parser.add_argument("--publish", action="store_true",
                        help="train nothing: copy the results and stage timings of the demo "
                             "in out_dir into docs/results.md and docs/performance.md")
    add_address_argument(parser)
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    command = " ".join([prog or "csclip demo", *argv])
    return run_guarded(lambda: _demo(args, command), kept=KEPT)


def demo_config(args: argparse.Namespace):
    """The DemoConfig of the parsed flags: --config (a fine-tuning YAML, or a demo YAML
    with DemoConfig's sections), then the shortcuts, then --set."""
    no_warm_start = args.layout_steps == 0
    overrides = shortcut_overrides({
        "train.optim.max_steps": args.max_steps, "pretrain.optim.max_steps": args.pretrain_steps,
        "warm_start.optim.max_steps": None if no_warm_start else args.layout_steps,
        "out_dir": args.out,
    }, (["warm_start=null", "pretrain.model.lock.image=false", "finetune.model.lock.image=false"]
        if no_warm_start else []) + list(args.overrides))
    loaded = read_yaml(args.config)
    data = apply_overrides(loaded if DEMO_SECTIONS & set(loaded) else {"train": loaded},
                           overrides)
    origin = f"demo with {args.config}"
    return validate_config(DemoConfig, data, origin=origin)


def _demo(args: argparse.Namespace, command: str) -> int:
    config = demo_config(args)  # before csclip.demo (and torch) is imported
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.out_dir, "--out (out_dir)")
    prepare_ray_env(args.address)  # before the demo imports ray
    from csclip.demo import demo_summary, publish, run_demo  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked

    if args.publish:
        for path in publish(config.out_dir):
            print(f"published: {path}")
        return 0
    result = run_demo(config, command=command, start_ray=lambda: init_ray(args.address))
    print(demo_summary(result))
    return 0

"""`csclip extract` / pipelines/extract_units.py: units and foils from captions."""

from __future__ import annotations

import argparse
import sys
import typing

from csclip.config import load_config
from csclip.config.extract import BackendName, ExtractConfig, InputFormat
from csclip.entry.common import (
    add_address_argument,
    announce,
    make_parser,
    mlflow_line,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.entry.ray_init import init_ray, prepare_ray_env
from csclip.extract.prompt_sets import PROMPT_SET_NAMES

DESCRIPTION = """\
Extract units and foils from captions into a sharded units table (docs/extraction.md).

Backends: vllm (an LLM on GPU actors, the paper's method), rules (a parser on CPU), gold
(the synthetic world's own units), authors (the authors' released unit files), replay (the
raw answers a vllm run stored, no LLM). Prompt sets of vllm and replay: csclip (ours, one
call per caption) or authors (the authors' three calls, as they ran them): `--backend vllm
--prompts authors --out-format authors` also writes the authors' unit format; every raw
answer lands in answers/, and `--backend replay --answers OUT/answers` re-derives the units
from them. `--format webdataset --input 'DIR/{000..009}.tar'` reads the captions of
webdataset shards (local or s3://) and writes units per input shard. A rerun with the same
config skips finished shards. Prints the accounting (read = with units +
rejected, by reason) and logs it to MLflow (`--no-tracking` to skip). Fields:
csclip.config.extract.ExtractConfig."""

KEPT = ("the finished shards in --out are kept; rerun the same command to resume (they are "
        "not extracted again)")

EXAMPLES = (
    "%(prog)s --backend rules --format sugarcrepe --input sugarcrepe/data "
    "--out runs/sugarcrepe",
    "%(prog)s --backend authors --input 'units/*.json' --out runs/authors",
)

def _backends() -> tuple[str, ...]:
    return typing.get_args(BackendName)


def _prompt_sets() -> tuple[str, ...]:
    return PROMPT_SET_NAMES


def _input_formats() -> tuple[str, ...]:
    return typing.get_args(InputFormat)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, default_config=None)
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--backend", choices=_backends(), help="backend.name")
    shortcuts.add_argument("--input", metavar="URI",
                           help="captions file, folder or glob (local or s3://): input.uri; "
                                "its format follows its name (.txt: a caption a line, .csv / "
                                ".tsv, .jsonl, .json: Karpathy, COCO or SugarCrepe) unless "
                                "--format says; with --format webdataset a shard pattern, "
                                "'DIR/{000..009}.tar' (units per input shard)")
    shortcuts.add_argument("--out", metavar="URI",
                           help="output folder for units/ and rejects/ (local or s3://): "
                                "output.uri")
    shortcuts.add_argument("--format", choices=_input_formats(),
                           help="input.format (default: from --input's name; without "
                                "--input, the synthetic world)")
    shortcuts.add_argument("--csv-img-key", metavar="COLUMN",
                           help="csv: the image path column (default filepath, as "
                                "open_clip_train): input.csv_img_key")
    shortcuts.add_argument("--csv-caption-key", metavar="COLUMN",
                           help="csv: the caption column (default title): input.csv_caption_key")
    shortcuts.add_argument("--csv-separator", metavar="CHAR",
                           help="csv: the cell separator (default a tab, as open_clip_train, "
                                "whatever the suffix): input.csv_separator")
    shortcuts.add_argument("--limit", type=int, metavar="N",
                           help="the first N captions by sample_id: input.limit")
    shortcuts.add_argument("--prompts", choices=_prompt_sets(),
                           help="the LLM's prompt set (default csclip): backend.prompts")
    shortcuts.add_argument("--answers", metavar="URI",
                           help="replay: a run's answers/ folder or .jsonl: backend.answers")
    shortcuts.add_argument("--dump-prompts", metavar="FILE",
                           help="write every request as JSON Lines: output.dump_prompts")
    shortcuts.add_argument("--out-format", choices=("units", "authors"),
                           help="authors: also the authors' unit format: output.format")
    add_address_argument(parser)
    return parser


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own."""
    return shortcut_overrides({
        "backend.name": args.backend, "input.uri": args.input, "output.uri": args.out,
        "input.format": args.format, "input.limit": args.limit,
        "backend.prompts": args.prompts, "backend.answers": args.answers,
        "output.dump_prompts": args.dump_prompts, "output.format": args.out_format,
        "input.csv_img_key": args.csv_img_key, "input.csv_caption_key": args.csv_caption_key,
        "input.csv_separator": args.csv_separator,
    }, args.overrides)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_guarded(lambda: _extract(args), kept=KEPT)


def _extract(args: argparse.Namespace) -> int:
    config = load_config(ExtractConfig, args.config, overrides_from_args(args))
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.output.uri, "--out (output.uri)")
    source = "the synthetic world" if config.input.is_world else config.input.uri
    announce("extract", f"backend {config.backend.name} on {source} into {config.output.uri}",
             "Ray")
    prepare_ray_env(args.address)  # before the pipeline imports ray
    from csclip.extract.pipeline import read_input, run_extraction, with_input_format  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked
    from csclip.extract.shards import run_shard_extraction, shard_uris  # noqa: PLC0415  as above

    config = with_input_format(config)  # --input's format, from its name or content
    if config.input.format == "webdataset":
        shard_uris(config.input)  # a bad pattern or a missing shard fails before Ray starts
        init_ray(args.address)
        summary = run_shard_extraction(config)
    else:
        captions = read_input(config)  # a bad input file fails here, before Ray starts
        init_ray(args.address)
        summary = run_extraction(config, captions=captions)
    print(summary.format())
    if summary.mlflow_run_id:
        print(mlflow_line(summary.mlflow_run_id, config.tracking))
    return 0

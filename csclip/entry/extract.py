"""`csclip extract` / pipelines/extract_units.py: units and foils from captions."""

from __future__ import annotations

import argparse
import sys
import typing

from csclip.entry.common import (
    add_address_argument,
    make_parser,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)

DESCRIPTION = """\
Extract units and foils from captions into a sharded units table (docs/extraction.md).

Backends: vllm (an LLM on GPU actors, the paper's method), rules (a parser on CPU), gold
(the synthetic world's own units), authors (the authors' released unit files). A rerun
with the same config skips finished shards. Prints the accounting (read = with units +
rejected, by reason) and logs it to MLflow (`--set tracking.uri=null` to skip). Fields:
csclip.extract.pipeline.ExtractConfig."""

EXAMPLES = (
    "%(prog)s --backend rules --format sugarcrepe --input ../shared/data/sugarcrepe "
    "--out runs/sugarcrepe",
    "%(prog)s --backend authors --input 'units/*.json' --out runs/authors",
)

def _backends() -> tuple[str, ...]:
    from csclip.extract.backends import BackendName

    return typing.get_args(BackendName)


def _input_formats() -> tuple[str, ...]:
    from csclip.extract.captions import InputFormat

    return typing.get_args(InputFormat)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, default_config=None)
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--backend", choices=_backends(), help="backend.name")
    shortcuts.add_argument("--input", metavar="URI",
                           help="captions file, folder or glob (local or s3://): input.uri")
    shortcuts.add_argument("--out", metavar="URI",
                           help="output folder for units/ and rejects/ (local or s3://): "
                                "output.uri")
    shortcuts.add_argument("--format", choices=_input_formats(), help="input.format")
    shortcuts.add_argument("--limit", type=int, metavar="N",
                           help="the first N captions by sample_id: input.limit")
    add_address_argument(parser)
    return parser


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own."""
    return shortcut_overrides({
        "backend.name": args.backend, "input.uri": args.input, "output.uri": args.out,
        "input.format": args.format, "input.limit": args.limit,
    }, args.overrides)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_guarded(lambda: _extract(args))


def _extract(args: argparse.Namespace) -> int:
    from csclip.config import load_config
    from csclip.entry.ray_init import init_ray
    from csclip.extract.pipeline import ExtractConfig, run_extraction

    config = load_config(ExtractConfig, args.config, overrides_from_args(args))
    init_ray(args.address)
    summary = run_extraction(config)
    print(summary.format())
    if summary.mlflow_run_id:
        print(f"MLflow run {summary.mlflow_run_id} at {config.tracking.uri}")
    return 0

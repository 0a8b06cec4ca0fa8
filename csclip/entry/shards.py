"""`csclip shards` / pipelines/shards.py: any captions input written as webdataset shards."""

from __future__ import annotations

import argparse
import sys
import typing

from csclip.config import add_config_arguments, load_config, validate_config
from csclip.config.extract import InputFormat
from csclip.config.model import ModelSource
from csclip.config.shards import ShardEncoding, ShardsConfig
from csclip.entry.common import (
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.extract.captions import caption_table, resolve_format
from csclip.preprocess import image_pixels
from csclip.shards.write import PixelEncoding, write_shards
from csclip.train.stream import image_shape, preprocess_key

DESCRIPTION = """\
Write captions and their images as webdataset shards, as img2dataset lays them out:
OUT/00000.tar, 00001.tar, ... whose samples are {key}.jpg|png|webp (or {key}.pixels.npy),
{key}.txt and {key}.json, beside each shard its {stem}_stats.json, and shards.json
(written last: the shards, their counts and the settings). Every input `csclip extract`
reads works (Karpathy, COCO, SugarCrepe, CSV/TSV, JSONL, the synthetic world). The samples
are permuted once by --seed before they are cut into shards; each image is decoded once,
and one that is missing, outside --image-root or undecodable is a row of rejects.parquet
with its reason. A rerun into a finished folder with the same settings does nothing.
Fields: csclip.config.shards.ShardsConfig; docs/data_formats.md, "Webdataset shards"."""

EXAMPLES = (
    "%(prog)s --input dataset_coco.json --image-root /data/coco --split train "
    "--out s3://bucket/coco-train",
    "%(prog)s --format world --encoding pixels --model csclip-tiny --out runs/world-shards",
)

KEPT = ("the shards written so far are kept but the folder is unfinished (no shards.json); "
        "rerun the same command to write it")


def _input_formats() -> tuple[str, ...]:
    # Shards as input are shards already (config: ShardsConfig refuses them).
    return tuple(f for f in typing.get_args(InputFormat) if f != "webdataset")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {example}" for example in EXAMPLES)
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, None)
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    shortcuts.add_argument("--input", metavar="URI",
                           help="captions file or folder (local or s3://): input.uri; without "
                                "it, the synthetic world")
    shortcuts.add_argument("--format", choices=_input_formats(),
                           help="input.format (default: from --input's name)")
    shortcuts.add_argument("--image-root", metavar="DIR|URI",
                           help="joined to the relative image paths; images outside it are "
                                "rejected: input.image_root")
    shortcuts.add_argument("--split", metavar="NAME",
                           help="keep only this split (e.g. train): input.splits")
    shortcuts.add_argument("--limit", type=int, metavar="N",
                           help="the first N captions by sample_id: input.limit")
    shortcuts.add_argument("--csv-img-key", metavar="COLUMN", help="input.csv_img_key")
    shortcuts.add_argument("--csv-caption-key", metavar="COLUMN", help="input.csv_caption_key")
    shortcuts.add_argument("--csv-separator", metavar="CHAR", help="input.csv_separator")
    shortcuts.add_argument("--out", metavar="DIR|URI",
                           help="the shards' folder (local or s3://): output.uri")
    shortcuts.add_argument("--samples-per-shard", type=int, metavar="N",
                           help="captions per shard, rejected ones included (default 1000): "
                                "output.samples_per_shard")
    shortcuts.add_argument("--seed", type=int, metavar="N",
                           help="seed of the samples' one permutation (default 0): output.seed")
    shortcuts.add_argument("--encoding", choices=typing.get_args(ShardEncoding),
                           help="jpeg (default: re-encoded, quality 95), original (the file's "
                                "bytes), pixels (the model's (3, H, W) uint8 pixels as .npy): "
                                "output.encoding")
    shortcuts.add_argument("--model", metavar="NAME",
                           help="--encoding pixels: the open_clip model whose preprocessing "
                                "makes the pixels: model.name")
    return parser


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own."""
    return shortcut_overrides({
        "input.uri": args.input, "input.format": args.format,
        "input.image_root": args.image_root, "input.limit": args.limit,
        # a list, written as Python's repr: a YAML list of one quoted string
        "input.splits": None if args.split is None else [args.split],
        "input.csv_img_key": args.csv_img_key, "input.csv_caption_key": args.csv_caption_key,
        "input.csv_separator": args.csv_separator, "output.uri": args.out,
        "output.samples_per_shard": args.samples_per_shard, "output.seed": args.seed,
        "output.encoding": args.encoding, "model.name": args.model,
    }, args.overrides)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_guarded(lambda: _shards(args), kept=KEPT)


def _shards(args: argparse.Namespace) -> int:
    config = load_config(ShardsConfig, args.config, overrides_from_args(args))
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.output.uri, "--out (output.uri)")
    # Checked again with the input's format decided from its name or content.
    config = validate_config(ShardsConfig, config.model_copy(
        update={"input": resolve_format(config.input)}).model_dump(mode="json"))
    rows = caption_table(config.input).to_pylist()  # a bad input fails here, before any write
    pixels = pixel_encoding(config.model) if config.output.encoding == "pixels" else None
    summary = write_shards(rows, config.output, image_root=config.input.image_root,
                           image_endpoint_url=config.input.endpoint_url, pixels=pixels,
                           config=config)
    print(summary.format())
    return 0


def pixel_encoding(model: ModelSource) -> PixelEncoding:
    """The eval transform's uint8 pixels of `model` (as training's shards of pixels store
    them: csclip.train.stream.decode_batch with pixels)."""
    from csclip.model import spec_from_config  # noqa: PLC0415  builds the model (torch, open_clip); only encoding pixels needs it

    preprocess_cfg = spec_from_config(model).preprocess_cfg
    return PixelEncoding(model=model.name, shape=image_shape(preprocess_cfg),
                         preprocess=preprocess_cfg,
                         transform=image_pixels(preprocess_key(preprocess_cfg)))

"""`csclip evaluate` / pipelines/evaluate.py: a model on the half-truth benchmark (SPEC §4)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import pyarrow.fs as pafs

from csclip.config import apply_overrides, read_yaml, refuse_given, validate_config
from csclip.config.eval import CHECKPOINT_SELECTIONS, EvalConfig
from csclip.config.model import ModelSource
from csclip.entry.common import (
    announce,
    make_parser,
    mlflow_line,
    printed_config,
    refuse_file_as_folder,
    run_guarded,
    setup_logging,
    shortcut_overrides,
)
from csclip.errors import ConfigError, DataError
from csclip.ownership import output_lease
from csclip.storage import filesystem_for, resolve_output

DESCRIPTION = """\
Evaluate a CLIP model on the half-truth benchmark (SPEC §4), with the retrieval and
compositional suites.

Without --units the synthetic world's validation split is generated on the fly. The
half-truth items follow benchmark.protocol: `paper` (the authors' builder, item for item;
the default for a units table) or `csclip` (ours; the default for the world); with
--benchmark, exactly the items of a frozen file. Every report names the protocol and the
benchmark's content hash. An s3://
checkpoint is copied once into the local cache (~/.cache/csclip, or $CSCLIP_CACHE_DIR).
Writes table1/6/7, image_side, suites (retrieval, compositional, zero-shot) and, with
--suite, benchmarks and capabilities as .md/.csv, figure3.png and benchmark.parquet to --out,
one CLIP_benchmark-shaped JSON per model and benchmark (--output), prints the tables, and
logs one MLflow run per model (tracking.uri; `--set tracking.enabled=false` to skip).
Several models in one command: --model A B --pretrained X Y (each with each) or
--pretrained-model, as CLIP_benchmark. Fields: csclip.config.eval.EvalConfig
(docs/evaluation.md)."""

KEPT = ("a checkpoint copied to the cache is kept, the tables of --out may be missing "
        "or partly written; rerun the same command to evaluate again")

EXAMPLES = (
    "%(prog)s --checkpoint runs/train/<run>/final --out runs/eval",
    "%(prog)s --model ViT-B-32 ViT-B-16 --pretrained openai --benchmark coco_val_paper.json "
    "--image-root /data/coco --suite paper --data-root s3://bucket/bench",
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = make_parser(prog, DESCRIPTION, EXAMPLES, default_config=None)
    shortcuts = parser.add_argument_group("shortcuts (each sets one config field)")
    source = shortcuts.add_mutually_exclusive_group()
    source.add_argument("--model", metavar="NAME", nargs="+", action="extend",
                        help="open_clip model name (ViT-B-32, csclip-tiny, ...): model.name; "
                             "a path (with a /, or one that exists) is a --checkpoint. "
                             "Several (repeat it, or list them): each with each --pretrained, "
                             "evaluated in turn, as CLIP_benchmark")
    source.add_argument("--pretrained-model", metavar="MODEL,PRETRAINED|FILE", nargs="+",
                        action="extend",
                        help="models as CLIP_benchmark's --pretrained_model: 'model,pretrained' "
                             "pairs, or a file of one such pair a line")
    source.add_argument("--checkpoint", metavar="DIR",
                        help="a csclip checkpoint directory (<run>/final, local or s3://): "
                             "checkpoint")
    shortcuts.add_argument("--pretrained", metavar="TAG|FILE", nargs="+", action="extend",
                           help="open_clip pretrained tag, weights file or checkpoint "
                                "directory, with --model: model.pretrained (several: each "
                                "with each --model)")
    shortcuts.add_argument("--units", metavar="URI",
                           help="units table (default: the synthetic world's val split): "
                                "data.units_uri")
    shortcuts.add_argument("--benchmark", metavar="FILE",
                           help="a frozen benchmark file (csclip benchmark build): score exactly "
                                "its items: benchmark.file")
    shortcuts.add_argument("--image-root", metavar="DIR|URI",
                           help="root of the relative image paths of the benchmark file and "
                                "of the --units table: benchmark.image_root")
    shortcuts.add_argument("--allow-outside-image-root", action="store_const", const=True,
                           default=None,
                           help="read a benchmark file's absolute, URI or ../ image paths "
                                "where it says (refused by default; their sha256 is checked "
                                "either way): benchmark.allow_outside_image_root")
    shortcuts.add_argument("--protocol", choices=("auto", "paper", "csclip"),
                           help="how the half-truth items are built (auto: paper for a units "
                                "table, csclip for the synthetic world): benchmark.protocol")
    shortcuts.add_argument("--out", metavar="DIR", help="tables and figure: out_dir")
    shortcuts.add_argument("--output", metavar="TEMPLATE",
                           help="name of each model's result JSON per benchmark, under --out, "
                                "as CLIP_benchmark's --output: {model} {pretrained} "
                                "{pretrained_full_path} {dataset} {task} (default "
                                "'{dataset}_{pretrained}_{model}_{task}.json'): "
                                "results_template")
    shortcuts.add_argument("--sugarcrepe", metavar="DIR",
                           help="SugarCrepe JSON folder (also runs SugarCrepe): "
                                "suites.sugarcrepe_dir")
    shortcuts.add_argument("--coco-images", metavar="DIR|URI",
                           help="COCO val2017 images for --sugarcrepe: suites.coco_images")
    shortcuts.add_argument("--suite", metavar="NAMES",
                           help="real-data suites, comma separated (aro, winoground, sugarcrepe, "
                                "..., coco_retrieval, flickr8k_retrieval, zeroshot, "
                                "zeroshot_paper: the paper's ZS column; paper: the paper's 16 "
                                "with its scorers; docs/evaluation.md): suites.names")
    shortcuts.add_argument("--no-world", dest="use_world", action="store_const", const=False,
                           default=None,
                           help="only the suites named (--suite, --sugarcrepe, "
                                "--retrieval-shards), as CLIP_benchmark evaluates one dataset: "
                                "no synthetic world, so no half-truth benchmark: "
                                "data.use_world=false")
    shortcuts.add_argument("--data-root", metavar="DIR|URI",
                           help="folder (or s3:// prefix) with one sub-folder per suite in its "
                                "published layout (zeroshot_paper/ and zeroshot/ also take "
                                "CLIP_benchmark's webdataset folders, e.g. "
                                "zeroshot_paper/wds_vtab-caltech101/): suites.data_root")
    shortcuts.add_argument("--retrieval-shards", metavar="NAME=PATTERN", action="append",
                           help="Recall@k over webdataset shards, reported as NAME's retrieval "
                                "suite (coco, flickr30k, flickr8k): PATTERN a shard pattern "
                                "(DIR/{00000..00009}.tar, local or s3://; captions of one "
                                "image share the JSON's image_id) or a CLIP_benchmark "
                                "retrieval folder (wds_mscoco_captions/); repeat for several: "
                                "suites.retrieval_shards.NAME")
    shortcuts.add_argument("--allow-partial", action="store_const", const=True, default=None,
                           help="score a benchmark whose images are partly missing, counting "
                                "those records as skipped: suites.allow_partial")
    shortcuts.add_argument("--allow-missing", action="store_const", const=True, default=None,
                           help="score the --suite benchmarks found under --data-root and skip "
                                "the others (refused by default); the suite average then says "
                                "'k of n benchmarks': suites.allow_missing")
    shortcuts.add_argument("--seed", type=int, metavar="N",
                           help="seeds the model's creation, so random initial weights are the "
                                "same in every run (default 0): seed")
    parser.add_argument("--select", choices=CHECKPOINT_SELECTIONS, default="final",
                        help="which checkpoint of a run: final (default: --checkpoint as given) "
                             "or paper (--checkpoint is the run's directory; the saved step "
                             "with the highest mean I2T on the benchmarks evaluated, as the "
                             "authors select: labelled 'selected on the test benchmarks')")
    return parser


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    return build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)


def looks_like_path(model: str) -> bool:
    """Whether a --model value is a checkpoint path rather than an open_clip name: it has
    a path separator (open_clip's hf-hub: and local-dir: names aside) or exists."""
    if model.startswith(("hf-hub:", "local-dir:")):
        return False
    return "/" in model or os.sep in model or Path(model).expanduser().exists()


def model_pairs(args: argparse.Namespace) -> list[tuple[str, str | None]]:
    """(model, pretrained) of every model named: --pretrained-model's pairs (and files of
    pairs), else each --model with each --pretrained (CLIP_benchmark's product). A
    malformed pair or file line is a ConfigError."""
    if args.pretrained_model:
        if args.pretrained:
            raise ConfigError("--pretrained-model names the pretrained weights of each model; "
                              "drop --pretrained")
        pairs = []
        for value in args.pretrained_model:
            path = Path(value).expanduser()
            try:
                lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() \
                    else [value]
            except UnicodeDecodeError:
                raise ConfigError(f"--pretrained-model: {value} is not UTF-8 text") from None
            where = f"{value}: " if path.is_file() else ""
            for line in (line.strip() for line in lines):
                if not line or line.startswith("#"):
                    continue
                model, comma, pretrained = (part.strip() for part in line.partition(","))
                if not comma or not model or not pretrained or "," in pretrained:
                    raise ConfigError(f"--pretrained-model: {where}{line!r} is not "
                                      "'model,pretrained' (e.g. ViT-B-32,openai)")
                pairs.append((model, pretrained))
        if not pairs:  # an empty file: not the default model in its place
            raise ConfigError(f"--pretrained-model: no 'model,pretrained' line in "
                              f"{', '.join(args.pretrained_model)}")
        return pairs
    return [(model, pretrained) for model in args.model or []
            for pretrained in args.pretrained or [None]]


# A --retrieval-shards NAME becomes a key of a dotted --set path: no dots, no spaces.
RETRIEVAL_SHARDS_NAME = re.compile(r"[A-Za-z0-9_-]+")


def retrieval_shard_overrides(values: list[str] | None) -> dict[str, str]:
    """--retrieval-shards NAME=PATTERN (repeated) as suites.retrieval_shards.NAME fields.
    A value without NAME= or PATTERN, or a NAME given twice, is a ConfigError."""
    out: dict[str, str] = {}
    for value in values or []:
        name, equals, pattern = value.partition("=")
        name, pattern = name.strip(), pattern.strip()
        if not equals or not RETRIEVAL_SHARDS_NAME.fullmatch(name) or not pattern:
            raise ConfigError(f"--retrieval-shards {value!r} is not NAME=PATTERN (e.g. "
                              "coco=s3://bucket/coco/{00000..00004}.tar)")
        key = f"suites.retrieval_shards.{name}"
        if key in out:
            raise ConfigError(f"--retrieval-shards names {name} twice ({out[key]} and "
                              f"{pattern}); give each dataset once")
        out[key] = pattern
    return out


def overrides_from_args(args: argparse.Namespace) -> list[str]:
    """The shortcut flags as `--set` overrides, placed before the user's own. One model
    named sets model.name / model.pretrained; several go to run_evaluation apart
    (several_models)."""
    pairs = model_pairs(args)
    model, pretrained = pairs[0] if len(pairs) == 1 else (None, None)
    if not pairs and args.pretrained:  # --pretrained alone: the default model's weights
        pretrained = args.pretrained[0] if len(args.pretrained) == 1 else None
    checkpoint = args.checkpoint
    if model is not None and looks_like_path(model):  # --model runs/train/x/final
        model, checkpoint = None, model
    return shortcut_overrides({
        "model.name": model, "model.pretrained": pretrained,
        "checkpoint": checkpoint, "data.units_uri": args.units, "data.use_world": args.use_world,
        "out_dir": args.out,
        "benchmark.file": args.benchmark, "benchmark.image_root": args.image_root,
        "benchmark.allow_outside_image_root": args.allow_outside_image_root,
        "benchmark.protocol": args.protocol,
        "suites.sugarcrepe_dir": args.sugarcrepe, "suites.coco_images": args.coco_images,
        "suites.names": args.suite, "suites.data_root": args.data_root,
        "suites.allow_partial": args.allow_partial, "suites.allow_missing": args.allow_missing,
        "seed": args.seed, "results_template": args.output,
        **retrieval_shard_overrides(args.retrieval_shards),
    }, args.overrides)


def several_models(args: argparse.Namespace, config) -> list:
    """The ModelSource of each model when several are named (else []): config.model's
    other fields (image_size, quick_gelu) with each (model, pretrained)."""
    pairs = model_pairs(args)
    if len(pairs) < 2:
        if args.pretrained and len(args.pretrained) > 1 and not pairs:
            raise ConfigError("several --pretrained need --model (the model of each)")
        return []
    paths = [model for model, _ in pairs if looks_like_path(model)]
    if paths:
        raise ConfigError(f"--model {paths[0]} is a path: with several models give each "
                          "checkpoint as --model NAME --pretrained DIR")
    if args.select != "final":
        raise ConfigError("--select paper takes one run's directory (--checkpoint); "
                          "evaluate several models with --select final")
    base = config.model.model_dump()
    return [ModelSource.model_validate({**base, "name": model, "pretrained": pretrained})
            for model, pretrained in pairs]


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    setup_logging()
    return run_guarded(lambda: _evaluate(args), kept=KEPT)


# Fields a run would not use, refused when given (not ignored). With a checkpoint the
# model is the checkpoint's. With a frozen benchmark file its items are fixed and no
# image-side items are built; benchmark.seed still seeds the bootstrap intervals.
UNUSED_WITH_CHECKPOINT = {
    "model": "checkpoint (--checkpoint) loads the model its directory holds; give one of "
             "the two",
}
UNUSED_WITH_BENCHMARK_FILE = {
    **{f"benchmark.{field}": "benchmark.file (--benchmark) fixes the items; the builder's "
                             "fields are unused" for field in ("num_samples", "paper_seed")},
    "benchmark.image_side": "benchmark.file (--benchmark) holds no image-side items",
}


# Fields read only with another one: given alone, the run would ignore them.
UNUSED_WITHOUT_SUITE = {
    "suites.data_root": "suites.data_root (--data-root) is read only for the suites named "
                        "by suites.names (--suite aro,winoground, ...); name them",
}
UNUSED_WITHOUT_SUGARCREPE = {
    "suites.coco_images": "suites.coco_images (--coco-images) holds the images of SugarCrepe "
                          "(--sugarcrepe DIR); give --sugarcrepe too",
}
UNUSED_WITHOUT_WORLD = {
    **{path: f"data.use_world=false (--no-world) builds no half-truth benchmark, so {path} is "
             "unused" for path in ("data.world", "data.split", "benchmark")},
}
UNUSED_ON_THE_WORLD = {
    "benchmark.image_root": "benchmark.image_root (--image-root) roots the relative image "
                            "paths of a units table (--units) or a benchmark file "
                            "(--benchmark); the synthetic world holds its images",
}


def _given(data: object, path: str) -> object:
    """The value `data` (a config as read, before validation) gives at a dotted path, else
    None."""
    for key in path.split("."):
        if not isinstance(data, dict):
            return None
        data = data.get(key)
    return data


def refuse_unused(data: dict) -> None:
    """Refuse the fields the run described by `data` would not read: those of
    UNUSED_WITH_CHECKPOINT, UNUSED_WITH_BENCHMARK_FILE, UNUSED_WITHOUT_SUITE,
    UNUSED_WITHOUT_SUGARCREPE, UNUSED_WITHOUT_WORLD and UNUSED_ON_THE_WORLD, when they
    apply."""
    if data.get("checkpoint"):
        refuse_given(data, UNUSED_WITH_CHECKPOINT)
    if _given(data, "benchmark.file"):
        refuse_given(data, UNUSED_WITH_BENCHMARK_FILE)
    if not _given(data, "suites.names"):
        refuse_given(data, UNUSED_WITHOUT_SUITE, accepted={"suites.data_root": None})
    if not _given(data, "suites.sugarcrepe_dir"):
        refuse_given(data, UNUSED_WITHOUT_SUGARCREPE, accepted={"suites.coco_images": None})
    if _given(data, "data.use_world") is False:
        refuse_given(data, UNUSED_WITHOUT_WORLD)
    if not _given(data, "data.units_uri") and not _given(data, "benchmark.file"):
        refuse_given(data, UNUSED_ON_THE_WORLD, accepted={"benchmark.image_root": None})


def eval_config(args: argparse.Namespace):
    """The EvalConfig of the parsed flags (--config, shortcuts, --set), refusing the
    fields the run would not use (refuse_unused)."""
    data = apply_overrides(read_yaml(args.config) if args.config else {},
                           overrides_from_args(args))
    origin = str(args.config or "config")
    refuse_unused(data)
    config = validate_config(EvalConfig, data, origin=origin)
    check_checkpoint(config.checkpoint)
    return config


def check_checkpoint(checkpoint: str | None) -> None:
    """Refuse a checkpoint that is not there, before anything loads: a local path that
    does not exist, an s3:// prefix with no file under it (a missing bucket included).
    Raises ConfigError "checkpoint not found: PATH"; DataError when S3 cannot be listed."""
    if not checkpoint:
        return
    if checkpoint.startswith("s3://"):
        if not _s3_has_files(checkpoint):
            raise ConfigError(f"checkpoint not found: {checkpoint}")
    elif "://" not in checkpoint and not Path(checkpoint).expanduser().exists():
        raise ConfigError(f"checkpoint not found: {checkpoint}")


def _s3_has_files(uri: str) -> bool:
    """Whether any file lies under the s3:// prefix (pyarrow's S3 client: no torch)."""

    fs, path = filesystem_for(uri)
    try:
        infos = fs.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    except OSError as err:  # unreachable endpoint, refused credentials
        raise DataError(f"{uri}: cannot list it ({err}); check the S3 endpoint and "
                        "credentials") from err
    return any(info.type == pafs.FileType.File for info in infos)


def _evaluate(args: argparse.Namespace) -> int:
    config = eval_config(args)
    if printed_config(args, config):
        return 0
    refuse_file_as_folder(config.out_dir, "--out (out_dir)")
    announce("evaluate", f"{evaluated_models(args, config)} on {evaluated_data(config)} into "
             f"{config.out_dir}", "torch and the model")
    # One evaluation per --out at a time: a second one's tables would replace the first's.
    with output_lease(resolve_output(config.out_dir, "out_dir"), "csclip evaluate"):
        return _evaluate_into(config, args)


def evaluated_models(args: argparse.Namespace, config: EvalConfig) -> str:
    """The model(s) a run evaluates, as the first line names them."""
    if config.checkpoint:
        return f"checkpoint {config.checkpoint}"
    pairs = model_pairs(args)
    if len(pairs) > 1:
        return f"{len(pairs)} models"
    model = config.model
    return f"{model.name} ({model.pretrained or 'random weights'})"


def evaluated_data(config: EvalConfig) -> str:
    """What a run scores, as the first line names it: the half-truth benchmark's source
    and the suites asked by name."""
    if config.benchmark.file:
        parts = [f"benchmark file {config.benchmark.file}"]
    elif config.data.units_uri:
        parts = [f"the half-truth benchmark of {config.data.units_uri}"]
    elif config.data.use_world:
        parts = [f"the world's {config.data.world.num_val} validation scenes"]
    else:
        parts = []
    suites = config.suites
    parts += [f"suites {','.join(suites.names)}"] if suites.names else []
    parts += ["SugarCrepe"] if suites.sugarcrepe_dir else []
    parts += [f"shards {','.join(suites.retrieval_shards)}"] if suites.retrieval_shards else []
    return " + ".join(parts)


def _evaluate_into(config, args: argparse.Namespace) -> int:
    from csclip.eval.pipeline import run_evaluation  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked

    models = several_models(args, config)
    if config.suites.retrieval_shards:  # their shards are there, before any model loads
        from csclip.eval.shards import check_retrieval_shards  # noqa: PLC0415  the program (and torch) loads once the config is checked

        check_retrieval_shards(config.suites.retrieval_shards)
    if args.select == "paper":  # csclip.eval.selection: every saved step, the authors' pick
        if not config.data.use_world:  # its pick is read off the half-truth benchmark too
            raise ConfigError("--select paper scores every saved step on the half-truth "
                              "benchmark too; drop --no-world")
        from csclip.eval.selection import run_selected_evaluation  # noqa: PLC0415  the program (and torch, ray) loads once the config is checked

        selected = run_selected_evaluation(config)
        print(selected.report.markdown)
        print(f"step {selected.selection.step} ({selected.checkpoint.uri}) selected on the "
              f"test benchmarks; tables and selection.md written to {config.out_dir}")
        if selected.report.mlflow_run_id:
            print(mlflow_line(selected.report.mlflow_run_id, config.tracking))
        return 0
    report = run_evaluation(config, models)
    print(report.markdown)
    print(f"tables and figure written to {config.out_dir}")
    if report.mlflow_run_id:
        print(mlflow_line(report.mlflow_run_id, config.tracking))
    return 0

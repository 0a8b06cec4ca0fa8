"""`csclip benchmark build|verify`: write the half-truth benchmark as a frozen file that any
model is then scored on (`csclip evaluate --benchmark FILE`)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from pydantic import ValidationError

from csclip.config.eval import BenchmarkConfig
from csclip.config.world import WorldConfig
from csclip.entry.common import run_guarded, setup_logging
from csclip.errors import ConfigError
from csclip.records import load_split

DESCRIPTION = """\
Build the half-truth benchmark (SPEC §4) once and write it as a frozen JSON file: every
item with its provenance (image, caption id, unit, foil, condition) and a content hash.
`csclip evaluate --benchmark FILE` scores any model on exactly those items and prints the
hash. --units is a units table (Parquet, or the --out folder of `csclip extract`) or a
file in the authors' unit format (read verbatim for the paper protocol: no foil their
builder uses is dropped); without it, the synthetic world's split. docs/evaluation.md,
"Protocols" and "Frozen benchmark files"."""

EXAMPLES = (
    "%(prog)s build --units coco_val_units.json --protocol paper --out coco_val_paper.json",
    "%(prog)s build --units s3://bucket/coco/units/val --split val --out coco_val_paper.json",
    "%(prog)s verify coco_val_paper.json --image-root /data/coco",
)


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    epilog = "examples:\n" + "\n".join(f"  {example}" for example in EXAMPLES)
    parser = argparse.ArgumentParser(prog=prog, description=DESCRIPTION, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="build|verify")
    build = commands.add_parser("build", help="build the benchmark and write it to --out")
    build.add_argument("--units", metavar="URI",
                       help="units table (or an extract --out folder), or the authors' unit "
                            "JSON (file, directory, glob); default: the synthetic world")
    build.add_argument("--protocol", choices=("auto", "paper", "csclip"), default="auto",
                       help="paper: the authors' builder; csclip: ours; auto (default): paper "
                            "for --units, csclip for the world")
    build.add_argument("--out", metavar="FILE", required=True, help="the benchmark file (.json)")
    build.add_argument("--split", default="val", help="units table split (default: val)")
    build.add_argument("--num-samples", type=int, metavar="N",
                       help="paper: images per pass (default 5000, the paper's run); "
                            "0 for every image")
    build.add_argument("--seed", type=int, metavar="N",
                       help="paper: the +Rand seed (default 42); csclip: the builder's seed "
                            "(default 0)")
    build.add_argument("--image-root", metavar="DIR|URI",
                       help="joined to the relative image paths of the unit file or units "
                            "table")
    verify = commands.add_parser("verify", help="check a benchmark file and its images' "
                                                "sha256, and print its hash")
    verify.add_argument("file", metavar="FILE")
    verify.add_argument("--image-root", metavar="DIR|URI",
                        help="root of the file's relative image paths (as for evaluate)")
    verify.add_argument("--allow-outside-image-root", action="store_true",
                        help="read absolute, URI or ../ image paths where the file says")
    verify.add_argument("--units", metavar="URI",
                        help="the units the file was built from, for images it holds no path "
                             "for (default: the synthetic world)")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = build_parser(prog).parse_args(sys.argv[1:] if argv is None else argv)
    setup_logging()
    return run_guarded(lambda: _build(args) if args.command == "build" else _verify(args),
                       kept="rerun the same command")


def _config(args: argparse.Namespace):
    fields: dict[str, object] = {"protocol": args.protocol}
    if args.num_samples is not None:
        if args.protocol == "csclip" or (args.protocol == "auto" and not args.units):
            # the world (no --units) is built with the csclip protocol, which takes every image
            raise ConfigError("--num-samples: only the paper protocol draws images per pass; "
                              "drop it, or give --protocol paper")
        fields["num_samples"] = args.num_samples or None
    if args.seed is not None:
        # auto picks the builder only once the records are read: the seed goes to both.
        fields.update({"paper": {"paper_seed": args.seed}, "csclip": {"seed": args.seed}}.get(
            args.protocol, {"paper_seed": args.seed, "seed": args.seed}))
    try:
        return BenchmarkConfig(**fields)
    except ValidationError as err:
        first = err.errors()[0]
        flag = {"num_samples": "--num-samples", "paper_seed": "--seed", "seed": "--seed"}.get(
            str(first["loc"][0]), f"--{first['loc'][0]}")
        raise ConfigError(f"{flag}: {first['msg']}") from err


def _build(args: argparse.Namespace) -> int:
    from csclip.eval.benchmark_file import build_frozen_benchmark, write_benchmark_file  # noqa: PLC0415  the builder imports torch; loaded once the arguments are checked

    frozen = build_frozen_benchmark(args.units, _config(args), args.split, args.image_root)
    path = write_benchmark_file(frozen, args.out)
    print(f"wrote {path}")
    print(summary(frozen))
    return 0


def _verify(args: argparse.Namespace) -> int:
    from csclip.eval.benchmark_file import read_benchmark_file, verify_images  # noqa: PLC0415  as above: torch once the arguments are checked

    frozen = read_benchmark_file(args.file)
    records = []
    if None in frozen.images.values():  # images held by the units (the world's bytes)

        split = frozen.built_from.get("split")
        records = load_split(args.units, str(split or "val"), WorldConfig())
    checked = verify_images(frozen, records, args.image_root, args.allow_outside_image_root)
    print(f"{args.file}: ok ({checked} images, each with the sha256 the file records)")
    print(summary(frozen))
    return 0


def summary(frozen) -> str:
    """Protocol, hash and items per condition of a FrozenBenchmark."""
    from csclip.eval.halftruth import ALL_CONDITIONS  # noqa: PLC0415  the half-truth package imports torch; only the summary needs it

    bench = frozen.benchmark
    counts = Counter(item.condition for item in bench.items)
    per_condition = ", ".join(f"{c.label} {counts.get(c.slug, 0)}" for c in ALL_CONDITIONS)
    return (f"protocol {bench.protocol}, {frozen.content_hash}\n"
            f"{len(bench.items)} items over {len({i.image_id for i in bench.items})} images: "
            f"{per_condition}")

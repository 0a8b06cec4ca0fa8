"""Generate the synthetic world and print its summary.

    python -m csclip.world --set num_train=200 --set image_size=48
    python -m csclip.world --out runs/world          # also write sharded Parquet
    python -m csclip.world --config configs/default.yaml --section data.world
"""

from __future__ import annotations

import argparse
import logging
import sys

from csclip.config import apply_overrides, read_yaml, validate_config
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, CsclipError
from csclip.world.generate import iter_world
from csclip.world.summary import format_summary, summarize
from csclip.world.writer import write_world


def load_world_config(path: str | None, section: str, overrides: list[str]) -> WorldConfig:
    """A WorldConfig from `section` (dotted, e.g. "data.world") of a YAML file, or the
    defaults, with `field=value` overrides."""
    data: dict = {}
    if path:
        data = read_yaml(path)
        for part in filter(None, section.split(".")):
            data = data.get(part, {})
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: {section!r} is not a section of the config")
    return validate_config(WorldConfig, apply_overrides(data, overrides),
                           origin=f"{path}:{section}" if path else "world config")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the synthetic world; print a summary.")
    parser.add_argument("--config", help="YAML file holding a world config section")
    parser.add_argument("--section", default="data.world", help="dotted section in --config")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="field=value", help="override one WorldConfig field; repeatable")
    parser.add_argument("--out", help="write sharded Parquet here (local path or s3://)")
    parser.add_argument("--examples", type=int, default=3, help="example captions to show")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        config = load_world_config(args.config, args.section, args.overrides)
        if args.out:
            summary = write_world(config, args.out, num_examples=args.examples)
        else:
            summary = summarize(iter_world(config), args.examples)
    except CsclipError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(format_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

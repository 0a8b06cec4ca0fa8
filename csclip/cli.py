"""The `csclip` console command: `csclip demo|extract|shards|train|evaluate|ablate|report ...`.

Each command is the same parser and code as its script (pipelines/*.py, tune/ablate.py):
both call csclip.entry.<module>.main. Commands are imported only when run, so
`csclip --help` answers without loading torch or Ray.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import PackageNotFoundError, version

from csclip import __version__

# command -> (module in csclip.entry, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "the demo: pretrain, CLIP-FT, CS-CLIP, half-truth table (CPU, ~10 min)"),
    "extract": ("extract", "extract units and foils from captions (vllm, rules, gold, authors)"),
    "shards": ("shards", "write any captions input as webdataset shards (as img2dataset would)"),
    "train": ("train", "fine-tune on Ray Train (csclip, clip, negclip)"),
    "evaluate": ("evaluate", "half-truth benchmark and suites for a model or checkpoint"),
    "benchmark": ("benchmark", "write the half-truth benchmark as a frozen, hashed file"),
    "ablate": ("ablate", "Ray Tune ablations (Tables 16-17)"),
    "report": ("report", "ours beside the paper's Tables 1, 6, 7, 16, 17 (--paper RUN...)"),
}


def usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: csclip <command> [--help] [options]", "",
             "CS-CLIP at cluster scale: unit extraction on Ray Data, training on Ray Train,",
             "ablations on Ray Tune, half-truth evaluation; everything tracked in MLflow.", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, (_, text) in COMMANDS.items()]
    lines += ["", "`csclip <command> --help` lists a command's flags and gives examples;",
              "`csclip --version` prints the installed version.",
              "Start with `csclip demo`; docs/quickstart.md walks through the first 10 minutes."]
    return "\n".join(lines)


def package_version() -> str:
    """The installed distribution's version (pyproject.toml's, as pip recorded it)."""
    try:
        return version("csclip")
    except PackageNotFoundError:  # imported from a checkout that was never pip-installed

        return f"{__version__} (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"csclip {package_version()}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}; choose one of {', '.join(COMMANDS)}",
              file=sys.stderr)
        return 2
    module = importlib.import_module(f"csclip.entry.{COMMANDS[name][0]}")
    return module.main(rest, prog=f"csclip {name}")


if __name__ == "__main__":
    sys.exit(main())

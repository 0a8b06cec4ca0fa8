"""What every entry point shares: the parser layout (description, examples), shortcut
flags turned into `--set` overrides, logging, and one-line user errors (exit 2)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pydantic import BaseModel

from csclip.config import add_config_arguments, to_yaml
from csclip.errors import ConfigError, CsclipError
from csclip.tracking import resolve_uri

REPO_ROOT = Path(__file__).resolve().parents[2]
LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"


def make_parser(prog: str | None, description: str, examples: Sequence[str],
                default_config: str | None,
                tracking_field: str = "tracking.enabled") -> argparse.ArgumentParser:
    """A parser with `--config`, `--set` and `--no-tracking` (`--set <tracking_field>=false`),
    and an epilog of examples ("%(prog)s" in an example is the command as the user typed
    it: `csclip train` or the script)."""
    epilog = "examples:\n" + "\n".join(f"  {example}" for example in examples)
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, default_config)
    parser.add_argument("--no-tracking", action=_SetFalse, field=tracking_field,
                        help=f"log nothing to MLflow: --set {tracking_field}=false")
    return parser


class _SetFalse(argparse.Action):
    """A flag that appends `<field>=false` to the `--set` overrides, where it sits, so a
    later `--set` of the same field still wins."""

    def __init__(self, option_strings: Sequence[str], dest: str, field: str, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)
        self.field = field

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.overrides = [*namespace.overrides, f"{self.field}=false"]


def shortcut_overrides(values: Mapping[str, object], overrides: Sequence[str]) -> list[str]:
    """Shortcut flags as `field=value` overrides, before the user's own `--set`s (so an
    explicit `--set` wins). None values (flag not given) are left out; strings are quoted
    so YAML keeps tags like "openai" or paths with colons as strings."""
    shortcuts = []
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, str):
            value = "'" + value.replace("'", "''") + "'"
        elif isinstance(value, bool):
            value = str(value).lower()
        shortcuts.append(f"{key}={value}")
    return shortcuts + list(overrides)


def add_address_argument(parser: argparse.ArgumentParser) -> None:
    """--address: the Ray cluster to join (csclip.entry.ray_init.init_ray)."""
    parser.add_argument("--address", help="Ray cluster to join (default: RAY_ADDRESS, else a "
                                          "local instance)")


def mlflow_line(run_id: str, tracking) -> str:
    """Where a finished command's MLflow run is, and how to browse it (a TrackingConfig)."""
    return (f"MLflow run {run_id} in experiment {tracking.experiment}; "
            f"browse: mlflow ui --backend-store-uri {resolve_uri(tracking.uri)}")


def setup_logging() -> None:
    """Our own lines at INFO, everything else at WARNING (Ray's and MLflow's chatter)."""
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    logging.getLogger("csclip").setLevel(logging.INFO)


def announce(command: str, what: str, loading: str) -> None:
    """Log `<command>: <what>; loading <loading>...` once the config is checked, before
    the heavy imports (torch, Ray) and Ray's start take their seconds, so a command says
    what it is about to do before anything else."""
    logging.getLogger(f"csclip.{command}").info("%s: %s; loading %s...", command, what, loading)


# Exit code of a command stopped by Ctrl-C, as a shell reports a process killed by SIGINT.
INTERRUPTED_EXIT_CODE = 130
# What an interrupted command keeps, said on its one line (each entry point says its own).
KEPT_ON_INTERRUPT = ("finished shards and checkpoints are kept; rerun the same command to "
                     "resume")


def run_guarded(call: Callable[[], int], kept: str = KEPT_ON_INTERRUPT) -> int:
    """Run an entry point's body: a CsclipError (a user mistake) becomes one line on
    stderr and exit code 2; Ctrl-C one line saying what was `kept` (and how to go on) and
    exit code 130; anything else is a bug and keeps its traceback."""
    try:
        return call()
    except CsclipError as err:
        # One line, whatever the message quotes (a YAML parser's or pyarrow's own lines).
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        print(f"error: {'; '.join(lines)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: {kept}", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE


def refuse_file_as_folder(uri: str | None, option: str) -> None:
    """Refuse an output folder (`option`: the flag and field, e.g. "--out (out_dir)") that
    names an existing local file: one ConfigError line instead of an OSError mid-run."""
    if not uri or "://" in uri:
        return
    path = Path(uri).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{option}: {uri} is a file, not a folder; give a folder (created "
                          "when missing)")


def printed_config(args: argparse.Namespace, config: BaseModel) -> bool:
    """With --print-config: print the resolved config as YAML and return True (the command
    then stops, having loaded nothing heavy); else False."""
    if getattr(args, "print_config", False):
        print(to_yaml(config), end="")
        return True
    return False


def default_config_path(name: str) -> str:
    """configs/<name> of the csclip checkout this package runs from (relative to the
    working directory when it is below it, as it reads in help and error lines)."""
    path = REPO_ROOT / "configs" / name
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)

"""The entry points explain themselves: each --help lists its choices and two
examples; `csclip <command>` and the scripts are one implementation; shortcuts are --sets."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from tests.conftest import REPO_ROOT

# csclip command -> the script that runs the same code
SCRIPTS = {
    "train": "pipelines/train.py",
    "evaluate": "pipelines/evaluate.py",
    "extract": "pipelines/extract_units.py",
    "ablate": "tune/ablate.py",
}
CHOICES = {
    "train": ["clip", "negclip", "csclip"],
    "extract": ["vllm", "rules", "gold", "authors", "karpathy", "sugarcrepe", "world"],
    "ablate": ["lr", "units", "relfrac", "swapfrac", "wd", "bs", "negclip"],
    "demo": ["--max-steps", "--pretrain-steps", "--layout-steps"],
    "evaluate": ["--checkpoint", "--sugarcrepe"],
}


def _help(*command: str) -> str:
    env = {**os.environ, "COLUMNS": "100"}
    done = subprocess.run([sys.executable, *command, "--help"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, check=True)
    return done.stdout


def _body(help_text: str) -> str:
    # Everything after the usage block: the usage line wraps by the length of the prog.
    return help_text.split("\n\n", 1)[1]


@pytest.mark.parametrize("command", sorted(CHOICES))
def test_help_lists_choices_and_two_examples(command):
    text = _help("-m", "csclip.cli", command)
    for choice in CHOICES[command]:
        assert choice in text, f"{command} --help does not mention {choice}"
    examples = text.split("examples:\n", 1)[1].strip().splitlines()
    assert len(examples) == 2 and all(e.strip().startswith(f"csclip {command}") for e in examples)


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_command_help_equals_the_scripts(command):
    script = SCRIPTS[command]
    from_script = _help(script).replace(f"python {script}", f"csclip {command}")
    assert _body(_help("-m", "csclip.cli", command)) == _body(from_script)


def test_demo_help_equals_the_train_scripts_demo_help():
    from_script = _help("pipelines/train.py", "--demo").replace(
        "python pipelines/train.py --demo", "csclip demo")
    assert _body(_help("-m", "csclip.cli", "demo")) == _body(from_script)


def test_ray_data_console_shows_warnings_only(tmp_path):
    """The local instance's Ray Data logging config: loadable, console at WARNING, the
    file handler (ray-data.log) at everything."""
    from csclip.entry.ray_init import _ray_data_logging_file

    code = ("import logging, ray.data\n"
            "handlers = {type(h).__name__: h.level for h in logging.getLogger('ray.data').handlers}\n"
            "assert handlers == {'SessionFileHandler': 0, 'PlainRayHandler': logging.WARNING}, handlers\n")
    env = {**os.environ, "RAY_DATA_LOGGING_CONFIG": _ray_data_logging_file()}
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, check=True)


def test_a_local_instance_starts_with_settings_ray_reads():
    """Each variable local_env sets is one this Ray reads (a renamed one would silently do
    nothing): Ray Train's poll interval and preemption watcher, the raylet's startup
    concurrency."""
    from ray.train.v2._internal import constants

    from csclip.entry.ray_init import local_env

    env = local_env(None)
    assert float(env[constants.HEALTH_CHECK_INTERVAL_S_ENV_VAR]) < constants.DEFAULT_HEALTH_CHECK_INTERVAL_S
    assert env[constants.ENABLE_PREEMPTION_WATCHER_ENV_VAR] == "0"
    assert int(env["RAY_worker_maximum_startup_concurrency"]) >= 4
    assert local_env(16)["RAY_worker_maximum_startup_concurrency"] == "16"


def test_extract_shortcuts_are_the_fields_they_name():
    from csclip.config import load_config
    from csclip.config.extract import ExtractConfig
    from csclip.entry import extract

    args = extract.build_parser().parse_args(
        ["--backend", "rules", "--format", "csv", "--input", "s3://b/c.csv", "--out", "runs/x",
         "--set", "output.uri=runs/y"])
    overrides = extract.overrides_from_args(args)
    assert overrides == ["backend.name='rules'", "input.uri='s3://b/c.csv'",
                         "output.uri='runs/x'", "input.format='csv'", "output.uri=runs/y"]
    config = load_config(ExtractConfig, None, overrides)
    # An explicit --set comes after the shortcuts, so it wins.
    assert (config.backend.name, config.input.uri, config.output.uri) == (
        "rules", "s3://b/c.csv", "runs/y")


def test_train_shortcuts_are_the_fields_they_name():
    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.entry import train

    args = train.build_parser().parse_args(
        ["--method", "clip", "--max-steps", "7", "--lr", "2e-4", "--out", "s3://b/runs", "--gpu"])
    config = load_config(TrainConfig, args.config, train.overrides_from_args(args))
    assert (config.loss.method, config.optim.max_steps, config.optim.lr) == ("clip", 7, 2e-4)
    assert (config.run.storage_path, config.run.use_gpu) == ("s3://b/runs", True)
    # Not given: the YAML's value stays.
    assert config.data.batch_size == 64


def test_console_command_is_declared_and_resolves():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    target = project["scripts"]["csclip"]
    module, _, function = target.partition(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), function))
    assert target == "csclip.cli:main"


def test_command_and_script_report_a_bad_field_the_same_way():
    argv = ["--method", "negclip", "--set", "optim.warmup_steps=-3"]
    outputs = [subprocess.run([sys.executable, *command, *argv], cwd=REPO_ROOT,
                              capture_output=True, text=True)
               for command in (["-m", "csclip.cli", "train"], ["pipelines/train.py"])]
    for done in outputs:
        assert done.returncode == 2
        assert done.stderr.strip().startswith("error:") and "optim.warmup_steps" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
    assert outputs[0].stderr == outputs[1].stderr


def test_cli_lists_commands_and_refuses_an_unknown_one(capsys):
    from csclip import cli

    assert cli.main(["--help"]) == 0
    listed = capsys.readouterr().out
    assert all(f"  {name}" in listed for name in ("demo", "extract", "train", "evaluate", "ablate"))
    assert cli.main(["trian"]) == 2
    assert "unknown command 'trian'" in capsys.readouterr().err


def test_help_needs_neither_torch_nor_ray():
    code = ("import sys, contextlib, io\nfrom csclip import cli\n"
            "for name in cli.COMMANDS:\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        cli.main([name, '--help'])\n"
            "heavy = [m for m in ('torch', 'ray') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


# Stops the command at its first import of torch or Ray (exit 99): what it printed by then
# it printed before the seconds those imports, and Ray's start, take.
STOP_AT_HEAVY_IMPORT = """\
import sys
class StopAtHeavyImport:
    def find_spec(self, name, path=None, target=None):
        if name in ("torch", "ray"):
            print(f"importing {name}", file=sys.stderr, flush=True)
            raise SystemExit(99)
sys.meta_path.insert(0, StopAtHeavyImport())
from csclip.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize(("argv", "said"), [
    (["train", "--max-steps", "1"], "train: csclip on csclip-tiny, 1 steps, runs under "),
    (["extract", "--backend", "rules", "--input", "captions.txt"],
     "extract: backend rules on captions.txt into "),
    (["evaluate"], "evaluate: csclip-tiny (random weights) on the world's 500 validation "
                   "scenes into "),
], ids=["train", "extract", "evaluate"])
def test_each_command_says_what_it_does_before_torch_or_ray_is_imported(argv, said, tmp_path):
    (tmp_path / "captions.txt").write_text("a dog on a mat\n")
    done = subprocess.run([sys.executable, "-c", STOP_AT_HEAVY_IMPORT, *argv, "--out",
                           str(tmp_path / "out"), "--no-tracking"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    lines = done.stderr.splitlines()
    assert done.returncode == 99 and len(lines) == 2, done.stderr
    assert said in lines[0] and "; loading " in lines[0], lines[0]
    assert lines[1].startswith("importing ")

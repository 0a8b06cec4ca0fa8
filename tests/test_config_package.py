"""The config package validates every config, and every entry point parses its arguments,
with neither torch nor ray imported: a typo or a bad value is refused in a fraction of a
second, and --print-config prints what a run would use."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from csclip.config import load_config, to_yaml
from csclip.config.train import TrainConfig

REPO = Path(__file__).resolve().parents[1]

# Each YAML of configs/ and the config it is (demo.yaml holds the demo's deltas: it is
# DemoConfig's defaults, validated through DemoConfig()).
CONFIG_FILES = {
    "coco.yaml": "train", "coco_authors.yaml": "train", "default.yaml": "train",
    "paper.yaml": "train", "laion.yaml": "train", "world_gpu.yaml": "demo",
    "extract_coco.yaml": "extract",
    "demo.yaml": "demo-deltas",
}


def test_every_yaml_in_configs_is_listed_here():
    assert sorted(p.name for p in (REPO / "configs").glob("*.yaml")) == sorted(CONFIG_FILES)


def test_configs_and_argument_parsing_load_neither_torch_nor_ray():
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from csclip.config import load_config, validate_config, read_yaml
        from csclip.config.demo import DemoConfig
        from csclip.config.eval import EvalConfig
        from csclip.config.extract import ExtractConfig
        from csclip.config.report import ReportConfig
        from csclip.config.train import TrainConfig
        from csclip.entry import ablate, benchmark, demo, evaluate, extract, report, train
        configs = Path({str(REPO / "configs")!r})
        kinds = {CONFIG_FILES!r}
        for name, kind in kinds.items():
            path = configs / name
            if kind == "train":
                load_config(TrainConfig, path)
            elif kind == "extract":
                load_config(ExtractConfig, path)
            elif kind == "demo":
                demo.demo_config(demo.build_parser().parse_args(["--config", str(path)]))
            else:
                DemoConfig()
        train.build_parser().parse_args(["--max-steps", "3"])
        extract.build_parser().parse_args(["--backend", "rules"])
        evaluate.eval_config(evaluate.build_parser().parse_args([]))
        ablate.base_config(ablate.build_parser().parse_args(["--grid", "lr"]))
        report.report_config(report.build_parser().parse_args(["--paper", "runs/x"]))
        benchmark.build_parser()
        validate_config(EvalConfig, {{}})
        validate_config(ReportConfig, {{}})
        heavy = sorted(m for m in ("torch", "ray", "open_clip", "mlflow") if m in sys.modules)
        print("heavy:", heavy)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "heavy: []"


@pytest.mark.parametrize("command", ["train", "extract", "evaluate", "demo", "ablate", "report"])
def test_print_config_prints_the_resolved_config_and_loads_nothing_heavy(command):
    argv = [command, "--print-config", "--set", "tracking.experiment=printed"]
    if command == "demo":
        argv = [command, "--print-config", "--set", "train.tracking.experiment=printed"]
    if command == "ablate":
        argv += ["--grid", "lr"]
    if command == "report":
        argv += ["--paper", "runs/x"]
    code = ("import sys\nfrom csclip.cli import main\ncode = main(sys.argv[1:])\n"
            "print('#', sorted(m for m in ('torch', 'ray') if m in sys.modules))\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    printed, _, last = done.stdout.rpartition("#")
    assert last.strip() == "[]"
    data = yaml.safe_load(printed)
    tracking = data["train"]["tracking"] if command == "demo" else data["tracking"]
    assert tracking["experiment"] == "printed"


def test_printed_config_loads_back_equal(tmp_path):
    config = load_config(TrainConfig, REPO / "configs" / "paper.yaml", ["optim.lr=2e-6"])
    path = tmp_path / "printed.yaml"
    path.write_text(to_yaml(config))
    assert load_config(TrainConfig, path) == config

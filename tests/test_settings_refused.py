"""Settings a command would overwrite or ignore are refused in one line (exit 2), before
any Ray or model work, as the demo refuses the fields it sets itself
(csclip.config.refuse_given); and the demo's evaluation seed reaches every draw."""

from __future__ import annotations

import pytest
import yaml

from csclip.entry import ablate as ablate_entry
from csclip.entry import benchmark as benchmark_entry
from csclip.entry import demo as demo_entry
from csclip.entry import evaluate as evaluate_entry
from tests.conftest import REPO_ROOT


@pytest.fixture(autouse=True)
def _no_work(monkeypatch):
    """A setting that is not refused fails here, before a sweep or a demo starts."""
    import csclip.demo
    import csclip.entry.ray_init

    def started(*args, **kwargs):
        raise AssertionError("the command went on to start its work")

    monkeypatch.setattr(csclip.entry.ray_init, "init_ray", started)
    monkeypatch.setattr(csclip.demo, "run_demo", started)


def _refused(main, argv: list[str], capsys) -> str:
    """main(argv) exits 2 with one line on stderr; returns that line."""
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err
    return err


def _yaml(tmp_path, data: dict) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


# ---- csclip ablate: the sweep names the trials' runs and logs them to MLflow ----------

@pytest.mark.parametrize("override,field", [
    ("run.name=mine", "run.name='mine'"),
    ("tracking.enabled=false", "tracking.enabled=False"),
])
def test_ablate_refuses_what_the_sweep_sets_itself(override, field, capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    err = _refused(ablate_entry.main, ["--grid", "lr", "--set", override], capsys)
    assert field in err and "leave it unset" in err


def test_ablate_refuses_a_run_name_from_the_yaml_and_accepts_what_it_does_anyway(tmp_path, capsys):
    config = _yaml(tmp_path, {"run": {"name": "mine"}})
    assert "run.name='mine'" in _refused(ablate_entry.main, ["--grid", "lr", "--config", config],
                                         capsys)
    args = ablate_entry.build_parser().parse_args(
        ["--grid", "lr", "--config", _yaml(tmp_path, {"tracking": {"enabled": True}}),
         "--set", "run.name=null"])
    base = ablate_entry.base_config(args)
    assert base.tracking.enabled and base.run.name is None


# ---- csclip evaluate: a checkpoint is the model; a frozen file fixes the items --------

@pytest.mark.parametrize("argv,field", [
    (["--pretrained", "openai"], "model.pretrained='openai'"),
    (["--set", "model.name=ViT-B-32"], "model.name='ViT-B-32'"),
    (["--set", "model.quick_gelu=true"], "model.quick_gelu=True"),
])
def test_evaluate_refuses_model_fields_with_a_checkpoint(argv, field, tmp_path, capsys):
    err = _refused(evaluate_entry.main, ["--checkpoint", str(tmp_path), *argv], capsys)
    assert field in err and "checkpoint" in err


def test_evaluate_refuses_a_model_section_next_to_a_checkpoint_in_the_yaml(tmp_path, capsys):
    config = _yaml(tmp_path, {"checkpoint": str(tmp_path), "model": {"image_size": 64}})
    assert "model.image_size=64" in _refused(evaluate_entry.main, ["--config", config], capsys)


@pytest.mark.parametrize("override", [
    "benchmark.image_side=false",
    "benchmark.paper_seed=7", "benchmark.num_samples=10",
])
def test_evaluate_refuses_builder_fields_with_a_benchmark_file(override, tmp_path, capsys):
    err = _refused(evaluate_entry.main, ["--benchmark", str(tmp_path / "b.json"),
                                         "--set", override], capsys)
    assert override.split("=")[0] in err and "benchmark.file" in err


def test_evaluate_keeps_what_a_benchmark_file_run_uses(tmp_path):
    # benchmark.seed seeds the bootstrap intervals; the model fields without a checkpoint
    args = evaluate_entry.parse_args(["--benchmark", str(tmp_path / "b.json"), "--set",
                                      "benchmark.seed=3", "--model", "ViT-B-32"])
    config = evaluate_entry.eval_config(args)
    assert (config.benchmark.seed, config.model.name) == (3, "ViT-B-32")


# ---- csclip benchmark build: --seed reaches the builder auto picks ---------------------

def test_benchmark_build_seed_reaches_the_builder_auto_picks():
    args = benchmark_entry.build_parser().parse_args(["build", "--out", "x.json", "--seed", "5"])
    config = benchmark_entry._config(args)
    assert (config.seed, config.paper_seed) == (5, 5)
    args = benchmark_entry.build_parser().parse_args(
        ["build", "--out", "x.json", "--seed", "5", "--protocol", "csclip"])
    assert benchmark_entry._config(args).seed == 5


def test_benchmark_build_refuses_num_samples_the_world_would_ignore(tmp_path, capsys):
    err = _refused(benchmark_entry.main, ["build", "--out", str(tmp_path / "x.json"),
                                          "--num-samples", "10"], capsys)
    assert "--num-samples" in err and "paper protocol" in err


# ---- csclip demo: refusals (one helper) and the evaluation seed ------------------------

def test_demo_refuses_a_run_name_in_one_line(capsys, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    err = _refused(demo_entry.main, ["--set", "train.run.name=mine"], capsys)
    assert "train.run.name='mine'" in err and "leave it unset" in err


def test_demo_eval_seed_reaches_the_benchmark_and_suites(monkeypatch, tmp_path):
    from csclip import demo as demo_module
    from csclip.config import load_config
    from csclip.train import TrainResult

    seen = {}

    def compare_models(bundles, records, out_dir, uri, *, benchmark, suites=None, **_):
        # The world suites' draws take the benchmark's seed (csclip.eval.pipeline).
        seen.update(benchmark=benchmark.seed, suites=suites is not None)
        return type("Report", (), {"markdown": "table"})()

    # Patched where the demo looks them up (its imports are at its top).
    monkeypatch.setattr(demo_module, "compare_models", compare_models)
    monkeypatch.setattr(demo_module, "load_bundle", lambda uri: uri)
    monkeypatch.setattr(demo_module, "load_split", lambda *a, **k: [])
    demo = load_config(demo_module.DemoConfig, None, [
        "eval_seed=7", f"out_dir={tmp_path}", "train.tracking.enabled=false"])
    result = TrainResult("run", "/ckpt")
    demo_module.evaluate(demo, result, {"CS-CLIP": result})
    assert seen == {"benchmark": 7, "suites": True}

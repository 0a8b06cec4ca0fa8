"""Evaluation against the synthetic world's truth oracle, the comparison tables, MLflow
logging and the pipelines/evaluate.py entry point."""

from __future__ import annotations

import csv
import importlib.util
from collections import Counter

import pyarrow.parquet as pq
import pytest

from csclip.config import load_config
from csclip.config.eval import EvalConfig, EvalDataConfig
from csclip.config.model import ModelSource
from csclip.config.world import WorldConfig
from csclip.errors import ConfigError, DataError
from csclip.eval.halftruth import (
    CONDITIONS,
    BenchmarkConfig,
    build_half_truth_benchmark,
    build_image_side_benchmark,
    prepare_benchmark,
    save_benchmark,
)
from csclip.eval.pipeline import compare_models, evaluate_bundle, load_records, model_label
from csclip.model import create_bundle, save_checkpoint, spec_of
from csclip.units import UnitsRecord, write_units
from csclip.world import iter_world, scene_from_record
from tests.conftest import REPO_ROOT

FAST = BenchmarkConfig(num_bootstrap=50)


@pytest.fixture(scope="module")
def world_val() -> list[UnitsRecord]:
    return list(iter_world(WorldConfig(num_train=0, num_val=150, num_test=0), splits=("val",)))


@pytest.fixture(scope="module")
def tiny():
    return create_bundle("csclip-tiny")


def test_every_half_truth_is_false_and_every_completion_true(world_val):
    bench = build_half_truth_benchmark(world_val, seed=0)
    scenes = {r.image_id: scene_from_record(r) for r in world_val}
    per_condition = Counter(item.condition for item in bench.items)
    assert set(per_condition) == {c.slug for c in CONDITIONS}
    for item in bench.items:
        scene = scenes[item.image_id]
        assert scene.holds(item.anchor), item
        assert scene.holds(item.completion), item
        assert not scene.holds(item.half_truth), item


def test_image_side_target_holds_and_distractors_do_not(world_val):
    scenes = {r.image_id: scene_from_record(r) for r in world_val}
    items = build_image_side_benchmark(world_val, seed=0)
    assert len(items) > len(world_val) // 2
    for item in items:
        assert scenes[item.image_id].holds(item.text)
        for other in item.distractors:
            assert scenes[other].holds(item.shared) and not scenes[other].holds(item.text)


def test_evaluate_bundle_reports_every_metric(world_val, tiny):
    report = evaluate_bundle(tiny, world_val[:20], benchmark=FAST)
    metrics = report.metrics
    for key in [
        "ht_all",
        "ht_entity",
        "ht_relation",
        "ht_gap",
        "winrate_all",
        "consistency_all",
        "ht_all_ci_low",
        "image_side_top1",
        "image_side_mrr",
        "image_side_margin",
    ]:
        assert key in metrics
    # Acc_HT from the report's own scores: the share of items whose anchor scores strictly
    # above their half-truth. A random-init model is not at exactly 50% in every
    # condition, so a comparison the wrong way round gives other numbers.
    conditions = [item.condition for item in report.items]
    beats = report.scores.anchor > report.scores.half_truth
    expected = {}
    for condition in CONDITIONS:
        mine = [won for won, c in zip(beats, conditions, strict=True) if c == condition.slug]
        expected[condition.slug] = 100 * sum(mine) / len(mine)
        assert metrics[f"ht_{condition.slug}"] == pytest.approx(expected[condition.slug])
    assert any(value != 50 for value in expected.values())
    assert metrics["ht_all"] == pytest.approx(100 * beats.mean())
    assert metrics["ht_all_ci_low"] <= metrics["ht_all"] <= metrics["ht_all_ci_high"]
    assert metrics["num_items_all"] == len(report.items)
    assert len(report.items) + sum(report.skipped.values()) == 20 * len(CONDITIONS)


def test_compare_models_writes_tables_figure_and_logs_to_mlflow(
    world_val, tiny, tmp_path, mlflow_uri
):
    import mlflow

    bundles = {"tiny-a": tiny, "tiny-b": tiny}
    report = compare_models(
        bundles, world_val[:8], tmp_path / "out", tracking_uri=mlflow_uri, benchmark=FAST
    )
    for name in ["table1", "table6", "table7", "table7_ci", "image_side"]:
        assert (tmp_path / "out" / f"{name}.md").read_text() in report.markdown
        with open(tmp_path / "out" / f"{name}.csv") as handle:
            rows = list(csv.reader(handle))
        assert [row[0] for row in rows[1:]] == ["tiny-a", "tiny-b"]
    assert "| +Obj | +Attr | +Rand | Rel:Attr | Rel:Obj | Ant | Swap | Subj |" in report.markdown
    # Ant and Swap's win rates with their intervals, as the metrics have them.
    with open(tmp_path / "out" / "table7_ci.csv") as handle:
        header, first = list(csv.reader(handle))[:2]
    assert header == ["label", "model", "pretrained", "step", "winrate_ant", "winrate_ant_ci_low",
                      "winrate_ant_ci_high", "winrate_swap", "winrate_swap_ci_low",
                      "winrate_swap_ci_high"]
    metrics = report.reports["tiny-a"].metrics
    for key in header[4:]:  # the CSV's columns are the metric keys
        assert float(first[header.index(key)]) == pytest.approx(metrics[key])
    assert metrics["winrate_ant_ci_low"] <= metrics["winrate_ant"] <= metrics["winrate_ant_ci_high"]
    assert (tmp_path / "out" / "figure3.png").read_bytes()[:4] == b"\x89PNG"
    scores = pq.read_table(tmp_path / "out" / "scores.parquet")
    assert scores.num_rows == len(report.reports["tiny-a"].items)
    assert scores.column("tiny-b/half_truth").to_pylist() == pytest.approx(
        list(report.reports["tiny-b"].scores.half_truth)
    )
    client = mlflow.MlflowClient(mlflow_uri)
    run = client.get_run(report.mlflow_run_id)  # the parent of one run per model
    assert run.data.params["models"] == "tiny-a,tiny-b"
    children = client.search_runs([run.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run.info.run_id}'")
    model_a = next(r for r in children if r.data.tags["csclip_label"] == "tiny-a")
    assert model_a.data.metrics["ht_all"] == pytest.approx(
        report.reports["tiny-a"].metrics["ht_all"]
    )
    artifacts = {a.path for a in mlflow.MlflowClient(mlflow_uri).list_artifacts(run.info.run_id)}
    assert {"table1.md", "table6.csv", "table7.md", "figure3.png", "benchmark.parquet"} <= artifacts


def test_a_saved_benchmark_table_rescores_to_the_same_metrics(world_val, tiny, tmp_path):
    records = world_val[:10]
    built = evaluate_bundle(tiny, records, benchmark=FAST.model_copy(update={"seed": 3}))
    path = save_benchmark(built.items, tmp_path / "bench.csv")
    config = BenchmarkConfig(seed=3, num_bootstrap=50, table_uri=str(path))
    rescored = evaluate_bundle(tiny, records, benchmark=config)
    assert rescored.items == built.items
    for key in ("ht_all", "ht_gap", "winrate_all", "consistency_all", "ht_all_ci_low"):
        assert rescored.metrics[key] == pytest.approx(built.metrics[key], abs=1e-12)
    with pytest.raises(DataError, match="not in the units table"):
        evaluate_bundle(tiny, world_val[10:12], benchmark=config)


def test_records_without_images_or_foils_give_clear_errors(world_val):
    no_pixels = [
        UnitsRecord(r.sample_id, r.image_id, r.caption, r.split, r.entities, r.relations)
        for r in world_val[:3]
    ]
    with pytest.raises(DataError, match="missing_image"):
        prepare_benchmark(no_pixels, FAST)
    with pytest.raises(DataError, match="no records"):
        prepare_benchmark([], FAST)


def test_load_records_names_the_missing_split(tmp_path, world_val):
    path = tmp_path / "units.parquet"
    write_units(
        [
            UnitsRecord(
                r.sample_id,
                r.image_id,
                r.caption,
                "train",
                r.entities,
                r.relations,
                image_bytes=r.image_bytes,
            )
            for r in world_val[:2]
        ],
        str(path),
    )
    # The line says how evaluate chooses a split (it has no --split flag; a field).
    with pytest.raises(DataError, match="splits present: \\['train'\\]\\); choose one with "
                                        "--set data.split=NAME"):
        load_records(EvalDataConfig(units_uri=str(path)))
    assert len(load_records(EvalDataConfig(units_uri=str(path), split="train"))) == 2
    with pytest.raises(ConfigError):
        load_records(EvalDataConfig(split="holdout"))


def _pipeline():
    spec = importlib.util.spec_from_file_location(
        "evaluate_pipeline", REPO_ROOT / "pipelines" / "evaluate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_end_to_end_on_a_checkpoint(tmp_path, mlflow_uri, capsys, world_val, tiny):
    # A saved checkpoint, so the pipeline scores the same random weights as `tiny` here.
    checkpoint = save_checkpoint(tiny.model, spec_of(tiny.model, tiny.name), tmp_path / "ckpt")
    units = tmp_path / "units.parquet"
    write_units(world_val[:6], str(units))
    code = _pipeline().main(
        [
            "--checkpoint",
            str(checkpoint),
            "--units",
            str(units),
            "--out",
            str(tmp_path / "eval"),
            "--set",
            f"tracking.uri={mlflow_uri}",
            "--set",
            "benchmark.num_bootstrap=20",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "Table 1" in out and "MLflow run" in out
    assert {"table1.csv", "table6.md", "table7.csv", "figure3.png"} <= {
        p.name for p in (tmp_path / "eval").iterdir()
    }
    with open(tmp_path / "eval" / "table1.csv") as handle:
        row = list(csv.DictReader(handle))[0]
    expected = evaluate_bundle(tiny, world_val[:6], benchmark=FAST).metrics
    assert float(row["ht_all"]) == pytest.approx(expected["ht_all"], abs=1e-9)


def test_pipeline_flags_become_overrides():
    pipeline = _pipeline()
    args = pipeline.parse_args(
        ["--model", "ViT-B-32", "--pretrained", "openai", "--set", "out_dir=x"]
    )
    assert pipeline.overrides_from_args(args) == [
        "model.name='ViT-B-32'",
        "model.pretrained='openai'",
        "out_dir=x",
    ]
    config = load_config(EvalConfig, None, pipeline.overrides_from_args(args))
    assert (config.model.name, config.model.pretrained, config.out_dir) == (
        "ViT-B-32",
        "openai",
        "x",
    )


def test_pipeline_user_errors_are_one_line_and_exit_2(tmp_path, capsys):
    main = _pipeline().main
    assert (
        main(["--units", str(tmp_path / "missing.parquet"), "--set", "tracking.enabled=false"]) == 2
    )
    assert main(["--set", "benchmark.num_bootstrap=-1", "--set", "tracking.enabled=false"]) == 2
    assert main(["--set", "data.world.num_val=0", "--set", "tracking.enabled=false"]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 3 and all(line.startswith("error: ") for line in errors)
    assert (
        "missing.parquet" in errors[0]
        and "num_bootstrap" in errors[1]
        and "no records" in errors[2]
    )


@pytest.mark.parametrize(("pretrained", "label"), [
    ("runs/train/quick/final", "csclip-tiny:quick/final"),
    ("s3://bucket/runs/x/checkpoint_000010/", "csclip-tiny:x/checkpoint_000010"),
    ("/weights/tiny.pt", "csclip-tiny:tiny.pt"),
    ("openai", "csclip-tiny:openai"),
    (None, "csclip-tiny"),
])
def test_a_checkpoint_is_labelled_by_its_run_not_final_alone(pretrained, label):
    assert model_label(ModelSource(name="csclip-tiny", pretrained=pretrained)) == label


def test_a_missing_image_at_a_relative_path_hints_at_image_root(tmp_path, monkeypatch):
    from csclip.eval.encoder import load_image

    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError, match="give --image-root DIR"):
        load_image("images/missing.jpg")
    with pytest.raises(DataError) as absolute:  # a path given in full: nothing to hint
        load_image(str(tmp_path / "missing.jpg"))
    assert "--image-root" not in str(absolute.value)

"""Results as CLIP_benchmark users consume them: several models in one `csclip evaluate`,
one JSON per model and benchmark in CLIP_benchmark's shape and --output template, tidy
CSVs (snake_case headers, integer counts, model / pretrained / step columns), one MLflow
run per model with the same metric keys; and a setting typo refused before torch."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csclip.errors import ConfigError

REPO = Path(__file__).resolve().parents[1]

# The tiny world (4 images), half-truth and retrieval over its records only.
TINY = ["--set", "model.image_size=32", "--set", "data.world.num_val=4",
        "--set", "data.world.image_size=32", "--set", "benchmark.num_bootstrap=0",
        "--set", "benchmark.image_side=false", "--set", "suites.num_world_pairs=0",
        "--set", "suites.num_zeroshot_items=0"]
# CLIP_benchmark's dump (tests/test_clip_benchmark_build.py runs its build over one)
RESULT_KEYS = {"dataset", "model", "pretrained", "task", "metrics", "language"}
SNAKE = re.compile(r"[a-z0-9_]+")


def _checkpoints(root: Path) -> tuple[Path, Path]:
    """Two tiny checkpoints with different weights: one named by its step, one `final`
    with the step in its metrics.json (as csclip.train writes them)."""
    import torch

    from csclip.model import create_bundle, save_checkpoint, spec_of

    paths = (root / "a" / "checkpoint_000005", root / "b" / "final")
    for seed, path in enumerate(paths):
        torch.manual_seed(seed)
        bundle = create_bundle("csclip-tiny", image_size=32)
        save_checkpoint(bundle.model, spec_of(bundle.model, bundle.name), path)
    (paths[1] / "metrics.json").write_text(json.dumps({"step": 7}))
    return paths


def test_two_models_write_one_result_per_model_and_benchmark_and_two_mlflow_runs(
        tmp_path, mlflow_uri, capsys):
    import mlflow

    from csclip.entry.evaluate import main
    from csclip.eval.report import EVALUATION_COMPLETE, check_evaluation

    first, second = _checkpoints(tmp_path)
    out = tmp_path / "eval"
    argv = ["--model", "csclip-tiny", "--pretrained", str(first), str(second), *TINY,
            "--set", f"tracking.uri={mlflow_uri}", "--out", str(out),
            "--output", "{dataset}/{model}_{pretrained}_{task}.json"]
    assert main(argv) == 0
    capsys.readouterr()
    check_evaluation(out)  # the results are listed in the marker, written last
    listed = json.loads((out / EVALUATION_COMPLETE).read_text())["files"]
    tasks = {"halftruth": "half_truth", "retrieval": "zeroshot_retrieval"}
    results = {}
    for dataset, task in tasks.items():
        for checkpoint in (first, second):
            name = f"{dataset}/csclip-tiny_{checkpoint.name}_{task}.json"
            assert name in listed
            results[dataset, checkpoint.name] = json.loads((out / name).read_text())
    assert sorted(p.name for p in (out / "halftruth").iterdir()) == [
        "csclip-tiny_checkpoint_000005_half_truth.json", "csclip-tiny_final_half_truth.json"]
    for (dataset, name), result in results.items():
        assert set(result) == RESULT_KEYS
        assert (result["dataset"], result["model"], result["task"]) == (
            dataset, "csclip-tiny", tasks[dataset])
        assert Path(result["pretrained"]).name == name
    # Plain keys: no model name, no benchmark prefix; not measured is null (strict JSON);
    # retrieval under CLIP_benchmark's names, as fractions.
    halftruth = results["halftruth", "final"]["metrics"]
    assert 0 <= halftruth["ht_all"] <= 100 and halftruth["ht_all_ci_low"] is None
    retrieval = results["retrieval", "final"]["metrics"]
    assert {"text_retrieval_recall@1", "image_retrieval_recall@5"} <= set(retrieval)
    assert isinstance(retrieval["num_images"], int)
    assert set(results["halftruth", "final"]["metrics"]) == set(
        results["halftruth", "checkpoint_000005"]["metrics"])

    # The CSVs: snake_case headers, the model's identity and step, counts as integers.
    with (out / "table1.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0])[:5] == ["label", "model", "pretrained", "step", "ht_entity"]
    assert [(r["model"], Path(r["pretrained"]).name, r["step"]) for r in rows] == [
        ("csclip-tiny", "checkpoint_000005", "5"), ("csclip-tiny", "final", "7")]
    assert rows[1]["num_items_all"] == str(int(halftruth["num_items_all"]))
    assert float(rows[1]["ht_all"]) == pytest.approx(halftruth["ht_all"])

    # MLflow: one run per model, the same metric keys, tagged with model and pretrained,
    # nested under one run holding the comparison's tables.
    client = mlflow.MlflowClient(mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("csclip-eval").experiment_id])
    models = {r.data.tags["csclip_label"]: r for r in runs
              if r.data.tags.get("csclip_role") == "model"}
    # Each labelled by its run's folder and checkpoint, not "final" alone nor a full path.
    assert sorted(models) == ["csclip-tiny:a/checkpoint_000005", "csclip-tiny:b/final"]
    first_run, second_run = models.values()
    assert set(first_run.data.metrics) == set(second_run.data.metrics)
    assert "ht_all" in first_run.data.metrics
    final = models["csclip-tiny:b/final"]
    assert final.info.run_name == "csclip-tiny:b/final on halftruth, retrieval"
    assert (final.data.tags["model"], final.data.tags["pretrained"], final.data.tags["step"]) \
        == ("csclip-tiny", str(second), "7")
    assert final.data.metrics["ht_all"] == pytest.approx(halftruth["ht_all"])
    parent = {r.data.tags["mlflow.parentRunId"] for r in models.values()}
    assert len(parent) == 1
    artifacts = {a.path for a in client.list_artifacts(parent.pop())}
    assert {"table1.csv", "figure3.png", "halftruth"} <= artifacts


def test_model_pairs_follow_clip_benchmark(tmp_path):
    from csclip.entry.evaluate import model_pairs, overrides_from_args, parse_args

    args = parse_args(["--model", "A", "B", "--model", "C", "--pretrained", "x", "--pretrained",
                       "y"])
    assert model_pairs(args) == [("A", "x"), ("A", "y"), ("B", "x"), ("B", "y"), ("C", "x"),
                                 ("C", "y")]
    assert not any(o.startswith("model.") for o in overrides_from_args(args))
    listing = tmp_path / "models.txt"
    listing.write_text("ViT-B-32,openai\n\n# a comment\nViT-B-16, laion2b_s34b_b79k\n")
    args = parse_args(["--pretrained-model", str(listing), "RN50,yfcc15m"])
    assert model_pairs(args) == [("ViT-B-32", "openai"), ("ViT-B-16", "laion2b_s34b_b79k"),
                                 ("RN50", "yfcc15m")]
    # One model is the single-model config, as before.
    args = parse_args(["--model", "ViT-B-32", "--pretrained", "openai", "--output", "{model}.json"])
    assert overrides_from_args(args) == ["model.name='ViT-B-32'", "model.pretrained='openai'",
                                         "results_template='{model}.json'"]
    listing.write_text("ViT-B-32 openai\n")
    with pytest.raises(ConfigError, match=r"models.txt: 'ViT-B-32 openai' is not "
                                          r"'model,pretrained'"):
        model_pairs(parse_args(["--pretrained-model", str(listing)]))
    listing.write_text("# nothing yet\n")  # never the default model in its place
    with pytest.raises(ConfigError, match="no 'model,pretrained' line"):
        model_pairs(parse_args(["--pretrained-model", str(listing)]))


def test_result_names_as_clip_benchmark_formats_them():
    from csclip.config.eval import DEFAULT_RESULTS_TEMPLATE
    from csclip.eval.report import (
        ModelIdentity,
        benchmark_results,
        check_results_template,
        result_name,
    )

    tag = ModelIdentity("ViT-B-32", "openai")
    assert result_name(DEFAULT_RESULTS_TEMPLATE, tag, "sugarcrepe", "image_caption_selection") \
        == "sugarcrepe_openai_ViT-B-32_image_caption_selection.json"
    checkpoint = ModelIdentity("csclip-tiny", "runs/x/final", 20)
    assert result_name("{pretrained}|{pretrained_full_path}|{dataset}", checkpoint, "a/b", "t") \
        == "final|runs_x_final|a_b"
    # Two checkpoints both .../final: refused before anything is scored, with the fix.
    other = ModelIdentity("csclip-tiny", "runs/y/final", 20)
    with pytest.raises(ConfigError, match="pretrained_full_path"):
        check_results_template(DEFAULT_RESULTS_TEMPLATE, [checkpoint, other])
    check_results_template("{dataset}_{pretrained_full_path}.json", [checkpoint, other])
    with pytest.raises(ConfigError, match="'language' is not a field"):
        result_name("{dataset}_{language}.json", tag, "a", "t")
    with pytest.raises(ConfigError, match="relative to --out"):
        result_name("../{dataset}.json", tag, "a", "t")
    # Each key to the benchmark that measured it; a longer name keeps its own keys.
    split = benchmark_results({"ht_all": 1.0, "sugarcrepe_i2t": 2.0, "sugarcrepe_pp_i2t": 3.0,
                               "coco_ret_t2i": 4.0, "zs_world_avg": 5.0, "zs_cifar10": 6.0,
                               "comp_group": 7.0, "suite_i2t": 8.0, "cap_entity_i2t": 9.0})
    assert split == {
        "coco_retrieval": ("zeroshot_retrieval", {"t2i": 4.0}),
        "halftruth": ("half_truth", {"ht_all": 1.0}),
        "suite": ("image_caption_selection", {"i2t": 8.0, "entity_i2t": 9.0}),
        "sugarcrepe": ("image_caption_selection", {"i2t": 2.0}),
        "sugarcrepe_pp": ("image_caption_selection", {"i2t": 3.0}),
        "world_pairs": ("image_caption_selection", {"group": 7.0}),
        "world_zeroshot": ("zeroshot_classification", {"avg": 5.0}),
        "zeroshot": ("zeroshot_classification", {"cifar10": 6.0}),
    }


def test_every_csv_header_is_snake_case_and_counts_are_integers(tmp_path):
    from csclip.eval.report import HalfTruthReport, ModelIdentity, paper_tables

    metrics = {"ht_all": 50.0, "num_items_all": 4000.0, "image_side_num_items": 12.0,
               "comp_i2t": 60.0, "aro_vg_relation_i2t": 55.0, "aro_vg_relation_num": 10.0,
               "aro_vg_relation_read": 11.0, "aro_vg_relation_skipped": 1.0, "aro_i2t": 55.0,
               "cap_relational_i2t": 55.0, "suite_i2t": 55.0}
    report = HalfTruthReport("m", metrics, (), None, identity=ModelIdentity("ViT-B-32", "openai"))
    tables = paper_tables({"m": report})
    assert {"table1", "suites", "benchmarks", "capabilities", "image_side"} <= set(tables)
    for stem, table in tables.items():
        table.write(tmp_path, stem, {"m": report.identity})
        with (tmp_path / f"{stem}.csv").open() as handle:
            header, *rows = list(csv.reader(handle))
        assert all(SNAKE.fullmatch(h) for h in header), (stem, header)
        assert header[:4] == ["label", "model", "pretrained", "step"]
        assert rows[0][:4] == ["m", "ViT-B-32", "openai", ""]
        assert "| Model |" in (tmp_path / f"{stem}.md").read_text()  # human headers stay
    table1 = next(csv.DictReader((tmp_path / "table1.csv").open()))
    assert table1["num_items_all"] == "4000" and table1["ht_all"] == "50.0"
    row = next(csv.DictReader((tmp_path / "benchmarks.csv").open()))
    assert (row["num_read"], row["num_scored"], row["num_skipped"]) == ("11", "10", "1")


def test_an_evaluate_setting_typo_is_refused_with_its_near_miss_before_torch():
    code = ("import sys\nfrom csclip.cli import main\ncode = main(sys.argv[1:])\n"
            "print('torch imported' if 'torch' in sys.modules else 'no torch')\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code, "evaluate", "--set", "benchmark.sed=1"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith(
        "unknown setting benchmark.sed (did you mean benchmark.seed?)"), done.stderr
    assert done.stdout.strip() == "no torch"


def test_an_evaluation_leaves_none_of_the_previous_ones_files_in_out(tmp_path, capsys):
    from csclip.entry.evaluate import main

    out = tmp_path / "eval"
    base = ["--model", "csclip-tiny", *TINY, "--set", "tracking.enabled=false", "--out", str(out)]
    assert main([*base, "--output", "{dataset}_before_{task}.json"]) == 0
    assert list(out.glob("*_before_*.json"))
    (out / "mine.txt").write_text("a file of the user's, not listed by the evaluation")
    assert main(base) == 0
    capsys.readouterr()
    # CLIP_benchmark's build reads every JSON of the folder: only this evaluation's remain.
    assert not list(out.glob("*_before_*.json"))
    assert {p.name for p in out.glob("*.json")} == {
        "halftruth_random_csclip-tiny_half_truth.json",
        "retrieval_random_csclip-tiny_zeroshot_retrieval.json"}
    assert (out / "mine.txt").exists()


def test_a_value_not_measured_is_n_a_in_markdown_and_empty_in_csv_never_nan(tmp_path):
    from csclip.eval.report import Table

    # A CI without bootstrap (benchmark.num_bootstrap=0) is NaN in the metrics.
    table = Table("t", ("Model", "Overall", "CI low", "Items"), (("m", 50.0, float("nan"), 4.0),),
                  ("", "acc", "acc", "int"), ("label", "ht_all", "ht_all_ci_low", "num_items"))
    files = table.write(tmp_path, "t")
    assert "| m | 50.0 | n/a | 4 |" in files["t.md"].read_text()
    assert files["t.csv"].read_text().splitlines()[1] == "m,,,,50.0,,4"

"""The named suites end to end: every fixture benchmark from the entry point (tables
written, one line per missing suite), the same metrics from an s3:// copy, and the
ablation table's columns on real-data metric keys."""

from __future__ import annotations

import csv
import importlib.util
import logging

import pytest
from suites_helpers import FIXTURES, ColorScorer

from csclip.config.eval import SUITE_NAMES
from csclip.eval.encoder import Encoder
from csclip.eval.suites.registry import evaluate_benchmarks
from tests.conftest import REPO_ROOT


def _main():
    spec = importlib.util.spec_from_file_location("evaluate_entry", REPO_ROOT / "pipelines" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def test_entry_point_runs_every_suite_and_names_missing_ones(tmp_path, capsys, caplog):
    common = ["--model", "csclip-tiny", "--set", "tracking.enabled=false",
              "--set", "benchmark.num_bootstrap=10", "--set", "data.world.num_val=12",
              "--set", "suites.num_world_pairs=4", "--set", "suites.num_zeroshot_items=12"]
    main = _main()
    out = tmp_path / "eval"
    # The fixtures leave some images out on purpose (counted skips): --allow-partial.
    # The paper's ZS / Retr suites have their fixtures written at test time and their own
    # evaluate runs (tests/test_zeroshot_paper.py, tests/test_flickr8k.py).
    names = [n for n in SUITE_NAMES if n not in ("zeroshot_paper", "flickr8k_retrieval")]
    assert main([*common, "--out", str(out), "--suite", ",".join(names),
                 "--data-root", str(FIXTURES), "--allow-partial"]) == 0
    printed = capsys.readouterr().out
    assert "Compositional benchmarks" in printed and "Compositional capabilities" in printed
    with open(out / "benchmarks.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["benchmark"] for r in rows} == set(names) - {"coco_retrieval",
                                                           "flickr30k_retrieval", "zeroshot"}
    with open(out / "suites.csv") as handle:
        suites = list(csv.DictReader(handle))[0]
    for column in ("suite_i2t", "suite_t2i", "suite_group", "zs_world_avg", "zs_avg",
                   "coco_ret_i2t"):
        assert 0.0 <= float(suites[column]) <= 100.0, column
    # Named suites not under --data-root are refused (one line), unless --allow-missing.
    assert main([*common, "--out", str(tmp_path / "none"), "--suite", "winoground,zeroshot",
                 "--data-root", str(tmp_path / "empty")]) == 2
    assert "2 of 2 named suites not found" in capsys.readouterr().err
    caplog.clear()
    caplog.set_level(logging.WARNING)
    assert main([*common, "--out", str(tmp_path / "none"), "--suite", "winoground,zeroshot",
                 "--data-root", str(tmp_path / "empty"), "--allow-missing"]) == 0
    lines = [r.getMessage() for r in caplog.records if "; skipped" in r.getMessage()]
    assert [line.split(":")[0] for line in lines] == ["winoground", "zeroshot"]
    assert all(str(tmp_path / "empty") in line and "expects" in line for line in lines)
    assert main([*common, "--suite", "imagenet", "--data-root", "x"]) == 2
    assert "unknown suites" in capsys.readouterr().err


def test_benchmarks_read_from_s3_equal_local(s3_endpoint, monkeypatch):
    from s3_helpers import fresh_bucket

    names = ["winoground", "whatsup", "valse"]
    with fresh_bucket(s3_endpoint, monkeypatch, "coco") as client:
        for benchmark in names:
            for path in (FIXTURES / benchmark).rglob("*"):
                if path.is_file():
                    key = f"bench/{path.relative_to(FIXTURES)}"
                    client.put_object(Bucket="coco", Key=key, Body=path.read_bytes())
        remote = evaluate_benchmarks(Encoder(ColorScorer()), names, "s3://coco/bench",
                                     allow_partial=True)
    local = evaluate_benchmarks(Encoder(ColorScorer()), names, str(FIXTURES), allow_partial=True)
    assert remote == local and local["winoground_i2t"] == pytest.approx(200 / 3)


def test_ablation_columns_prefer_real_data_suites():
    from csclip.ablation.report import TABLE_COLUMNS, column_value

    columns = dict(TABLE_COLUMNS)
    world = {"comp_i2t": 10.0, "zs_world_avg": 30.0, "ret_i2t": 40.0}
    real = {**world, "suite_i2t": 55.0, "zs_avg": 60.0, "coco_ret_i2t": 70.0}
    assert [column_value(world, columns[c]) for c in ("I2T", "ZS", "Ret I2T")] == [10, 30, 40]
    assert [column_value(real, columns[c]) for c in ("I2T", "ZS", "Ret I2T")] == [55, 60, 70]


def test_ablate_checks_suites_before_starting_ray(capsys):
    spec = importlib.util.spec_from_file_location("ablate_entry", REPO_ROOT / "tune" / "ablate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--grid", "lr=1e-3", "--suite", "aro,imagenet", "--data-root", "x"]) == 2
    error = capsys.readouterr().err
    assert "unknown suites ['imagenet']" in error and error.count("\n") == 1


def test_no_world_evaluates_the_named_suite_alone(tmp_path, capsys):
    # As CLIP_benchmark evaluates one dataset: the suite's table and results, no synthetic
    # world generated and no half-truth benchmark built or written.
    out = tmp_path / "eval"
    assert _main()(["--model", "csclip-tiny", "--set", "model.image_size=32",
                    "--set", "tracking.enabled=false", "--no-world", "--suite", "sugarcrepe",
                    "--data-root", str(FIXTURES), "--allow-partial", "--out", str(out)]) == 0
    assert "Compositional benchmarks" in capsys.readouterr().out
    written = {p.name for p in out.iterdir() if not p.name.startswith(".")}
    assert "benchmarks.csv" in written
    assert not {"table1.csv", "figure3.png", "benchmark.parquet", "scores.parquet"} & written
    results = sorted(p.name for p in out.glob("*.json"))
    assert results and all(name.startswith("sugar_crepe_") for name in results), results


@pytest.mark.parametrize(("extra", "says"), [
    ([], "leaves nothing to evaluate"),
    (["--units", "u.parquet"], "data.units_uri (--units)"),
    (["--suite", "aro", "--data-root", "x", "--protocol", "paper"], "benchmark.protocol"),
])
def test_no_world_without_a_suite_or_with_records_is_one_line(extra, says, capsys):
    assert _main()(["--no-world", "--set", "tracking.enabled=false", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and says in err[0], err

"""Ray Tune ablations: grid specs, table layout, results-doc markers, and a real 2-trial
sweep (tiny world) with MLflow parent/child runs and resume."""

from __future__ import annotations

import csv
import io
import subprocess
import sys

import pytest

from csclip import tune
from csclip.errors import ConfigError

PAPER_COLUMNS = ["I2T", "T2I", "Grp", "HT All", "HT Ent", "HT Rel", "ZS", "Ret I2T", "Ret T2I"]


def test_tune_grid_code_does_not_import_ray():
    code = ("import sys, csclip.tune as t; t.parse_grid(['lr,units']); "
            "assert 'ray' not in sys.modules and 'mlflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parse_grid_names_and_explicit_values():
    specs = tune.parse_grid(["lr,units", "relfrac=0,0.5", "wd=1e-2"])
    assert [s.axis for s in specs] == ["lr", "units", "relfrac", "wd"]
    assert specs[0].values is None and specs[1].values is None
    assert specs[2].values == (0, 0.5)
    assert specs[3].values == (0.01,)  # "1e-2" read as a number, not a string


@pytest.mark.parametrize("tokens, message", [
    (["foo"], "unknown axis 'foo'; choose from lr, units"),
    (["lr,foo"], "unknown axis 'foo'"),
    (["lr", "lr=1e-6"], "axis 'lr' is given twice"),
    (["units="], "empty value"),
    (["units=1,,2"], "empty value"),
])
def test_bad_grid_spec_is_refused_by_name(tokens, message):
    with pytest.raises(ConfigError, match=message):
        tune.parse_grid(tokens)


def test_format_value_is_paper_style():
    assert [tune.format_value(v) for v in (1e-5, 5e-4, 2.5e-4, 0.25, 1.0, 2)] == [
        "1e-5", "5e-4", "2.5e-4", "0.25", "1", "2"]


def _grid_and_metrics():
    specs = (tune.AxisSpec("units", (1, 2)), tune.AxisSpec("lr", (1e-6,)))
    base = tune.Setting()
    n1 = tune.Setting((("units", 1),))
    lr = tune.Setting((("lr", 1e-6),))
    rows = (tune.Row("N 1", "units", 1, n1, False), tune.Row("N 2", "units", 2, base, True),
            tune.Row("lr 1e-6", "lr", 1e-6, lr, False))
    grid = tune.Grid(specs, False, (base, n1, lr), rows)
    metrics = {"base": {"ht_all": 70.0, "ht_entity": 75.5, "ht_relation": 65.25,
                        "ret_i2t": 50.0},
               "units=1": {"ht_all": 60.0, "ht_entity": 62.0, "ht_relation": 58.0}}
    return grid, metrics


def test_table_has_paper_columns_and_missing_is_not_zero():
    grid, metrics = _grid_and_metrics()
    table = tune.build_table(grid, metrics, {"lr=1e-6": "failed"})
    lines = table.markdown().splitlines()
    assert lines[0] == "| setting | " + " | ".join(PAPER_COLUMNS) + " |"
    assert lines[2] == "| N 1 | — | — | — | 60.0 | 62.0 | 58.0 | — | — | — |"
    assert lines[3] == "| **N 2** (base) | — | — | — | 70.0 | 75.5 | 65.2 | — | 50.0 | — |"
    assert lines[4].startswith("| lr 1e-6 (failed) | — |")
    rows = list(csv.DictReader(io.StringIO(table.csv())))
    assert [r["setting"] for r in rows] == ["N 1", "N 2", "lr 1e-6"]
    assert rows[1]["is_base"] == "True" and rows[1]["trial"] == "base"
    assert rows[0]["I2T"] == "" and rows[0]["HT All"] == "60.00"  # missing is empty, not 0
    assert rows[2]["status"] == "failed" and rows[2]["HT All"] == ""


def test_report_files_and_plot(tmp_path):
    grid, metrics = _grid_and_metrics()
    files = tune.write_report(tune.build_table(grid, metrics), tmp_path / "rep", "t")
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| setting | I2T |" in files.markdown.read_text()
    assert files.csv.read_text().startswith("setting,axis,value,trial,is_base,status,I2T")


def test_marked_section_replaces_only_its_own_text(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n<!-- BEGIN demo -->\ndemo text\n<!-- END demo -->\n")
    tune.update_marked_section(doc, "ablation", "first table")
    tune.update_marked_section(doc, "ablation", "second table")
    text = doc.read_text()
    assert "demo text" in text and "second table" in text and "first table" not in text
    assert text.count("<!-- BEGIN ablation -->") == 1
    doc.write_text("<!-- END ablation --> x <!-- BEGIN ablation -->")
    with pytest.raises(ConfigError, match="unbalanced"):
        tune.update_marked_section(doc, "ablation", "t")


def test_max_concurrent_trials_from_cluster():
    assert tune.max_concurrent_trials({"CPU": 2}, num_workers=1, use_gpu=False) == 1
    assert tune.max_concurrent_trials({"CPU": 16}, num_workers=1, use_gpu=False) == 12
    assert tune.max_concurrent_trials({"CPU": 64, "GPU": 8}, num_workers=2, use_gpu=True) == 4
    assert tune.max_concurrent_trials({"CPU": 64}, num_workers=2, use_gpu=True) == 1


def test_absolute_uri():
    assert tune.absolute_uri("s3://b/k") == "s3://b/k"
    assert tune.absolute_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert tune.absolute_uri("sqlite:///m.db").startswith("sqlite:////")
    assert tune.absolute_uri("runs").startswith("/")

"""Ray Tune ablations: grid specs, table layout, results-doc markers, and a real 2-trial
sweep (tiny world) with MLflow parent/child runs and resume."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from csclip.ablation import grid as grids
from csclip.ablation import report as reports
from csclip.ablation import sweep as sweeps
from csclip.ablation.grid import slugify
from csclip.ablation.trial import evaluate_trial
from csclip.errors import ConfigError
from csclip.markdoc import update_marked_section

REPO_ROOT = Path(__file__).resolve().parents[1]
PAPER_COLUMNS = ["I2T", "T2I", "Grp", "HT All", "HT Ent", "HT Rel", "ZS", "Ret I2T", "Ret T2I"]
# The same columns in ablation.csv: snake_case, as the evaluation's CSVs.
CSV_COLUMNS = ["i2t", "t2i", "group", "ht_all", "ht_entity", "ht_relation", "zs", "ret_i2t",
               "ret_t2i"]


def test_tune_grid_code_does_not_import_ray():
    code = ("import sys, csclip.ablation.grid as g, csclip.ablation.report; "
            "g.parse_grid(['lr,units']); "
            "assert 'ray' not in sys.modules and 'mlflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_parse_grid_names_and_explicit_values():
    specs = grids.parse_grid(["lr,units", "relfrac=0,0.5", "wd=1e-2"])
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
        grids.parse_grid(tokens)


def test_format_value_is_paper_style():
    assert [grids.format_value(v) for v in (1e-5, 5e-4, 2.5e-4, 0.25, 1.0, 2)] == [
        "1e-5", "5e-4", "2.5e-4", "0.25", "1", "2"]


def _grid_and_metrics():
    specs = (grids.AxisSpec("units", (1, 2)), grids.AxisSpec("lr", (1e-6,)))
    base = grids.Setting()
    n1 = grids.Setting((("units", 1),))
    lr = grids.Setting((("lr", 1e-6),))
    rows = (grids.Row("N 1", "units", 1, n1, False), grids.Row("N 2", "units", 2, base, True),
            grids.Row("lr 1e-6", "lr", 1e-6, lr, False))
    grid = grids.Grid(specs, False, (base, n1, lr), rows)
    metrics = {"base": {"ht_all": 70.0, "ht_entity": 75.5, "ht_relation": 65.25,
                        "ret_i2t": 50.0},
               "units=1": {"ht_all": 60.0, "ht_entity": 62.0, "ht_relation": 58.0}}
    return grid, metrics


def test_table_has_paper_columns_and_missing_is_not_zero():
    grid, metrics = _grid_and_metrics()
    table = reports.build_table(grid, metrics, {"lr=1e-6": "failed"})
    lines = table.markdown().splitlines()
    assert lines[0] == "| setting | " + " | ".join(PAPER_COLUMNS) + " |"
    assert lines[2] == "| N 1 | — | — | — | 60.0 | 62.0 | 58.0 | — | — | — |"
    assert lines[3] == "| **N 2** (base) | — | — | — | 70.0 | 75.5 | 65.2 | — | 50.0 | — |"
    assert lines[4].startswith("| lr 1e-6 (failed) | — |")
    rows = list(csv.DictReader(io.StringIO(table.csv())))
    assert [r["setting"] for r in rows] == ["N 1", "N 2", "lr 1e-6"]
    assert rows[1]["is_base"] == "true" and rows[1]["trial"] == "base"
    assert rows[0]["i2t"] == "" and rows[0]["ht_all"] == "60.00"  # missing is empty, not 0
    assert rows[2]["status"] == "failed" and rows[2]["ht_all"] == ""
    # Tidy: snake_case headers (no spaces, no Δ), an integer axis value as an integer.
    header = table.csv().splitlines()[0].split(",")
    assert header == ["setting", "axis", "value", "trial", "is_base", "status", *CSV_COLUMNS]
    assert all(re.fullmatch(r"[a-z0-9_]+", name) for name in header)
    assert [r["value"] for r in rows] == ["1", "2", "1e-06"]


def test_report_files_and_plot(tmp_path, monkeypatch):
    from matplotlib.figure import Figure

    saved = []  # the figure as it is saved: what the PNG shows
    original = Figure.savefig

    def savefig(figure, *args, **kwargs):
        saved.append(figure)
        return original(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    grid, metrics = _grid_and_metrics()
    files = reports.write_report(reports.build_table(grid, metrics), tmp_path / "rep", "t")
    assert files.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # One panel per axis; on the units panel, each half-truth column over N = 1, 2 and
    # the base (N 2) marked; the lr row has no metrics, so its points are gaps, not 0.
    (figure,) = saved
    units, lr = figure.axes[:2]
    curves = {line.get_label(): line.get_xydata().tolist() for line in units.get_lines()
              if not line.get_label().startswith("_")}
    assert curves == {"HT All": [[0, 60.0], [1, 70.0]], "HT Ent": [[0, 62.0], [1, 75.5]],
                      "HT Rel": [[0, 58.0], [1, 65.25]]}
    assert [t.get_text() for t in units.get_xticklabels()] == ["1", "2"]
    base_lines = [line for line in units.get_lines() if line.get_linestyle() == ":"]
    assert [line.get_xdata()[0] for line in base_lines] == [1]
    lr_points = [line.get_ydata() for line in lr.get_lines() if line.get_label() == "HT All"]
    assert len(lr_points) == 1 and all(y != y for y in lr_points[0])  # NaN
    assert "| setting | I2T |" in files.markdown.read_text()
    assert files.csv.read_text().startswith("setting,axis,value,trial,is_base,status,i2t")


def test_marked_section_replaces_only_its_own_text(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\n<!-- BEGIN demo -->\ndemo text\n<!-- END demo -->\n")
    update_marked_section(doc, "ablation", "first table")
    update_marked_section(doc, "ablation", "second table")
    text = doc.read_text()
    assert "demo text" in text and "second table" in text and "first table" not in text
    assert text.count("<!-- BEGIN ablation -->") == 1
    doc.write_text("<!-- END ablation --> x <!-- BEGIN ablation -->")
    with pytest.raises(ConfigError, match="unbalanced"):
        update_marked_section(doc, "ablation", "t")


def test_a_section_written_inside_another_writers_markers_is_not_deleted(tmp_path):
    # docs/performance.md once had a benchmark's section pasted inside the demo's block,
    # and `csclip demo --publish` replaced the block, the section with it.
    doc = tmp_path / "performance.md"
    text = ("# Performance\n\n<!-- BEGIN demo-stages -->\n## Split coordinators\n\ntable\n\n"
            "## The demo, stage by stage\n\nold stages\n<!-- END demo-stages -->\n")
    doc.write_text(text)
    with pytest.raises(ConfigError, match="would delete '## Split coordinators'.*Move that text"):
        update_marked_section(doc, "demo-stages", "## The demo, stage by stage\n\nnew stages")
    assert doc.read_text() == text
    # Its own heading renamed is still its own: one section replaced by one.
    doc.write_text(text.replace("## Split coordinators\n\ntable\n\n", ""))
    update_marked_section(doc, "demo-stages", "## The demo, by stage\n\nnew stages")
    assert "new stages" in doc.read_text() and "old stages" not in doc.read_text()


def test_max_concurrent_trials_from_cluster():
    assert sweeps.max_concurrent_trials({"CPU": 2}, num_workers=1, use_gpu=False) == 1
    assert sweeps.max_concurrent_trials({"CPU": 16}, num_workers=1, use_gpu=False) == 12
    assert sweeps.max_concurrent_trials({"CPU": 64, "GPU": 8}, num_workers=2, use_gpu=True) == 4
    assert sweeps.max_concurrent_trials({"CPU": 64}, num_workers=2, use_gpu=True) == 1


def test_absolute_uri():
    assert sweeps.absolute_uri("s3://b/k") == "s3://b/k"
    assert sweeps.absolute_uri("sqlite:////abs/m.db") == "sqlite:////abs/m.db"
    assert sweeps.absolute_uri("sqlite:///m.db").startswith("sqlite:////")
    assert sweeps.absolute_uri("runs").startswith("/")


# ---------------------------------------------------------------------------------------
# Real sweeps: TrainConfig validation, and a 2-trial grid on the tiny world
# ---------------------------------------------------------------------------------------

def tiny_config(tmp_path, mlflow_uri: str):
    from csclip.config import load_config
    from csclip.config.train import TrainConfig

    return load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32",
        "data.world.image_size=32", "data.world.num_train=16", "data.world.num_val=12",
        "data.world.num_test=0", "data.batch_size=8", "data.shuffle_buffer=0",
        "optim.max_steps=2", "optim.warmup_steps=0", "optim.lr=1e-4",
        "run.checkpoint_every=2", "run.log_every=1", f"run.storage_path={tmp_path / 'runs'}",
        f"tracking.uri={mlflow_uri}", "tracking.experiment=tune-test",
    ])


@pytest.mark.parametrize("grid, message", [
    (["lr=abc"], "--grid lr=abc: invalid optim.lr: Input should be a valid number"),
    (["units=0"], "--grid units=0: invalid sampling.num_unit_slots: Input should be greater"),
    (["relfrac=1.5"], "sampling.relation_prob: Input should be less than or equal to 1"),
])
def test_bad_grid_values_are_refused_through_train_config(tmp_path, mlflow_uri, grid, message):
    with pytest.raises(ConfigError, match=message):
        grids.expand_grid(tiny_config(tmp_path, mlflow_uri), grids.parse_grid(grid))


def test_one_at_a_time_shares_the_base_and_lr_defaults_scale_the_base(tmp_path, mlflow_uri):
    base = tiny_config(tmp_path, mlflow_uri)
    grid = grids.expand_grid(base, grids.parse_grid(["lr,units"]))
    # lr 0.2x/0.4x/1x/2x of 1e-4, N 1..4; the base (lr 1e-4, N 2) is one shared trial.
    assert [s.key for s in grid.settings] == [
        "base", "lr=2e-5", "lr=4e-5", "lr=2e-4", "units=1", "units=3", "units=4"]
    assert [r.label for r in grid.rows if r.is_base] == ["lr 1e-4", "N 2"]
    full = grids.expand_grid(base, grids.parse_grid(["lr=1e-4,1e-3", "units=1,2"]), full=True)
    assert sorted(s.key for s in full.settings) == ["base", "lr=1e-3", "lr=1e-3,units=1",
                                                    "units=1"]
    assert grids.sweep_name(base, grid) == grids.sweep_name(base, grid)
    assert grids.sweep_name(base, grid) != grids.sweep_name(base, full)


@pytest.mark.parametrize("argv", [["--grid", "foo"], ["--grid", "lr=abc"],
                                  ["--grid", "units=0"]])
def test_entry_point_refuses_bad_grid_with_one_line_and_exit_2(argv, capsys):
    sys.path.insert(0, str(REPO_ROOT / "tune"))
    import ablate

    assert ablate.main(["--config", str(REPO_ROOT / "configs" / "default.yaml"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --grid")


class EvaluationInterruptedOnce:
    """A trial evaluation that fails once for `setting` (after its training, before its
    evaluation; a marker file makes it fail only the first time), then evaluates as usual:
    stands in for an interrupted sweep."""

    def __init__(self, marker_dir: str, setting: str) -> None:
        self.marker, self.setting = Path(marker_dir) / "failed", setting

    def __call__(self, config, checkpoint_uri: str, seed: int):
        if config.run.name.endswith(slugify(self.setting)) and not self.marker.exists():
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self.marker.write_text("interrupted on purpose\n")
            raise RuntimeError(f"trial {self.setting}: interrupted on purpose")
        return evaluate_trial(config, checkpoint_uri, seed)


def _child_runs(mlflow_uri: str, parent_id: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_uri)
    experiment = client.get_experiment_by_name("tune-test")
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")
    return client, {r.data.tags["csclip_setting"]: r for r in runs}


@pytest.mark.slow
def test_two_trial_sweep_logs_parent_and_children_and_resumes(tmp_path, mlflow_uri,
                                                              ray_session):
    # Two of the authors' rows (--grid paper=units-1,units-3) on the tiny world, with their
    # checkpoint selection: each trial keeps two checkpoints and is evaluated at the one
    # with the highest I2T (the expansion of the other rows is
    # test_paper_grid_selection_and_relative_rows').
    base = grids.with_values(tiny_config(tmp_path, mlflow_uri),
                             {"run.checkpoint_every": 1, "run.num_to_keep": 4}, origin="test")
    grid = grids.expand_paper_grid(base, grids.parse_paper_grid(["paper=units-1,units-3"]))
    assert [s.key for s in grid.settings] == ["units=1", "units=3"]

    # First run: trial units=1 fails after training, before evaluation (stands in for an
    # interrupted sweep).
    # Ray workers cannot import this test module: ship its functions by value.
    ray_session.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    interrupted = EvaluationInterruptedOnce(str(tmp_path / "markers"), "units=1")
    first = sweeps.run_sweep(base, grid, max_concurrent=2, evaluate=interrupted,
                             select="paper")
    assert not first.resumed and set(first.errors) == {"units=1"}
    assert first.name.startswith("ablate-paper-")
    assert first.name != grids.sweep_name(base, grid)  # the selection is part of the name
    client, children = _child_runs(mlflow_uri, first.parent_run_id)
    assert set(children) == {"units=1", "units=3"}
    assert children["units=1"].info.status == "FAILED"
    kept_started = children["units=3"].data.tags["csclip_trial_started"]

    # Same command again: restores the experiment, reruns only the failed trial.
    second = sweeps.run_sweep(base, grid, max_concurrent=2, evaluate=interrupted,
                              select="paper")
    assert second.resumed and not second.errors and second.name == first.name
    assert second.parent_run_id == first.parent_run_id
    client, children = _child_runs(mlflow_uri, second.parent_run_id)
    assert set(children) == {"units=1", "units=3"}  # no new child runs
    assert children["units=3"].data.tags["csclip_trial_started"] == kept_started  # not rerun
    # The rerun trial found its finished Train run (named after the trial): one training
    # run per setting, none trained twice.
    train_runs = client.search_runs([children["units=3"].info.experiment_id],
                                    filter_string="tags.`csclip.run_name` LIKE 'ablate-%'")
    assert sorted(r.data.tags["csclip.run_name"] for r in train_runs) == [
        f"{first.name}-units-1", f"{first.name}-units-3"]
    for key, run in children.items():
        assert run.info.status == "FINISHED"
        assert run.data.params["setting"] == key
        assert run.data.params["sampling.num_unit_slots"] == key[-1]
        assert 0 <= run.data.metrics["ht_all"] <= 100
        assert {"ht_entity", "ht_relation"} <= set(run.data.metrics)
        assert run.data.metrics["selected_step"] in (1.0, 2.0)
        assert any(k.startswith("train/") for k in run.data.metrics)  # the training curves
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"trial.md", "trial.csv", "table1.md", "figure3.png"} <= artifacts
    trial_md = client.download_artifacts(children["units=1"].info.run_id, "trial.md",
                                         str(tmp_path))
    assert "Checkpoint selected on the test benchmarks: step" in Path(trial_md).read_text()

    parent = client.get_run(second.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["grid"] == "paper: units=1, units=3"
    assert {"ablation.md", "ablation.csv", "ablation.png"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    header = second.report.csv.read_text().splitlines()[0].split(",")
    assert header[6:] == CSV_COLUMNS
    rows = list(csv.DictReader(io.StringIO(second.report.csv.read_text())))
    assert [(r["setting"], r["status"]) for r in rows] == [("N 1", "done"), ("N 3", "done")]
    check_table_matches_runs(second, children)
    markdown = second.report.markdown.read_text()
    assert "ablation_num_comp_captions.ipynb@16276c7" in markdown  # the row's source
    assert "Checkpoints selected on the test benchmarks" in markdown
    assert "Checkpoints selected on the test benchmarks" in \
        second.table.markdown().splitlines()[0]

    # --reevaluate: evaluates both trials' checkpoints again, trains nothing, adds no runs.
    third = sweeps.run_sweep(base, grid, max_concurrent=2, reevaluate=True, select="paper")
    assert third.resumed and not third.errors
    client, children = _child_runs(mlflow_uri, third.parent_run_id)
    assert set(children) == {"units=1", "units=3"}
    assert children["units=3"].data.tags["csclip_trial_started"] == kept_started
    assert all("csclip_reevaluated" in run.data.tags for run in children.values())
    assert (third.report.markdown.parent / sweeps.EVALUATIONS_FILE).is_file()
    check_table_matches_runs(third, children)


def check_table_matches_runs(result, children) -> None:
    rows = list(csv.DictReader(io.StringIO(result.report.csv.read_text())))
    for row in rows:
        measured = children["units=" + row["setting"].split()[-1]].data.metrics
        assert float(row["ht_all"]) == pytest.approx(measured["ht_all"], abs=0.006)
        # A column is filled exactly when its suite was measured; never a 0 for missing.
        assert bool(row["i2t"]) == ("comp_i2t" in measured)
        assert bool(row["ret_t2i"]) == ("ret_t2i" in measured)
        # On the world every one of the nine Tables 16-17 columns has a value; ZS is the
        # world's zero-shot suite (shape, color, shape + color).
        assert all(row[column] != "" for column in CSV_COLUMNS), row
        assert float(row["zs"]) == pytest.approx(measured["zs_world_avg"], abs=0.006)


# ---------------------------------------------------------------------------------------
# The authors' rows (--grid paper)
# ---------------------------------------------------------------------------------------

def _coco_base():
    from csclip.config import load_config
    from csclip.config.train import TrainConfig

    return load_config(TrainConfig, REPO_ROOT / "configs" / "coco.yaml", [])


def test_paper_grid_on_the_authors_base_is_their_runs():
    grid = grids.expand_paper_grid(_coco_base())
    assert grid.label == "paper"
    # Their launcher's values (run_ablations.sh), batch-size rows with its linearly scaled
    # lr printed with '.1e' (32 -> 1.3e-6), the base run shared by every group.
    assert [s.key for s in grid.settings] == [
        "base", "lr=1e-6", "lr=2e-6", "lr=1e-5", "lr=2e-5", "bs=32,lr=1.3e-6",
        "bs=64,lr=2.5e-6", "wd=1e-3", "wd=5e-3", "wd=0.02", "wd=0.05", "units=1", "units=3",
        "units=4", "relfrac=0", "relfrac=0.25", "relfrac=0.5", "relfrac=0.75",
        "swapfrac=0,rank=0.2", "swapfrac=0.5,rank=0.2"]
    assert [r.label for r in grid.rows if r.is_base] == [
        "lr 5e-6", "bs 128 lr 5e-6", "wd 0.01", "N 2", "rel 1", "swap 1"]
    assert all(r.source for r in grid.rows)
    # The swap-fraction runs trained with the ranking loss (weight 0.2), so do ours
    # (tests/test_ranking_loss.py checks the trial configs); every row is trained.
    assert not any(r.unavailable for r in grid.rows)
    table = reports.build_table(grid, {"base": {"ht_all": 69.3}})
    line = next(x for x in table.markdown().splitlines() if x.startswith("| swap 0 rank 0.2"))
    assert "(not run)" in line and "69.3" not in line
    assert grids.sweep_name(_coco_base(), grid).startswith("ablate-paper-")


def test_paper_grid_selection_and_relative_rows(tmp_path, mlflow_uri):
    base = tiny_config(tmp_path, mlflow_uri)  # lr 1e-4, batch 8
    rows = grids.parse_paper_grid(["paper=bs,wd-1e-3"])
    assert [r.id for r in rows] == ["bs-32", "bs-64", "bs-128", "wd-1e-3"]
    grid = grids.expand_paper_grid(base, rows)
    # The paper's batch ratios to 128 on batch 8, lr scaled linearly as their launcher does.
    assert [s.key for s in grid.settings] == ["base", "bs=2,lr=2.5e-5", "bs=4,lr=5e-5",
                                              "wd=1e-3"]
    for tokens, message in ((["paper=foo"], "'foo' is neither a group"),
                            (["paper", "lr"], "'paper' is a grid of its own"),
                            (["paper="], "empty value")):
        with pytest.raises(ConfigError, match=message):
            grids.parse_paper_grid(tokens)
    # A swap row carries the ranking loss, which needs units: on a base without them the
    # row is refused before any Ray work, by name.
    without_units = grids.with_values(base, {"loss.method": "negclip"}, origin="test")
    with pytest.raises(ConfigError, match="swapfrac=0,rank=0.2.*has no units"):
        grids.expand_paper_grid(without_units, grids.parse_paper_grid(["paper=swapfrac-0"]))


def test_ablate_help_lists_the_authors_rows_with_sources():
    out = subprocess.run([sys.executable, str(REPO_ROOT / "tune" / "ablate.py"), "--grid",
                          "paper", "--help"], capture_output=True, text=True, check=True).stdout
    for text in ("lr-1e-6", "bs-32 lr 1.3e-6", "wd-5e-3", "units-4", "relfrac-0.25",
                 "swapfrac-0.5 rank 0.2", "run_ablations.sh@16276c7",
                 "ablation_weight_decay.ipynb@16276c7", "LAMBDA_RANK 0.2"):
        assert text in out, text


@dataclass(frozen=True)
class FakeReport:
    """What a trial's evaluation returns, as far as the selection reads it."""

    metrics: dict
    items: tuple = ()
    scores: tuple = ()
    skipped: tuple = ()


def _fake_run(run: Path, steps: dict[str, int], checkpoint_every: int | None = None) -> None:
    """A Train run's directory as far as the selection reads it: each folder's spec file,
    its step (metrics.json) and, given checkpoint_every, the resolved config."""
    for folder, step in steps.items():
        (run / folder).mkdir(parents=True)
        (run / folder / "model_spec.json").write_text("{}")
        (run / folder / "metrics.json").write_text(json.dumps({"step": step}))
        if checkpoint_every is not None:
            (run / folder / "config.json").write_text(json.dumps(
                {"run": {"checkpoint_every": checkpoint_every}}))


def test_trial_selection_paper_evaluates_every_kept_step(tmp_path):
    from csclip.ablation.trial import evaluate_selected

    run = tmp_path / "run"
    for folder, step in (("checkpoint_000000", 1), ("checkpoint_000001", 2), ("final", 2)):
        (run / folder).mkdir(parents=True)
        (run / folder / "model_spec.json").write_text("{}")
        (run / folder / "metrics.json").write_text(f'{{"step": {step}}}')
    i2t = {"checkpoint_000000": 70.0, "checkpoint_000001": 40.0, "final": 40.0}
    seen = []

    def evaluate(config, uri, seed):
        seen.append(Path(uri).name)
        return FakeReport({"comp_i2t": i2t[Path(uri).name], "ht_all": 50.0})

    final = evaluate_selected(None, str(run / "final"), 0, evaluate, "final")
    assert seen == ["final"] and "selected_step" not in final.metrics
    seen.clear()
    picked = evaluate_selected(None, str(run / "final"), 0, evaluate, "paper")
    assert seen == ["checkpoint_000000", "checkpoint_000001"]  # final/ is step 2 again
    assert picked.metrics["selected_step"] == 1 and picked.metrics["comp_i2t"] == 70.0


def test_trial_selection_paper_takes_half_truth_from_the_held_out_best(tmp_path):
    """The sweep's --select paper follows both of the authors' rules, as `csclip evaluate
    --select paper`: the suites from the step best by mean I2T (1), the half-truth from
    best/ when held-out contrastive accuracy chose it (step 2: their last_checkpoint.pt)."""
    from csclip.ablation.trial import evaluate_selected

    run = tmp_path / "run"
    _fake_run(run, {"checkpoint_000000": 1, "checkpoint_000001": 2, "final": 2, "best": 2})
    (run / "best" / "metrics.json").write_text(json.dumps(
        {"step": 2, "metric": "contrastive_accuracy", "value": 61.0, "mode": "max"}))
    i2t = {"checkpoint_000000": 70.0, "checkpoint_000001": 40.0, "final": 40.0, "best": 40.0}
    ht = {"checkpoint_000000": 10.0, "checkpoint_000001": 80.0, "final": 80.0, "best": 80.0}

    def evaluate(config, uri, seed):
        name = Path(uri).name
        return FakeReport({"comp_i2t": i2t[name], "ht_all": ht[name]}, items=(name,))

    picked = evaluate_selected(None, str(run / "final"), 0, evaluate, "paper")
    assert picked.metrics["selected_step"] == 1 and picked.metrics["comp_i2t"] == 70.0
    assert picked.metrics["ht_all"] == 80.0 and picked.items != ("checkpoint_000000",)
    assert picked.metrics["half_truth_step"] == 2


def test_trial_selection_paper_candidates_are_the_evaluations(tmp_path):
    """As the authors' (an evaluation every 2,500 steps, none at the end), the candidates
    are the steps at run.checkpoint_every: the last step (5) is not one, however good."""
    from csclip.ablation.trial import evaluate_selected

    run = tmp_path / "run"
    _fake_run(run, {"checkpoint_000000": 2, "checkpoint_000001": 4, "checkpoint_000002": 5,
                    "final": 5}, checkpoint_every=2)
    i2t = {"checkpoint_000000": 50.0, "checkpoint_000001": 60.0, "checkpoint_000002": 90.0,
           "final": 90.0}
    seen = []

    def evaluate(config, uri, seed):
        seen.append(Path(uri).name)
        return FakeReport({"comp_i2t": i2t[Path(uri).name], "ht_all": 50.0})

    picked = evaluate_selected(None, str(run / "final"), 0, evaluate, "paper")
    assert seen == ["checkpoint_000000", "checkpoint_000001"]
    assert picked.metrics["selected_step"] == 4


def test_a_trial_line_counts_the_whole_sweep_though_tune_made_only_its_first_trial():
    from types import SimpleNamespace

    from csclip.ablation.console import TrialLines

    # With one trial at a time Tune passes only the trials it made so far: one of two.
    lines: list[str] = []
    first = SimpleNamespace(config={"setting": "lr=1e-05"}, status="RUNNING", last_result={})
    TrialLines(lines.append, num_trials=2).on_trial_complete(1, [first], first)
    assert lines == ["ablate: trial 1/2 done: lr=1e-05: no evaluation metrics"]

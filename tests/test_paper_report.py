"""`csclip report --paper`: evaluation and ablation folders written by the real writers
(csclip.eval.report.write_outputs, csclip.ablation.report.write_report) from made-up
metrics, put beside the paper's numbers (csclip.report.paper_numbers); the command run
through its entry point."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from csclip.eval.report import EVALUATION_COMPLETE
from csclip.report.paper_numbers import COMMIT, TABLES

MIRROR = Path("/work/.mirror/kargibora+CS-CLIP/repo")

# Made-up metrics of two models (percent; Δ as cosine differences).
CLIP_METRICS = {"ht_entity": 55.0, "ht_relation": 30.0, "ht_all": 40.0, "ht_gap_entity": 0.01,
                "ht_gap_relation": -0.02, "ht_gap": -0.005, "ht_obj": 45.0, "ht_swap": 20.0,
                "winrate_entity": 80.0, "winrate_relation": 70.0, "winrate_all": 75.0,
                "consistency_all": 85.0}
CSCLIP_METRICS = {"ht_entity": 74.0, "ht_relation": 66.5, "ht_all": 70.0, "ht_ant": 60.0}


def _evaluation(folder: Path, models: dict) -> Path:
    """An evaluation folder as `csclip evaluate` writes it: write_outputs on one made-up
    report per model (label -> (ModelIdentity, metrics))."""
    from csclip.eval.halftruth import CONDITIONS, HalfTruthBenchmark, ItemScores
    from csclip.eval.halftruth.items import HalfTruthItem
    from csclip.eval.halftruth.prepare import PreparedBenchmark
    from csclip.eval.report import HalfTruthReport, write_outputs

    items = tuple(HalfTruthItem(f"img{i}", f"s{i}", c.slug, c.group, "a dog",
                                "a dog and a cat", "a dog and a car")
                  for i, c in enumerate(CONDITIONS))
    scores = ItemScores(np.linspace(0.3, 0.2, len(items)), np.full(len(items), 0.31),
                        np.full(len(items), 0.25))
    reports = {label: HalfTruthReport(label, dict(metrics), items, scores, identity=identity)
               for label, (identity, metrics) in models.items()}
    prepared = PreparedBenchmark(HalfTruthBenchmark(items, {}, len(items), len(items), "paper"),
                                 (), {})
    write_outputs(reports, prepared, folder)
    return folder


def _ablation(folder: Path, measured: dict[str, dict[str, float]]) -> Path:
    """An ablation report as `csclip ablate --grid paper` writes it on the authors' base:
    the paper rows, `measured` (row id -> metrics) filled, the others not run."""
    from csclip.ablation.grid import AXES, PAPER_ROWS, Grid, Row, Setting, format_value
    from csclip.ablation.report import build_table, write_report

    rows, metrics = [], {}
    for paper_row in PAPER_ROWS:
        differs = () if paper_row.is_paper_base else paper_row.values
        setting = Setting(differs)
        label = " ".join(f"{AXES[a].label} {format_value(v)}" for a, v in paper_row.values)
        rows.append(Row(label, paper_row.group, paper_row.values[0][1], setting,
                        paper_row.is_paper_base, paper_row.source))
        if paper_row.id in measured:
            metrics[setting.key] = measured[paper_row.id]
    grid = Grid((), False, (), tuple(rows), {}, label="paper")
    write_report(build_table(grid, metrics), folder, "paper grid")
    return folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    from csclip.eval.report import ModelIdentity

    root = tmp_path_factory.mktemp("runs")
    checkpoint = str(root / "train" / "csclip-0123456789ab" / "checkpoint_000015")
    clip = _evaluation(root / "eval-clip", {
        "ViT-B-32:openai": (ModelIdentity("ViT-B-32", "openai"), CLIP_METRICS)})
    csclip_run = _evaluation(root / "eval-csclip", {
        "mine": (ModelIdentity("ViT-B-32", checkpoint, 15000), CSCLIP_METRICS)})
    tiny = _evaluation(root / "eval-tiny", {
        "csclip-tiny": (ModelIdentity("csclip-tiny", None), {"ht_all": 51.0})})
    # suite_i2t fills I2T, the paper's seven-dataset zs_paper_avg ZS (before zs_avg): the
    # keys csclip.ablation.report TABLE_COLUMNS reads first.
    sweep = _ablation(root / "sweep-report", {
        "units-1": {"suite_i2t": 58.0, "ht_all": 70.0, "zs_paper_avg": 60.0, "zs_avg": 10.0},
        "lr-1e-5": {"ht_all": 70.3, "ht_entity": 76.0}})
    return {"clip": clip, "csclip": csclip_run, "tiny": tiny, "sweep": sweep, "root": root}


def _cells(path: Path) -> dict[str, dict[str, str]]:
    """A markdown table's cells: row name -> header -> cell."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("|")]
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = dict(zip(headers, cells, strict=True))
    return table


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def test_the_paper_numbers_match_the_spec_and_name_their_sources():
    t1, t6, t16, t17 = (TABLES[s] for s in ("table1", "table6", "table16", "table17"))
    # SPEC §4: CLIP 52.9 / 32.9 / 40.6, SigLIP-2 overall 54.6, CS-CLIP overall 69.3.
    assert [t1.number("CLIP", k) for k in ("ht_entity", "ht_relation", "ht_all")] == \
        [52.9, 32.9, 40.6]
    assert t1.number("SigLIP2", "ht_all") == 54.6 and t1.number("CS-CLIP", "ht_all") == 69.3
    # SPEC §4, CLIP per condition: +Obj 41.3 ... Subj 59.4.
    assert [t6.number("CLIP", f"ht_{s}") for s in ("obj", "attr", "rand", "rel_attr",
                                                   "rel_obj", "ant", "swap", "subj")] == \
        [41.3, 27.1, 72.6, 25.5, 37.9, 21.0, 24.2, 59.4]
    # SPEC §3 / §7: N=1 and the base row; ZS 59.9, Retr (61.9+81.5)/2 = 71.7, 56.8.
    assert [t16.number("units-1", k) for k in ("i2t", "ht_all", "zs", "ret_t2i")] == \
        [57.4, 69.8, 59.5, 56.3]
    assert [t17.number("lr-5e-6", k) for k in ("zs", "ret_i2t", "ret_t2i")] == [59.9, 71.7, 56.8]
    for table in TABLES.values():
        for row in table.rows:
            for column in table.columns:
                if table.number(row, column.key) is not None:
                    assert table.source(row, column.key).endswith(f"@{COMMIT}") or \
                        f"@{COMMIT} " in table.source(row, column.key)


def test_the_ablation_rows_are_the_grids_and_the_columns_ablation_csvs():
    from csclip.ablation.grid import PAPER_ROWS
    from csclip.ablation.report import CSV_KEYS

    ids = set(TABLES["table16"].rows) | set(TABLES["table17"].rows)
    assert ids == {r.id for r in PAPER_ROWS}
    for stem in ("table16", "table17"):
        assert {c.key for c in TABLES[stem].columns} <= set(CSV_KEYS.values())


@pytest.mark.skipif(not MIRROR.exists(), reason="the authors' repository mirror is not here")
def test_every_tables_1_6_7_number_is_the_authors_tex():
    def tex(name: str) -> dict[str, list[float]]:
        text = subprocess.run(["git", f"--git-dir={MIRROR}", "show",
                               f"{COMMIT}:experiments/paper_figures/{name}"],
                              capture_output=True, text=True, check=True).stdout
        rows = {}
        for line in text.splitlines():
            line = re.sub(r"\\textbf\{([^}]*)\}", r"\1", line)
            if "&" in line and line.rstrip().endswith("\\\\") and "Model" not in line \
                    and "multicolumn" not in line:
                cells = [c.strip() for c in line.rstrip("\\ ").split("&")]
                rows[cells[0]] = [float(c) for c in cells[1:]]
        return rows

    for stem, files in (("table1", ["ht_delta_table.tex"]),
                        ("table6", ["ht_per_condition_table.tex"]),
                        ("table7", ["ft_summary_table.tex", "ft_per_condition_table.tex"])):
        table = TABLES[stem]
        expected = [tex(f) for f in files]
        assert len(expected[0]) == 21
        for model in expected[0]:
            row = [v for e in expected for v in e[model]]
            ours = [table.number(model, c.key) for c in table.columns][:len(row)]
            assert ours == row, (stem, model)
    summary = tex("ht_summary_table.tex")  # Table 1's Acc columns agree with it
    assert all(TABLES["table1"].number(m, "ht_all") == v[3] for m, v in summary.items())


def test_report_puts_ours_beside_the_paper(runs, tmp_path, capsys, monkeypatch):
    from csclip.entry.report import main

    out = tmp_path / "report"
    # A file store under tmp_path: no sqlite schema to migrate (MLflow 3 asks for the opt-in).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    mlflow_uri = (tmp_path / "mlruns").as_uri()
    code = main(["--paper", str(runs["clip"]), str(runs["csclip"]), str(runs["sweep"]),
                 "--out", str(out), "--set", f"tracking.uri={mlflow_uri}"])
    assert code == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    t1 = _cells(out / "table1.md")
    # Ours 55.0 vs the paper's 52.9: +2.1; Δ 0.010 vs -0.002: +0.012.
    assert t1["CLIP (ours: ViT-B-32:openai)"]["Entity Acc"] == "55.0 / 52.9 / +2.1"
    assert t1["CLIP (ours: ViT-B-32:openai)"]["Entity Δ"] == "0.010 / -0.002 / +0.012"
    # The checkpoint of a csclip-<hash> run is CS-CLIP: 70.0 vs 69.3.
    assert t1["CS-CLIP (ours: mine)"]["Overall Acc"] == "70.0 / 69.3 / +0.7"
    # Not measured: missing, never 0; the paper's number still shows.
    assert t1["CS-CLIP (ours: mine)"]["Entity Δ"] == "— / 0.021 / —"
    t7 = _cells(out / "table7.md")
    assert t7["CLIP (ours: ViT-B-32:openai)"]["Gap"] == "10.0 / 9.1 / +0.9"
    rows = {r["label"]: r for r in _csv(out / "table6.csv")}
    assert rows["mine"]["paper_row"] == "CS-CLIP"
    assert float(rows["mine"]["ht_ant"]) == 60.0 and float(rows["mine"]["ht_ant_paper"]) == 66.8
    assert float(rows["mine"]["ht_ant_diff"]) == pytest.approx(-6.8)
    assert rows["mine"]["ht_obj"] == "" and rows["mine"]["ht_obj_paper"] == "68.9"
    # Tables 16-17: every paper row, ours where the sweep ran it.
    t16 = _cells(out / "table16.md")
    assert t16["N=1 (ours: N 1)"]["I2T"] == "58.0 / 57.4 / +0.6"
    assert t16["N=1 (ours: N 1)"]["ZS Avg"] == "60.0 / 59.5 / +0.5"
    assert t16["N=1 (ours: N 1)"]["Retr I2T"] == "— / 70.7 / —"
    assert t16["N=2 (Ours) (ours: N 2, not run)"]["HT All"] == "— / 69.3 / —"
    t17 = {r["setting"]: r for r in _csv(out / "table17.csv")}
    assert float(t17["lr 1e-5"]["ht_all_diff"]) == pytest.approx(70.3 - 71.8)
    # Sources under each table.
    assert f"ht_delta_table.tex@{COMMIT}" in (out / "table1.md").read_text()
    assert "ablation_combined_figures.ipynb" in (out / "table16.md").read_text()
    from PIL import Image

    for stem in ("table1", "table6", "table7", "table16", "table17"):
        with Image.open(out / f"{stem}.png") as image:
            assert image.size[0] > 300 and image.size[1] > 150
            assert len(image.convert("RGB").getcolors(1 << 20) or range(300)) > 20
    assert "MLflow run" in printed
    from csclip import tracking

    client = tracking.client(mlflow_uri)
    (run,) = client.search_runs([tracking.experiment_id(client, "csclip-report")])
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"table1.md", "table1.csv", "table1.png", "table17.png", "paper_report.md"} <= names
    assert run.data.metrics["table1_mean_abs_diff"] > 0


def test_label_names_a_model_and_a_wrong_run_is_one_line(runs, tmp_path, capsys):
    from csclip.entry.report import main

    out = tmp_path / "report"
    # Random weights: no rule tells which paper row it is.
    assert main(["--paper", str(runs["tiny"]), "--out", str(out), "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--label" in err and err.startswith("error: ")
    assert main(["--paper", str(runs["tiny"]), "--label", f"{runs['tiny']}=clip-ft",
                 "--out", str(out), "--no-tracking"]) == 0
    capsys.readouterr()
    assert _cells(out / "table1.md")["CLIP-FT (ours: csclip-tiny)"]["Overall Acc"] == \
        "51.0 / 48.8 / +2.2"
    assert not (out / "table16.md").exists()  # no ablation RUN: no Tables 16-17
    # A folder that is neither, a missing one, an unfinished evaluation: one line, exit 2.
    (tmp_path / "other").mkdir()
    unfinished = shutil.copytree(runs["tiny"], tmp_path / "eval-unfinished")
    (unfinished / EVALUATION_COMPLETE).unlink()  # killed before its marker was written
    for run, words in ((tmp_path / "other", "neither"), (tmp_path / "nope", "no such folder"),
                       (unfinished, "did not finish")):
        assert main(["--paper", str(run), "--out", str(out), "--no-tracking"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err, err
    assert main(["--paper", str(runs["clip"]), "--label", "elsewhere=CLIP",
                 "--out", str(out), "--no-tracking"]) == 2
    assert "neither a RUN" in capsys.readouterr().err


@pytest.mark.parametrize(("model", "pretrained", "row"), [
    ("ViT-B-32", "openai", "CLIP"),
    ("ViT-B-16-SigLIP2", "webli", "SigLIP2"),
    ("ViT-B-32", "laion2b_s34b_b79k", None),  # a tag the paper has no row for
    ("ViT-B-32", "s3://b/runs/train/negclip-0123456789ab/checkpoint_000005", "NegCLIP"),
    ("ViT-B-32", "runs/train/clip-0123456789ab/final", "CLIP-FT"),
    ("ViT-B-32", "/models/negclip.pth", "NegCLIP"),  # NegCLIP, not the shorter CLIP
    ("ViT-B-32", "/models/fsc_clip_coco.pt", "FSC-CLIP-COCO"),
    ("ViT-B-32", "/models/weights.pt", None),
    ("csclip-tiny", None, None),
])
def test_paper_row_of(model, pretrained, row):
    from csclip.report.paper import paper_row_of

    assert paper_row_of(model, pretrained or "")[0] == row


def test_paper_row_of_reads_a_checkpoints_method(tmp_path):
    from csclip.report.paper import paper_row_of

    checkpoint = tmp_path / "my-run" / "final"
    checkpoint.mkdir(parents=True)
    (checkpoint / "config.json").write_text('{"loss": {"method": "csclip"}}')
    assert paper_row_of("ViT-B-32", str(checkpoint))[0] == "CS-CLIP"


def test_runs_on_s3_are_read_from_a_local_copy(runs, s3_endpoint, monkeypatch, tmp_path, capsys):
    # The walk-through's sweep writes its report to the run's storage, S3 on a cluster.
    from s3_helpers import fresh_bucket

    from csclip.entry.report import main

    out = tmp_path / "report"
    with fresh_bucket(s3_endpoint, monkeypatch, "reports",
                      CSCLIP_CACHE_DIR=str(tmp_path / "cache")) as client:
        for run in ("sweep", "csclip"):
            for file in runs[run].rglob("*"):
                if file.is_file():
                    client.upload_file(str(file), "reports",
                                       f"runs/{run}/{file.relative_to(runs[run])}")
        assert main(["--paper", "s3://reports/runs/csclip", "s3://reports/runs/sweep/",
                     "--out", str(out), "--no-tracking"]) == 0
        assert "s3://reports/runs/csclip" in (out / "paper_report.md").read_text()
        local = tmp_path / "local"
        assert main(["--paper", str(runs["csclip"]), str(runs["sweep"]), "--out", str(local),
                     "--no-tracking"]) == 0
        for stem in ("table1", "table16", "table17"):  # the same, but for the RUNs' names
            read = (out / f"{stem}.csv").read_text()
            for run in ("sweep", "csclip"):
                for uri in (f"s3://reports/runs/{run}/", f"s3://reports/runs/{run}"):
                    read = read.replace(uri, str(runs[run]))
            assert read == (local / f"{stem}.csv").read_text()
        assert main(["--paper", "s3://reports/runs/sweep/ablation.csv", "--out", str(out),
                     "--no-tracking"]) == 0
        capsys.readouterr()
        # Nothing under the prefix: one line, exit 2.
        assert main(["--paper", "s3://reports/runs/nope", "--out", str(out), "--no-tracking"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "s3://reports/runs/nope" in err

"""Checkpoint selection as the authors report it (`--select paper`): the rule on crafted
metrics, and `csclip evaluate --select paper` on a run directory of tiny checkpoints whose
best step is known and is not the last."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch

from csclip.errors import ConfigError
from csclip.eval.selection import SELECTION_LABEL, i2t_rows, saved_checkpoints, select_paper


def _rows(*values: float, benchmark: str = "aro") -> dict[str, float]:
    return {f"{benchmark}_s{i}_i2t": v for i, v in enumerate(values)}


def test_rows_are_benchmark_subsets_not_averages():
    metrics = {"sugarcrepe_pp_replace_att_i2t": 70.0, "sugarcrepe_pp_i2t": 1.0,
               "sugarcrepe_add_obj_i2t": 50.0, "sugarcrepe_i2t": 2.0, "suite_i2t": 3.0,
               "cap_entity_i2t": 4.0, "sugarcrepe_add_obj_t2i": 5.0, "comp_i2t": 6.0,
               "winoground_object_i2t": float("nan")}
    assert i2t_rows(metrics) == {"sugarcrepe_pp_replace_att_i2t": 70.0,
                                 "sugarcrepe_add_obj_i2t": 50.0}
    # Without a real benchmark, the world's compositional suites are the rows.
    assert i2t_rows({"comp_i2t": 40.0, "comp_i2t_replace": 60.0, "ht_all": 99.0}) == {
        "comp_i2t": 40.0, "comp_i2t_replace": 60.0}


def test_select_paper_follows_the_authors_rule():
    # Highest mean I2T wins (step 20, not the last one).
    assert select_paper({10: _rows(50, 60), 20: _rows(80, 70), 30: _rows(60, 60)}).step == 20
    # Step 0 is left out when other steps exist, however good.
    assert select_paper({0: _rows(99, 99), 10: _rows(50, 50)}).step == 10
    # Only steps that measured the most rows compete.
    assert select_paper({10: _rows(99), 20: _rows(60, 60)}).step == 20
    # A tie goes to the earliest step (pandas idxmax over sorted steps).
    selection = select_paper({30: _rows(70, 70), 10: _rows(60, 80), 20: _rows(50, 50)})
    assert selection.step == 10 and selection.mean_i2t == {30: 70.0, 10: 70.0, 20: 50.0}
    assert "| 10 | 70.00 | 2 | yes |" in selection.markdown()
    with pytest.raises(ConfigError, match="no compositional benchmark was measured"):
        select_paper({10: {"ht_all": 50.0}})


def _save(directory: Path, step: int, seed: int, zero: bool) -> None:
    """A csclip-tiny checkpoint saved at `step`: random weights, or all zeros (every
    feature is 0, every comparison a tie, so every I2T is 0: strict ties fail)."""
    from csclip.model import create_bundle, save_checkpoint, spec_of

    torch.manual_seed(seed)
    bundle = create_bundle("csclip-tiny", image_size=32)
    if zero:
        with torch.no_grad():
            for parameter in bundle.model.parameters():
                parameter.zero_()
    save_checkpoint(bundle.model, spec_of(bundle.model, "csclip-tiny"), directory)
    (directory / "metrics.json").write_text(json.dumps({"step": step, "loss": 1.0}))


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    """A run's directory as csclip.train leaves it: checkpoint_* folders, final/ (a copy of
    the last) and best/; only step 4 has non-zero weights."""
    run = tmp_path / "runs" / "tiny-run"
    _save(run / "checkpoint_000000", step=2, seed=0, zero=True)
    _save(run / "checkpoint_000001", step=4, seed=1, zero=False)
    _save(run / "checkpoint_000002", step=6, seed=2, zero=True)
    _save(run / "final", step=6, seed=2, zero=True)
    _save(run / "best", step=4, seed=1, zero=False)
    (run / "notes").mkdir()  # not a checkpoint: ignored
    return run


def test_saved_checkpoints_one_per_step(run_dir):
    found = saved_checkpoints(str(run_dir))
    assert [(c.step, Path(c.uri).name) for c in found] == [
        (2, "checkpoint_000000"), (4, "checkpoint_000001"), (6, "checkpoint_000002")]
    with pytest.raises(ConfigError, match="is one checkpoint; give the run's directory"):
        saved_checkpoints(str(run_dir / "final"))
    with pytest.raises(ConfigError, match="holds no saved checkpoints"):
        saved_checkpoints(str(run_dir / "notes"))


WORLD = ["--set", "data.world.num_val=12", "--set", "data.world.image_size=32",
         "--set", "benchmark.num_bootstrap=0", "--set", "tracking.enabled=false"]


def test_evaluate_select_paper_picks_the_best_step_not_the_last(run_dir, tmp_path, capsys):
    from csclip.entry.evaluate import main

    out = tmp_path / "eval"
    assert main(["--checkpoint", str(run_dir), "--select", "paper", "--out", str(out),
                 *WORLD]) == 0
    printed = capsys.readouterr().out
    assert "step 4" in printed and SELECTION_LABEL in printed
    rows = list(csv.DictReader(io.StringIO((out / "selection.csv").read_text())))
    # Tidy, with the identity columns of the evaluation's CSVs: the checkpoint of each step.
    assert list(rows[0]) == ["model", "pretrained", "step", "mean_i2t", "num_rows", "selected"]
    assert [(r["model"], r["pretrained"], r["step"], r["selected"]) for r in rows] == [
        ("csclip-tiny", str(run_dir / f"checkpoint_00000{i}"), str(step), selected)
        for i, (step, selected) in enumerate(((2, "false"), (4, "true"), (6, "false")))]
    assert all(r["num_rows"].isdigit() for r in rows)
    # The selected step's tables and result JSONs carry its identity as an evaluation's do.
    (table1,) = csv.DictReader(io.StringIO((out / "table1.csv").read_text()))
    assert (table1["model"], table1["pretrained"], table1["step"]) == (
        "csclip-tiny", str(run_dir / "checkpoint_000001"), "4")
    results = [json.loads(p.read_text()) for p in out.glob("*.json") if p.name[0] != "_"]
    assert results and all((r["model"], r["pretrained"]) == (
        "csclip-tiny", str(run_dir / "checkpoint_000001")) for r in results)
    means = {r["step"]: float(r["mean_i2t"]) for r in rows}
    assert means["2"] == means["6"] == 0.0 and means["4"] > 0  # zero weights: all ties
    # Every table names the step and that the test benchmarks chose it.
    for table in ("table1.md", "table6.md", "table7.md"):
        assert f"step 4 - {SELECTION_LABEL}" in (out / table).read_text(), table
    assert f"step 4 - {SELECTION_LABEL}" in (out / "halftruth.md").read_text()


def test_evaluate_select_paper_refuses_a_single_checkpoint(run_dir, tmp_path, capsys):
    from csclip.entry.evaluate import main

    assert main(["--checkpoint", str(run_dir / "final"), "--select", "paper",
                 "--out", str(tmp_path / "eval"), *WORLD]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is one checkpoint" in err


def test_evaluate_select_paper_takes_half_truth_from_the_held_out_best(run_dir, tmp_path):
    """The authors' two rules: suites from the step with the best mean I2T (4), half-truth
    from best/ when held-out contrastive accuracy chose it (step 2, zero weights: every
    half-truth item a tie, ht_all 0, where step 4 scores above 0)."""
    import shutil

    from csclip.entry.evaluate import main

    shutil.rmtree(run_dir / "best")
    _save(run_dir / "best", step=2, seed=0, zero=True)
    (run_dir / "best" / "metrics.json").write_text(json.dumps(
        {"step": 2, "metric": "contrastive_accuracy", "value": 61.0}))
    plain = tmp_path / "plain"  # step 4 alone: what half-truth would be without the rule
    assert main(["--checkpoint", str(run_dir / "checkpoint_000001"), "--out", str(plain),
                 *WORLD]) == 0
    out = tmp_path / "eval"
    assert main(["--checkpoint", str(run_dir), "--select", "paper", "--out", str(out),
                 *WORLD]) == 0
    assert "Half-truth: from step 2" in (out / "selection.md").read_text()
    label = f"step 4 - {SELECTION_LABEL} - half-truth step 2 best on held-out captions"
    assert label in (out / "halftruth.md").read_text()
    def row(folder: Path, table: str) -> dict[str, str]:
        (only,) = csv.DictReader(io.StringIO((folder / table).read_text()))
        return only

    ours, alone = row(out, "table1.csv"), row(plain, "table1.csv")
    ht = [k for k in ours if k.startswith("ht_") and not k.endswith(("_low", "_high"))]
    assert ht and all(float(ours[k]) == 0.0 for k in ht)    # step 2's zero weights
    assert any(float(alone[k]) > 0.0 for k in ht)           # step 4's, had it been used
    ours, alone = row(out, "suites.csv"), row(plain, "suites.csv")
    comp = [k for k in ours if k.startswith(("comp_", "ret_"))]
    assert comp and all(ours[k] == alone[k] for k in comp)  # the suites are step 4's
    assert any(float(ours[k]) > 0.0 for k in comp if ours[k])

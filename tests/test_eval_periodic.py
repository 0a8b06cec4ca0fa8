"""Evaluation during training: the periodic evaluator on its own (metrics, best rule,
best/ that load_bundle reads, a resumed run keeps a better best), and one tiny Ray Train
world run logging val_* against the step with best/ beside final/."""

from __future__ import annotations

import json

import cluster_harness as harness
import pytest
import torch

from csclip.config.world import WorldConfig
from csclip.model import create_bundle, load_bundle, spec_of
from csclip.train.periodic import LOGGED_KEYS, PeriodicEvaluator, capped_records
from csclip.world import iter_world


@pytest.fixture(scope="module")
def val_records():
    return list(iter_world(WorldConfig(image_size=32, num_train=0, num_val=12, num_test=0),
                           splits=("val",)))


def test_capped_records_keep_whole_images(val_records):
    capped = capped_records(val_records + val_records[:2], 5)
    assert len({r.image_id for r in capped}) == 5
    assert sorted({r.image_id for r in capped}) == sorted({r.image_id for r in val_records})[:5]


def test_evaluator_scores_keeps_best_and_restores_train_mode(tmp_path, val_records):
    bundle = create_bundle("csclip-tiny")
    bundle.model.train()
    best_uri = str(tmp_path / "run" / "best")
    evaluator = PeriodicEvaluator(val_records, "ht_all", best_uri)
    metrics = evaluator.evaluate(bundle, "cpu")
    assert bundle.model.training  # back in train mode for the next step
    assert {"ht_all", "ht_entity", "ht_relation", "ret_i2t", "ret_t2i"} <= set(metrics)
    assert not any(k.startswith(("comp_", "zs_", "image_side")) for k in metrics)  # kept cheap
    assert evaluator.is_better(metrics)
    evaluator.save_best(bundle.model, spec_of(bundle.model, "csclip-tiny"), {}, 7, metrics)
    saved = json.loads((tmp_path / "run" / "best" / "metrics.json").read_text())
    assert saved["step"] == 7 and saved["value"] == metrics["ht_all"]
    reloaded = load_bundle(best_uri)
    for name, tensor in bundle.model.state_dict().items():
        torch.testing.assert_close(reloaded.model.state_dict()[name], tensor, rtol=0, atol=0)
    assert not evaluator.is_better(metrics)  # equal is not better
    assert evaluator.is_better({"ht_all": metrics["ht_all"] + 1})
    # A resumed run reads the bar from best/ and does not overwrite a better checkpoint.
    again = PeriodicEvaluator(val_records, "ht_all", best_uri)
    assert again.best_value == metrics["ht_all"] and not again.is_better(metrics)
    other = PeriodicEvaluator(val_records, "ret_i2t", str(tmp_path / "other"))
    other.best_value = 50.0
    assert other.is_better({"ret_i2t": 60.0}) and not other.is_better({"ret_i2t": 40.0})
    assert not other.is_better({"ht_all": 99.0})  # metric not measured: never best


@pytest.mark.slow
def test_training_logs_validation_metrics_and_keeps_best(tmp_path, mlflow_uri, ray_session):
    from csclip import tracking
    from csclip.config import load_config
    from csclip.config.train import TrainConfig
    from csclip.train import run, run_name

    config = load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
        "data.world.num_train=16", "data.world.num_val=10", "data.batch_size=4",
        "data.shuffle_buffer=16", "optim.max_steps=6", "optim.warmup_steps=1",
        "optim.lr=1e-3", "run.checkpoint_every=2", "run.log_every=1", "run.eval_every=2",
        "run.eval_max_images=6", f"run.storage_path={tmp_path / 'runs'}",
        f"tracking.uri={mlflow_uri}",
        # Two gloo workers on NegCLIP's objective (its negatives gathered across ranks):
        # rank 0 evaluates while the other rank waits at the next step's collective.
        "run.num_workers=2", "loss.method=negclip"])
    plain = config.model_copy(update={"run": config.run.model_copy(update={"eval_every": None})})
    assert run_name(plain) == run_name(config)  # evaluating does not change what is trained
    before = harness.split_coordinators()
    result = run(config)
    assert result.metrics["step"] == 6
    # Three epochs of 2 steps, each split over the two workers by its own SplitCoordinator:
    # each ended before the epoch after next started (Ray Train alone keeps all three to
    # the end; the next epoch opens before the current one ends, csclip.train.lookahead).
    coordinators = [c for key, c in harness.split_coordinators().items() if key not in before]
    assert len(coordinators) == 3 and all(c["state"] == "DEAD" for c in coordinators)
    assert harness.overlapping_lifetimes(coordinators) == []
    assert result.metrics["loss_unit"] == 0.0 and result.metrics["loss"] > 0  # NegCLIP: no units
    history = {key: tracking.run_metrics(mlflow_uri, result.mlflow_run_id, f"val_{key}")
               for key in LOGGED_KEYS}
    assert [step for step, _ in history["ht_all"]] == [2, 4, 6]
    assert all(len(points) == 3 for points in history.values())
    best_dir = tmp_path / "runs" / result.run_name / "best"
    assert best_dir.is_dir() and (tmp_path / "runs" / result.run_name / "final").is_dir()
    saved = json.loads((best_dir / "metrics.json").read_text())
    best_step, best_value = max(history["ht_all"], key=lambda p: (p[1], -p[0]))
    assert (saved["step"], saved["value"]) == (best_step, pytest.approx(best_value))
    load_bundle(str(best_dir))

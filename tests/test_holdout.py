"""The authors' held-out training captions (data.val_ratio, csclip.train.holdout): the
seeded split and that its rows leave every training dataset, the contrastive accuracy on
hand-computed features, the best-state rule, and one tiny Ray run that scores the held-out
rows at each epoch, logs val_contrastive_accuracy and keeps best/ by it."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pytest
import torch

from csclip.errors import ConfigError
from csclip.train.holdout import contrastive_accuracy, evaluation_due, held_out_ids


def test_held_out_ids_are_a_seeded_fraction_of_distinct_ids():
    ids = [f"coco_{i}_{j}" for i in range(400) for j in range(5)]  # 2000 captions
    held = held_out_ids(ids, 0.01, seed=42)
    assert len(held) == 20 and held <= set(ids)           # int(2000 * 0.01)
    assert held_out_ids(reversed(ids), 0.01, seed=42) == held  # not the reader's order
    assert held_out_ids(ids + ids[:7], 0.01, seed=42) == held  # a repeated id counts once
    assert held_out_ids(ids, 0.01, seed=43) != held
    assert held_out_ids(ids, 0.001, seed=42) <= set(ids) and len(held_out_ids(ids, 0.001, 42)) == 2
    assert held_out_ids(ids, 0.0, seed=42) == frozenset()
    assert len(held_out_ids(ids[:999], 0.001, seed=42)) == 0  # int(0.999): floor, as theirs
    with pytest.raises(ConfigError, match="data.val_ratio"):
        held_out_ids(ids, 1.0, seed=42)


def test_contrastive_accuracy_on_hand_computed_features():
    image = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    caption = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.6, 0.8], [1.0, 0.0]])
    negatives = torch.tensor([
        [[0.8, 0.6], [0.0, 1.0]],   # pos 1 > 0.8, 0: correct
        [[0.0, 1.0], [1.0, 0.0]],   # pos 1 = 1 (a tie is not a win): wrong
        [[1.0, 0.0], [0.0, 1.0]],   # pos 0.6 < 1, but that slot is invalid; > 0: correct
        [[1.0, 0.0], [1.0, 0.0]],   # no valid negative: not counted
    ])
    valid = torch.tensor([[True, True], [True, True], [False, True], [False, False]])
    assert contrastive_accuracy(image, caption, negatives, valid) == pytest.approx(2 / 3)
    assert math.isnan(contrastive_accuracy(image[3:], caption[3:], negatives[3:], valid[3:]))


def test_evaluation_due_every_n_steps_or_per_epoch():
    # The evaluations are the candidates, as the authors': not the last step besides.
    assert [s for s in range(1, 11) if evaluation_due(s, 10, 4, 3)] == [4, 8]
    assert [s for s in range(1, 4) if evaluation_due(s, 3, 4, 3)] == [3]  # none else
    # Without run.eval_every: at the end of each epoch, as the authors (eval_n 1).
    assert [s for s in range(1, 11) if evaluation_due(s, 10, None, 3)] == [3, 6, 9]


def test_best_state_is_the_step_with_the_highest_held_out_accuracy(tmp_path):
    from csclip.config.world import WorldConfig
    from csclip.eval.selection import held_out_best
    from csclip.model import create_bundle, spec_of
    from csclip.train.periodic import PeriodicEvaluator
    from csclip.world import iter_world

    val = list(iter_world(WorldConfig(image_size=32, num_train=0, num_val=4, num_test=0),
                          splits=("val",)))
    bundle = create_bundle("csclip-tiny", image_size=32)
    run = tmp_path / "run"
    evaluator = PeriodicEvaluator(val, "contrastive_accuracy", str(run / "best"))
    for step, value in ((100, 40.0), (200, 60.0), (300, 50.0), (400, math.nan)):
        metrics = {"contrastive_accuracy": value, "ht_all": 99.0 - step / 100}
        if evaluator.is_better(metrics):
            evaluator.save_best(bundle.model, spec_of(bundle.model, "csclip-tiny"), {}, step,
                                metrics)
    saved = json.loads((run / "best" / "metrics.json").read_text())
    assert (saved["step"], saved["metric"], saved["value"]) == (200, "contrastive_accuracy", 60.0)
    best = held_out_best(str(run))
    assert best is not None and best.step == 200 and best.uri.endswith("best")
    other = tmp_path / "other"  # best/ chosen by another metric: not the authors' state
    PeriodicEvaluator(val, "ht_all", str(other / "best")).save_best(
        bundle.model, spec_of(bundle.model, "csclip-tiny"), {}, 5, {"ht_all": 1.0})
    assert held_out_best(str(other)) is None and held_out_best(str(tmp_path / "none")) is None


def test_held_out_rows_scored_alone_without_a_validation_split(tmp_path):
    """World rows prepared as epoch 0 draws them, scored on csclip-tiny with the model's
    own features checked by hand; an evaluator with no validation split scores them alone."""
    import numpy as np
    import torch.nn.functional as F

    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.model import create_bundle
    from csclip.train.holdout import HeldOut
    from csclip.train.periodic import PeriodicEvaluator, validation_records
    from csclip.world.ray_source import generate_batch

    world = WorldConfig(image_size=32, num_train=8, num_val=0, num_test=0)
    table = generate_batch({"id": np.arange(8)}, world.model_dump(mode="json"), "train")
    bundle = create_bundle("csclip-tiny", image_size=32)
    from csclip.model import spec_of

    held = HeldOut(table, sampling=SamplingConfig().model_dump(mode="json"),
                   preprocess_cfg=spec_of(bundle.model, "csclip-tiny").preprocess_cfg,
                   model_name="csclip-tiny", seed=42, chunk=3)
    assert len(held) == 8 and held.negatives.shape[:2] == held.valid.shape
    bundle.model.train()
    value = held.score(bundle.model, "cpu")
    assert bundle.model.training  # back in train mode
    with torch.no_grad():
        bundle.model.eval()
        image = F.normalize(bundle.model.encode_image(torch.as_tensor(held.image)), dim=-1)
        caption = F.normalize(bundle.model.encode_text(torch.as_tensor(held.caption)), dim=-1)
        n, k, length = held.negatives.shape
        negs = F.normalize(bundle.model.encode_text(torch.as_tensor(
            held.negatives.reshape(n * k, length))), dim=-1).reshape(n, k, -1)
    pos = (image * caption).sum(-1)
    hand = [all(pos[i] > image[i] @ negs[i, j] for j in range(k) if held.valid[i, j])
            for i in range(n) if held.valid[i].any()]
    assert value == pytest.approx(100.0 * sum(hand) / len(hand), abs=1e-6)

    with pytest.raises(Exception, match="no records in split"):
        validation_records(None, world, 4)
    assert validation_records(None, world, 4, required=False) == []
    evaluator = PeriodicEvaluator([], "contrastive_accuracy", str(tmp_path / "best"),
                                  heldout=held)
    assert evaluator.evaluate(bundle, "cpu") == {"contrastive_accuracy": pytest.approx(value)}


@pytest.mark.slow
def test_held_out_rows_leave_training_and_are_scored(tmp_path, mlflow_uri, ray_session):
    """World rows: the world's shards hold every row, the plan keeps the held-out ids out
    of training (what every worker's batches are cut from), rank 0 reads those rows from
    the shards; the run trains on the rest, scores the held-out rows at the end of each
    epoch, logs val_contrastive_accuracy and keeps best/ by it."""
    from csclip import tracking
    from csclip.config import load_config
    from csclip.config.train import DataConfig, TrainConfig
    from csclip.train import run
    from csclip.train.shards import held_out_rows, plan_shards
    from csclip.train.source_shards import source_shards
    from csclip.train.stream import preprocess_key

    data = DataConfig.model_validate({"world": {"image_size": 32, "num_train": 20},
                                      "val_ratio": 0.25})
    cfg = {"size": 32}
    written = source_shards(data, seed=42, preprocess_cfg=cfg, model_name="csclip-tiny",
                            storage_root=str(tmp_path / "world"))
    shards = plan_shards(written.data(data), seed=42)
    all_ids = {f"world-train-{i:07d}" for i in range(20)}
    held = held_out_ids(all_ids, 0.25, seed=42)
    assert {i for shard in shards for i in shard.held} == held and len(held) == 5
    assert sum(shard.rows for shard in shards) == 15
    refs = held_out_rows(shards, preprocess_key(cfg), "csclip-tiny")
    held_rows = pa.concat_tables(ray_session.get(refs))
    assert set(held_rows.column("sample_id").to_pylist()) == held
    assert "pixels" in held_rows.column_names  # the shards' pixels, for rank 0 to score

    config = load_config(TrainConfig, None, [
        "model.name=csclip-tiny", "model.image_size=32", "data.world.image_size=32",
        "data.world.num_train=20", "data.world.num_val=6", "data.val_ratio=0.25",
        "data.batch_size=5", "data.shuffle_buffer=0", "optim.epochs=2",
        "optim.warmup_steps=1", "optim.lr=1e-3", "run.checkpoint_every=3", "run.log_every=1",
        "run.eval_max_images=4", "run.best_metric=contrastive_accuracy",
        f"run.storage_path={tmp_path / 'runs'}", f"tracking.uri={mlflow_uri}"])
    result = run(config)
    assert result.metrics["num_rows"] == 15 and result.metrics["step"] == 6  # 3 per epoch
    client = tracking.client(mlflow_uri)
    logged = client.get_run(result.mlflow_run_id)
    assert logged.data.params["data.held_out_rows"] == "5"
    history = tracking.run_metrics(mlflow_uri, result.mlflow_run_id, "val_contrastive_accuracy")
    assert [step for step, _ in history] == [3, 6]  # the end of each epoch
    assert all(0.0 <= value <= 100.0 for _, value in history)
    best = json.loads((tmp_path / "runs" / result.run_name / "best" / "metrics.json").read_text())
    assert best["metric"] == "contrastive_accuracy"
    top_step, top_value = max(history, key=lambda p: (p[1], -p[0]))
    assert (best["step"], best["value"]) == (top_step, pytest.approx(top_value))

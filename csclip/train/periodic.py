"""Evaluation during training (`run.eval_every`): the half-truth benchmark (overall /
entity / relation) and retrieval on a capped validation split, built once and scored on
the live model every few steps, plus the best checkpoint by a chosen metric. Called by
csclip.train on rank 0; it never imports training."""

from __future__ import annotations

import json
import logging
import math
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch

from csclip.config.eval import ScoringConfig, SuitesConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.halftruth import BenchmarkConfig, prepare_benchmark
from csclip.eval.pipeline import evaluate_encoder
from csclip.model import ClipBundle, ModelSpec, save_checkpoint
from csclip.records import load_split
from csclip.storage import export_problem, filesystem_for, read_bytes, upload_dir
from csclip.train.holdout import METRIC as HELD_OUT_METRIC
from csclip.train.holdout import HeldOut
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

# The keys logged against the step (as "val_<key>"); the best checkpoint's metric is one
# of the report's keys (ht_all by default).
LOGGED_KEYS: tuple[str, ...] = ("ht_all", "ht_entity", "ht_relation", "ret_i2t", "ret_t2i")
# Logged too when the run holds out training captions (data.val_ratio, csclip.train.holdout).
HELD_OUT_KEYS: tuple[str, ...] = (HELD_OUT_METRIC,)
BEST_METRICS_FILE = "metrics.json"


def capped_records(records: Sequence[UnitsRecord], max_images: int) -> list[UnitsRecord]:
    """The records of the first `max_images` image ids (sorted), all their captions."""
    keep = set(sorted({r.image_id for r in records})[:max_images])
    return [r for r in records if r.image_id in keep]


def validation_records(units_uri: str | None, world, max_images: int,
                       required: bool = True) -> list[UnitsRecord]:
    """The capped validation split; without one (a units table of the train split only)
    an empty list when not `required` (the held-out captions are scored alone)."""
    try:
        return capped_records(load_split(units_uri, "val", world), max_images)
    except DataError as err:
        if required:
            raise
        log.warning("no validation split (%s): evaluation during training scores the "
                    "held-out training captions only", err)
        return []


class PeriodicEvaluator:
    """Scores a training model on a fixed validation benchmark and keeps the best weights.

    records: the validation split (already capped); best_metric: the report key that
    decides the best checkpoint (larger is better: every report key is an accuracy, a
    recall or a gap Δ = s(A) - s(A-)); best_uri: where `best/` goes
    (local or s3://). A best/ left by an earlier attempt of the same run sets the bar, so a
    resumed run does not overwrite a better checkpoint. heldout: data.val_ratio's rows,
    whose contrastive_accuracy joins the metrics (best_metric contrastive_accuracy: the
    authors' rule, best/ their last_checkpoint.pt).
    """

    def __init__(self, records: Sequence[UnitsRecord], best_metric: str, best_uri: str, seed: int = 0, heldout: HeldOut | None = None) -> None:
        self.records = list(records)
        self.heldout = heldout
        # No bootstrap and no image-side items: only what is logged, as cheaply as possible.
        self.benchmark = BenchmarkConfig(seed=seed, num_bootstrap=0, image_side=False)
        # No records (allowed with held-out captions only): nothing but their score.
        self.prepared = prepare_benchmark(self.records, self.benchmark) if self.records else None
        self.suites = SuitesConfig(num_world_pairs=0, num_zeroshot_items=0)
        self.best_metric, self.best_uri = best_metric, best_uri
        self.best_value = self._saved_best()

    def _saved_best(self) -> float | None:
        filesystem, path = filesystem_for(self.best_uri)
        file = f"{path}/{BEST_METRICS_FILE}"
        # A best/ whose export was killed (no manifest, or files that do not match it) sets
        # no bar: the next better step replaces it whole (csclip.storage.upload_dir).
        if export_problem(filesystem, path) is not None:
            return None
        return float(json.loads(read_bytes(filesystem, file))["value"])

    def evaluate(self, bundle: ClipBundle, device: str) -> dict[str, float]:
        """The report's metrics for the model in `bundle` (put in eval mode and back into
        train mode afterwards)."""
        metrics: dict[str, float] = {}
        if self.heldout is not None:
            metrics[HELD_OUT_METRIC] = self.heldout.score(bundle.model, device)
        if self.prepared is None:
            return metrics
        was_training = bundle.model.training
        try:
            encoder = Encoder.for_bundle(bundle, ScoringConfig(device=device))
            report = evaluate_encoder("train", encoder, self.prepared, self.records,
                                      self.benchmark, self.suites)
        finally:
            bundle.model.train(was_training)
        return {**report.metrics, **metrics}

    def is_better(self, metrics: dict[str, float]) -> bool:
        value = metrics.get(self.best_metric)
        if value is None or not math.isfinite(value):
            return False
        if self.best_value is None:
            return True
        return value > self.best_value

    def save_best(self, model: torch.nn.Module, spec: ModelSpec, config: dict, step: int,
                  metrics: dict[str, float]) -> str:
        """Write the weights, spec, config and the deciding metric to best_uri (replacing
        what was there); returns best_uri, which csclip.model.load_bundle reads."""
        value = float(metrics[self.best_metric])
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(model, spec, tmp, None, config)
            Path(tmp, BEST_METRICS_FILE).write_text(json.dumps(
                {"step": step, "metric": self.best_metric, "value": value,
                 **{k: metrics[k] for k in LOGGED_KEYS + HELD_OUT_KEYS if k in metrics}}))
            upload_dir(tmp, self.best_uri)
        self.best_value = value
        log.info("step %d: new best %s = %.2f -> %s", step, self.best_metric, value,
                 self.best_uri)
        return self.best_uri

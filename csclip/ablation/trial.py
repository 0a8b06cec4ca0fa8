"""One ablation trial (a Tune trainable): fine-tune one setting with Ray Train (metrics
forwarded to Tune), evaluate its checkpoint on the validation split, and log both to the
trial's MLflow child run under the sweep's parent run."""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from mlflow.entities import Metric
from pydantic import BaseModel
from ray import tune
from ray.tune.integration.ray_train import TuneReportCallback

from csclip import tracking, train
from csclip.ablation.grid import Grid, Row, Setting, check_setting, with_values
from csclip.ablation.report import TABLE_CAPTION, build_table, plot_curves
from csclip.config import flatten, validate_config
from csclip.config.eval import BenchmarkConfig, CheckpointSelection, SuitesConfig
from csclip.config.train import TrainConfig
from csclip.eval.pipeline import evaluate_bundle
from csclip.eval.report import paper_tables, plot_figure3
from csclip.eval.selection import SELECTION_LABEL, pick_paper
from csclip.model import load_bundle
from csclip.records import load_split

logger = logging.getLogger(__name__)


class SweepContext(BaseModel):
    """What every trial of a sweep shares; given to trials with tune.with_parameters."""

    model_config = {"extra": "forbid", "frozen": True}

    sweep: str  # Tune experiment name
    base: dict  # the base TrainConfig, model_dump(mode="json"), paths absolute
    settings: dict[str, list]  # setting key -> [[axis, value], ...]
    parent_run_id: str
    tracking_uri: str
    mlflow_experiment: str
    eval_seed: int = 0
    # Which checkpoint of each trial is evaluated: its final one, or "paper": the authors'
    # two rules (csclip.eval.selection.pick_paper).
    select: CheckpointSelection = "final"

    def setting(self, key: str) -> Setting:
        return Setting(tuple((str(a), v) for a, v in self.settings[key]))


def trial_config(base: TrainConfig, setting: Setting, sweep: str) -> TrainConfig:
    """The setting's TrainConfig, its Train run named after the sweep and setting, so that
    a restarted trial resumes its own Train run from its last checkpoint."""
    config = check_setting(base, setting)
    return with_values(config, {"run.name": f"{sweep}-{setting.slug}"},
                       origin=f"trial {setting.key}")


def run_trial(params: dict, sweep: dict, evaluate: Callable | None = None) -> None:
    """Tune trainable: fine-tune one setting (Ray Train, metrics forwarded to Tune), load
    its checkpoint, evaluate on the validation split, report the evaluation.

    params: Tune's trial config, {"setting": key}; sweep: SweepContext as a dict;
    evaluate: `(config, checkpoint_uri, seed) -> report with .metrics` (default
    evaluate_trial), e.g. to add a suite, or to stand in for an interrupted evaluation.
    """
    context = SweepContext.model_validate(sweep)
    setting = context.setting(params["setting"])
    base = validate_config(TrainConfig, context.base, origin="sweep base config")
    config = trial_config(base, setting, context.sweep)
    client = tracking.client(context.tracking_uri)
    experiment_id = tracking.experiment_id(client, context.mlflow_experiment)
    tags = {"csclip_sweep": context.sweep, "csclip_role": "trial",
            "csclip_setting": setting.key, tracking.PARENT_TAG: context.parent_run_id}
    run_id = tracking.find_or_create_run(client, experiment_id, tags, run_name=setting.key)
    started = time.time()
    try:
        tracking.log_params(client, run_id, {**{f"axis.{a}": v for a, v in setting.values},
                                    "setting": setting.key, **flatten(config)})
        client.set_tag(run_id, "csclip_trial_started", f"{started:.3f}")
        metrics, checkpoint_uri = _train_and_evaluate(config, setting, context, client,
                                                      experiment_id, run_id,
                                                      evaluate or evaluate_trial)
        client.set_terminated(run_id, "FINISHED")
    except Exception:
        client.set_terminated(run_id, "FAILED")
        raise
    logger.info("trial %s done in %.0f s: ht_all=%s", setting.key, time.time() - started,
                metrics.get("ht_all"))
    tune.report({**metrics, "trial_started": started, "checkpoint_uri": checkpoint_uri,
                 "mlflow_child_run_id": run_id})


def _train_and_evaluate(config: TrainConfig, setting: Setting, context: SweepContext, client,
                        experiment_id: str, run_id: str,
                        evaluate: Callable) -> tuple[dict[str, float], str]:
    """The trial's work, logged to its child run: metrics and the checkpoint URI."""
    started = time.time()
    result = train.run(config, callbacks=[TuneReportCallback()])
    trained = time.time()
    report = evaluate_selected(config, result.checkpoint_uri, context.eval_seed, evaluate,
                               context.select)
    metrics = {k: float(v) for k, v in report.metrics.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    metrics["trial_train_seconds"] = trained - started
    metrics["trial_eval_seconds"] = time.time() - trained
    # A Train run that had already finished (a resumed trial) comes back without its
    # MLflow id: find its run by the name the training code tags it with.
    train_run_id = result.mlflow_run_id or _train_run_id(client, experiment_id, result.run_name)
    curves: dict[str, list[tuple[int, float]]] = {}
    if train_run_id:
        client.set_tag(run_id, "csclip_train_run_id", train_run_id)
        # Nest the training run under the trial, so the UI shows sweep > trial > train.
        client.set_tag(train_run_id, tracking.PARENT_TAG, run_id)
        curves = copy_curves(client, train_run_id, run_id)
    tracking.log_metrics(client, run_id, metrics)
    _log_trial_files(client, run_id, setting, report, curves)
    return metrics, result.checkpoint_uri


def _train_run_id(client, experiment_id: str, run_name: str) -> str | None:
    return tracking.find_run(client, experiment_id, {tracking.RUN_NAME_TAG: run_name})


def validation_records(config: TrainConfig) -> list:
    """The validation split the trial is evaluated on (csclip.records.load_split)."""
    return load_split(config.data.units_uri, "val", config.data.world)


def evaluate_trial(config: TrainConfig, checkpoint_uri: str, seed: int, suites: dict | None = None):
    """The HalfTruthReport (half-truth, image-side, and the suites: the world's by default,
    or `suites`, a SuitesConfig as a dict, e.g. real-data suites under a data root) of a
    trained checkpoint on the validation split."""
    bundle = load_bundle(checkpoint_uri)
    # One seed for the trial's evaluation: the benchmark's, which the world suites' draws take.
    return evaluate_bundle(bundle, validation_records(config), benchmark=BenchmarkConfig(seed=seed),
                           suites=SuitesConfig.model_validate(suites or {}))


def evaluate_selected(config: TrainConfig, checkpoint_uri: str, seed: int, evaluate: Callable,
                      select: CheckpointSelection = "final"):
    """The trial's evaluation report. select "final": `evaluate` on the final checkpoint;
    "paper": the authors' two rules on the Train run's directory (the final checkpoint's
    parent), through csclip.eval.selection.pick_paper as `csclip evaluate --select paper`:
    the suites of the candidate step with the highest mean I2T, the half-truth of the
    held-out-best state, with `selected_step` (and `half_truth_step`) in its metrics."""
    if select == "final":
        return evaluate(config, checkpoint_uri, seed)
    run_dir = checkpoint_uri.rstrip("/").rsplit("/", 1)[0]
    pick = pick_paper(run_dir, lambda saved: evaluate(config, saved.uri, seed))
    steps = {"selected_step": float(pick.selection.step)}
    if pick.selection.half_truth_step is not None:
        steps["half_truth_step"] = float(pick.selection.half_truth_step)
    return replace(pick.report, metrics={**pick.report.metrics, **steps})


def _log_trial_files(client, run_id: str, setting: Setting, report,
                     curves: Mapping[str, list[tuple[int, float]]]) -> None:
    """The trial's own tables (its row in the Tables 16-17 layout; the evaluation's
    Tables 1/6/7 and image-side table), Figure 3 and its training curves, as artifacts of
    its child run."""
    grid = Grid((), False, (setting,), (Row(setting.key, "trial", None, setting, False),))
    caption = ""
    if "selected_step" in report.metrics:
        caption = f"Checkpoint {SELECTION_LABEL}: step {report.metrics['selected_step']:.0f}."
        if "half_truth_step" in report.metrics:
            caption += (f" Half-truth: step {report.metrics['half_truth_step']:.0f}, best on "
                        "the held-out training captions.")
    table = build_table(grid, {setting.key: report.metrics}, caption=caption)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "trial.md").write_text(f"# trial {setting.key}\n\n{TABLE_CAPTION}\n\n"
                                      f"{table.markdown()}")
        (out / "trial.csv").write_text(table.csv())
        (out / "metrics.json").write_text(json.dumps(report.metrics, indent=2, sort_keys=True))
        for stem, paper_table in paper_tables({setting.key: report}).items():
            paper_table.write(out, stem)
        plot_figure3({setting.key: report}, out / "figure3.png")
        if curves:
            plot_curves(curves, out / "curves.png", title=f"trial {setting.key}")
        for path in sorted(out.iterdir()):
            client.log_artifact(run_id, str(path))


def copy_curves(client, source_run_id: str, target_run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Copy every metric history of the training run into the trial's child run; returns
    the curves {metric: [(step, value), ...]} for the trial's plot."""
    curves: dict[str, list[tuple[int, float]]] = {}
    batch: list[Metric] = []
    for key in client.get_run(source_run_id).data.metrics:
        history = client.get_metric_history(source_run_id, key)
        curves[key] = [(m.step, m.value) for m in history]
        batch += [Metric(f"train/{key}", m.value, m.timestamp, m.step) for m in history]
    for start in range(0, len(batch), 1000):
        client.log_batch(target_run_id, metrics=batch[start:start + 1000])
    return curves

"""The sweep: a Ray Tune experiment with one trial per setting (new or restored, so a
rerun resumes), then the Tables 16-17 report, its plot and the MLflow parent run."""

from __future__ import annotations

import functools
import json
import logging
import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ray import tune

from csclip import tracking
from csclip.ablation.callback import TrialLinesCallback
from csclip.ablation.grid import (
    Grid,
    get_field,
    slugify,
    sweep_name,
    with_values,
)
from csclip.ablation.report import (
    TABLE_CAPTION,
    AblationTable,
    ReportFiles,
    build_table,
    publish_report,
)
from csclip.ablation.trial import (
    SweepContext,
    evaluate_selected,
    evaluate_trial,
    run_trial,
    trial_config,
)
from csclip.cluster import max_resources, training_worker_slots
from csclip.config import flatten
from csclip.config.eval import CheckpointSelection
from csclip.config.train import TrainConfig
from csclip.errors import ConfigError
from csclip.eval.selection import SELECTION_LABEL
from csclip.markdoc import update_marked_section
from csclip.storage import exists, filesystem_for, read_bytes, resolve_output
from csclip.tracking import resolve_uri

logger = logging.getLogger(__name__)


TRIAL_CPUS = 0.25  # the trial driver only waits on its Train run; workers hold the cores


def absolute_uri(uri: str) -> str:
    """Local paths and sqlite URIs made absolute (Tune runs trials in their own working
    directory, where a relative `mlflow.db` or `runs/` would be a different place)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    if "://" in uri:
        return uri
    return str(Path(uri).resolve())


def resolve_paths(config: TrainConfig) -> TrainConfig:
    """The config with its tracking URI resolved and its local paths (storage, units table)
    absolute; inside a Ray job a relative tracking store or storage path is refused
    (csclip.tracking.resolve_uri, csclip.storage.resolve_output)."""

    # tracking.uri None means $MLFLOW_TRACKING_URI or the local default: pin it, so every
    # trial (on any node, in any working directory) logs to the same store.
    updates = {"tracking.uri": resolve_uri(get_field(config, "tracking.uri"))}
    for path, resolve in (("run.storage_path", lambda v: resolve_output(v, "run.storage_path")),
                          ("data.units_uri", absolute_uri)):
        try:
            value = get_field(config, path)
        except ConfigError:
            continue
        if isinstance(value, str) and value:
            updates[path] = resolve(value)
    return with_values(config, updates, origin="config")


def max_concurrent_trials(cluster: Mapping[str, float], num_workers: int, use_gpu: bool,
                          cpus_per_worker: float = 1.0, trial_cpus: float = TRIAL_CPUS,
                          worker_resources: Mapping[str, float] | None = None) -> int:
    """How many trials fit the cluster at once: by GPUs when training on GPUs (each trial's
    Train run takes num_workers GPUs), else by CPUs (driver + workers per trial); never more
    than the training workers that `worker_resources` (run.worker_resources) admit.

    cluster: the cluster's resources at their largest (csclip.cluster.max_resources: on an
    autoscaling cluster, what the autoscaler may add, not the 0 GPUs present at start)."""

    workers = max(1, num_workers)
    if use_gpu:
        trials = int(cluster.get("GPU", 0) // workers)
    else:
        trials = int(cluster.get("CPU", 1) // (workers * cpus_per_worker + trial_cpus))
    slots = training_worker_slots(cluster, worker_resources or {})
    if slots is not None:  # e.g. only the training nodes' GPUs, not the vLLM nodes'
        trials = min(trials, slots // workers)
    return max(1, trials)


@dataclass(frozen=True)
class SweepResult:
    """What a sweep produced. errors: setting key -> error, for trials that failed (rerun
    the same command to resume them)."""

    name: str
    path: str
    parent_run_id: str
    table: AblationTable
    report: ReportFiles
    report_uri: str  # where the report is kept: the local folder, or s3:// (report.* are local)
    num_trials: int
    resumed: bool
    errors: dict[str, str]
    seconds: float


def tune_storage(config: TrainConfig) -> str:
    return f"{str(config.run.storage_path).rstrip('/')}/tune"


def run_sweep(base: TrainConfig, grid: Grid, *, max_concurrent: int | None = None,
              trial_cpus: float = TRIAL_CPUS, eval_seed: int = 0, reevaluate: bool = False,
              evaluate: Callable | None = None, suites: dict | None = None,
              select: CheckpointSelection = "final") -> SweepResult:
    """Run (or resume) a sweep: one Tune trial per setting of `grid`, each a Ray Train
    fine-tune plus evaluation; then the table, plot and MLflow parent run.

    The experiment name depends only on the base config and the grid, so rerunning the
    same command restores the experiment: finished trials are kept, failed or unfinished
    ones run again. reevaluate: evaluate every finished trial's checkpoint again with the
    current evaluation code (no retraining). evaluate: each trial's evaluation
    `(config, checkpoint_uri, seed) -> report` (default evaluate_trial; see run_trial).
    suites: the evaluation's suites (a SuitesConfig as a dict; default the world's), e.g.
    real-data suites with --reevaluate, which rewrites the report with their columns.
    select: "final" (default) evaluates each trial's final checkpoint; "paper" the authors'
    two rules, as `csclip evaluate --select paper` (csclip.eval.selection.pick_paper): the
    suites of the candidate step with the highest mean I2T on the evaluated benchmarks, the
    half-truth of the state best on held-out captions; the report says so.
    Ray must be initialised by the caller.
    """
    started = time.time()
    if suites and evaluate is None:
        evaluate = functools.partial(evaluate_trial, suites=suites)
    name = sweep_name(base, grid, select)
    base = resolve_paths(base)
    tracking.check_shared_store(base.tracking.uri, "the sweep's trials")
    storage = tune_storage(base)
    client = tracking.client(base.tracking.uri)
    experiment_id = tracking.experiment_id(client, base.tracking.experiment)
    parent_tags = {"csclip_sweep": name, "csclip_role": "sweep"}
    parent_id = tracking.find_or_create_run(client, experiment_id, parent_tags, run_name=name)
    tracking.log_params(client, parent_id, {
        "grid": grid.describe(base),
        "full_grid": grid.full, "num_trials": len(grid.settings),
        "checkpoint_selection": select,
        **{f"base.{k}": v for k, v in flatten(base).items()
           if k not in ("tracking.uri", "run.storage_path", "run.name")},
    })
    context = SweepContext(sweep=name, base=base.model_dump(mode="json"),
                           settings={s.key: [[a, v] for a, v in s.values] for s in grid.settings},
                           parent_run_id=parent_id,
                           tracking_uri=base.tracking.uri,
                           mlflow_experiment=base.tracking.experiment, eval_seed=eval_seed,
                           select=select)
    if max_concurrent is None:
        max_concurrent = max_concurrent_trials(max_resources(), base.run.num_workers,
                                               base.run.use_gpu, base.run.cpus_per_worker,
                                               trial_cpus, base.run.worker_resources)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, sweep=context.model_dump(mode="json"), evaluate=evaluate),
        {"cpu": trial_cpus})
    path = f"{storage}/{name}"
    resumed = tune.Tuner.can_restore(path)
    if resumed:
        logger.info("resuming sweep %s from %s", name, path)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    else:
        logger.info("sweep %s: %d trials, %d at a time, in %s", name, len(grid.settings),
                    max_concurrent, path)
        tuner = tune.Tuner(
            trainable,
            param_space={"setting": tune.grid_search([s.key for s in grid.settings])},
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent,
                                        trial_dirname_creator=trial_dirname),
            # A line per finished trial as it lands; Tune's box only says RUNNING.
            run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1,
                                      callbacks=[TrialLinesCallback(num_trials=len(grid.settings))]),
        )
    metrics, status, errors = collect_results(tuner.fit())
    report_uri = f"{storage}/{name}-report"
    if reevaluate:
        reevaluate_trials(base, grid, name, metrics, client, eval_seed, report_uri, suites,
                          select)
    metrics = {k: {**m, **_stored_evaluations(report_uri).get(k, {})} for k, m in metrics.items()}
    caption = ""
    if select == "paper":
        caption = (f"Checkpoints {SELECTION_LABEL}: each trial at its kept step with the "
                   "highest mean I2T on the benchmarks below, its half-truth from the state "
                   "best on the held-out training captions when the run kept one (the "
                   "authors' selection).")
    table = build_table(grid, metrics, status, caption=caption)
    report = publish_report(table, report_uri, title=f"Ablation {name}")
    for artifact in (report.markdown, report.csv, report.png):
        client.log_artifact(parent_id, str(artifact))
    tracking.log_metrics(client, parent_id, {"num_trials_done": len(metrics),
                                    "num_trials_failed": len(errors)})
    client.set_terminated(parent_id, "FAILED" if errors else "FINISHED")
    return SweepResult(name, path, parent_id, table, report, report_uri, len(grid.settings),
                       resumed, errors, time.time() - started)


def update_results_doc(path: str | Path, result: SweepResult, command: str) -> Path:
    """Put the sweep's table, with the command that made it, in the ablation section of a
    shared results file (docs/results.md); the PNG is copied next to it."""
    path = Path(path)
    image = path.parent / "img" / "ablation.png"
    image.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.report.png, image)
    failed = f" {len(result.errors)} trial(s) failed: rerun to resume." if result.errors else ""
    body = (f"## Ablations (Tables 16-17, synthetic world)\n\n"
            f"Made by `{command}` (sweep `{result.name}`, {result.num_trials} trials, "
            f"{result.seconds / 60:.1f} min wall clock{' after resuming' if result.resumed else ''})."
            f"{failed}\n\n{TABLE_CAPTION}\n\n{result.table.markdown()}\n"
            f"![half-truth accuracy per axis]({image.relative_to(path.parent)})\n")
    return update_marked_section(path, "ablation", body)


EVALUATIONS_FILE = "evaluations.json"  # re-evaluated metrics, by setting key


def reevaluate_trials(base: TrainConfig, grid: Grid, sweep: str, metrics: Mapping[str, dict],
                      client, eval_seed: int, report_uri: str,
                      suites: dict | None = None,
                      select: CheckpointSelection = "final") -> None:
    """Evaluate each finished trial's checkpoint again (the evaluation grew a suite, or was
    fixed, after the trials trained). The new metrics go to the trial's child run (tag
    csclip_reevaluated) and to <report>/evaluations.json, which later reruns read too."""
    stored = _stored_evaluations(report_uri)
    settings = {s.key: s for s in grid.settings}
    for key, old in metrics.items():
        started = time.time()
        config = trial_config(base, settings[key], sweep)
        report = evaluate_selected(config, old["checkpoint_uri"], eval_seed,
                                   functools.partial(evaluate_trial, suites=suites), select)
        new = {k: float(v) for k, v in report.metrics.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
        stored[key] = new
        tracking.log_metrics(client, old["mlflow_child_run_id"], new, step=1)
        client.set_tag(old["mlflow_child_run_id"], "csclip_reevaluated", f"{started:.3f}")
        logger.info("re-evaluated %s in %.0f s: ht_all=%.1f", key, time.time() - started,
                    new.get("ht_all", math.nan))
    fs, path = filesystem_for(f"{report_uri}/{EVALUATIONS_FILE}")
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(stored, indent=1, sort_keys=True).encode())


def _stored_evaluations(report_uri: str) -> dict[str, dict]:
    fs, path = filesystem_for(f"{report_uri}/{EVALUATIONS_FILE}")
    return json.loads(read_bytes(fs, path)) if exists(fs, path) else {}


def collect_results(results) -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    """From a Tune ResultGrid: metrics of finished trials, a status per setting, and the
    error of each failed trial, all keyed by setting key."""
    metrics: dict[str, dict] = {}
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    for index, result in enumerate(results):
        # A trial whose actor never started (e.g. its trainable failed to import) comes
        # back without its config: it is still reported, under its position.
        key = (result.config or {}).get("setting", f"trial #{index}")
        if result.error is not None:
            errors[key] = str(result.error).strip().splitlines()[-1][:300]
            status[key] = "failed"
        elif result.metrics and "ht_all" in result.metrics:
            metrics[key] = dict(result.metrics)
            status[key] = "done"
        else:
            status[key] = "no evaluation"
    return metrics, status, errors


def trial_dirname(trial) -> str:
    """Trial directories named after their setting (readable, and stable on restore)."""
    return f"trial-{slugify(trial.config['setting'])}"

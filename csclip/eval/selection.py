"""Checkpoint selection as the authors report it (`--select paper`): of a run's saved
steps, the one with the highest mean I2T over the evaluation benchmarks themselves.

The authors' tables pick, per run, the step whose mean `text_contrastive_accuracy` (I2T)
over every (dataset, subset) row of their evaluation CSV is highest, among the steps that
measured the most datasets (kargibora/CS-CLIP@16276c7,
experiments/ablations/ablation_utils.py `select_checkpoint`, used by every ablation notebook
with CHECKPOINT_STEP = None), step 0 left out when other steps exist
(experiments/evalviz/io.py `load_results_from_runs`, the main tables). The benchmarks that
choose the step are the ones then reported: a selection on the test set. csclip's default
stays the final checkpoint; this rule is offered to compare with the paper, and every
table it produces is labelled "selected on the test benchmarks".

Their half-truth numbers follow a second rule: the state best on the held-out 0.1% of the
training captions by contrastive accuracy (alignment/learning_alignment.py:755-760 at
98b40c0, reloaded and saved as last_checkpoint.pt by alignment/ft_experiment.py:380-404).
A run trained with data.val_ratio and run.best_metric contrastive_accuracy keeps that state
in best/ (csclip.train.holdout); `--select paper` takes the half-truth metrics and items
from it and everything else from the step chosen by mean I2T.

`pick_paper` applies both rules to a run's directory; `csclip evaluate --select paper`
(run_selected_evaluation) and the sweep's `--select paper` (csclip.ablation.trial) both call
it, each with its own evaluation of one checkpoint. The choices of `--select` are declared
once, csclip.config.eval.CHECKPOINT_SELECTIONS."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Generic, TypeVar

import pyarrow.fs as pafs

from csclip.config import flatten
from csclip.config.eval import EvalConfig
from csclip.errors import ConfigError
from csclip.eval.encoder import Encoder
from csclip.eval.halftruth import PreparedBenchmark, prepare_benchmark
from csclip.eval.pipeline import (
    STEP_FILE,
    evaluate_encoder,
    load_records,
    model_identity,
    model_label,
)
from csclip.eval.report import (
    ComparisonReport,
    HalfTruthReport,
    ModelIdentity,
    begin_outputs,
    log_comparison,
    write_outputs,
)
from csclip.eval.suites import find_named_suites
from csclip.eval.suites.registry import BENCHMARKS
from csclip.model import CONFIG_FILE, SPEC_FILE, load_bundle
from csclip.storage import exists, filesystem_for, read_bytes, resolve_output
from csclip.tracking import resolve_uri

log = logging.getLogger(__name__)

SELECTION_LABEL = "selected on the test benchmarks"
# The synthetic world's compositional suites, the rows when no real benchmark was run.
WORLD_ROWS: tuple[str, ...] = ("comp_i2t", "comp_i2t_replace")


def i2t_rows(metrics: Mapping[str, float]) -> dict[str, float]:
    """The I2T value of every (benchmark, subset) row measured, as the rows of the
    authors' evaluation CSV: `<benchmark>_<subset>_i2t` of the real-data suites (a
    benchmark's own average `<benchmark>_i2t` is not a row), else the world's suites."""
    # Longest name first, so sugarcrepe_pp_<subset> is not read as a sugarcrepe subset.
    names = sorted(BENCHMARKS, key=len, reverse=True)
    rows: dict[str, float] = {}
    for key, value in metrics.items():
        if not key.endswith("_i2t") or not _finite(value):
            continue
        benchmark = next((b for b in names if key.startswith(f"{b}_")), None)
        if benchmark is not None and key != f"{benchmark}_i2t":
            rows[key] = float(value)
    if rows:
        return rows
    return {k: float(metrics[k]) for k in WORLD_ROWS if _finite(metrics.get(k))}


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Selection:
    """The chosen step and, per saved step, its mean I2T and how many rows it measured."""

    step: int
    mean_i2t: dict[int, float | None]
    num_rows: dict[int, int]
    half_truth_step: int | None = None  # best/ by held-out contrastive accuracy, when kept

    def markdown(self) -> str:
        lines = [f"Checkpoint {SELECTION_LABEL}: the saved step with the highest mean I2T "
                 "over the evaluation benchmarks' rows (the authors' rule).", "",
                 "| step | mean I2T | rows | selected |", "|---|---|---|---|"]
        for step in sorted(self.mean_i2t):
            mean = self.mean_i2t[step]
            cell = "—" if mean is None else f"{mean:.2f}"
            lines.append(f"| {step} | {cell} | {self.num_rows[step]} | "
                         f"{'yes' if step == self.step else ''} |")
        lines.append("")
        if self.half_truth_step is None:
            lines.append("Half-truth: from the same step (the run kept no state best on "
                         "held-out training captions: data.val_ratio was off).")
        else:
            lines.append(f"Half-truth: from step {self.half_truth_step}, the state best on "
                         "the held-out training captions by contrastive accuracy (the "
                         "authors' last_checkpoint.pt; the run's best/).")
        return "\n".join(lines) + "\n"

    def csv(self, identities: Mapping[int, ModelIdentity | None] | None = None) -> str:
        """One row per saved step: the model's identity as the evaluation's CSVs give it
        (`model`, `pretrained`: the checkpoint, `step`), then `mean_i2t`, `num_rows` and
        `selected` (true/false); `identities` maps a step to its checkpoint's identity."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["model", "pretrained", "step", "mean_i2t", "num_rows", "selected"])
        for step in sorted(self.mean_i2t):
            mean = self.mean_i2t[step]
            who = (identities or {}).get(step)
            writer.writerow([who.model if who else "", (who.pretrained or "") if who else "",
                             step, "" if mean is None else f"{mean:.4f}",
                             self.num_rows[step], "true" if step == self.step else "false"])
        return out.getvalue()


def select_paper(metrics_by_step: Mapping[int, Mapping[str, float]]) -> Selection:
    """The authors' choice among saved steps: step 0 left out when others exist; of the
    steps that measured the most rows, the highest mean I2T; a tie goes to the earliest
    step (pandas' idxmax over steps in order, as their code). Raises ConfigError when no
    step measured an I2T row (there is nothing to select on)."""
    if not metrics_by_step:
        raise ConfigError("--select paper: the run has no saved checkpoints to choose from")
    rows = {step: i2t_rows(m) for step, m in metrics_by_step.items()}
    means = {step: (sum(r.values()) / len(r) if r else None) for step, r in rows.items()}
    counts = {step: len(r) for step, r in rows.items()}
    candidates = [s for s in sorted(rows) if s != 0] or sorted(rows)
    most = max(counts[s] for s in candidates)
    if most == 0:
        raise ConfigError("--select paper: no compositional benchmark was measured (no I2T "
                          "row), so no step can be selected; add --suite, or evaluate the "
                          "world's records")
    best = max((s for s in candidates if counts[s] == most), key=lambda s: (means[s], -s))
    return Selection(best, means, counts)


@dataclass(frozen=True)
class SavedCheckpoint:
    step: int
    uri: str
    # run.checkpoint_every of the run that saved it (its config.json); None without one.
    checkpoint_every: int | None = None

    @property
    def is_evaluation(self) -> bool:
        """Whether the step is one of the run's evaluations (a multiple of
        run.checkpoint_every), not only its last step; True when the cadence is unknown."""
        return self.checkpoint_every is None or self.step % self.checkpoint_every == 0


HELD_OUT_METRIC = "contrastive_accuracy"  # csclip.train.holdout.METRIC (no training import)
# The keys of the half-truth benchmark itself (csclip.eval.halftruth: half_truth_metrics,
# image_side_metrics, the pipeline's counts); every other key is a suite's.
HALF_TRUTH_PREFIXES: tuple[str, ...] = ("ht_", "winrate_", "consistency_", "num_items_",
                                        "image_side_", "num_images", "num_skipped_")


def held_out_best(run_dir: str) -> SavedCheckpoint | None:
    """The run's best/ when it was chosen by held-out contrastive accuracy (data.val_ratio
    with run.best_metric contrastive_accuracy), else None."""
    fs, path = filesystem_for(run_dir)
    best = f"{path.rstrip('/')}/best"
    if not (exists(fs, f"{best}/{SPEC_FILE}") and exists(fs, f"{best}/{STEP_FILE}")):
        return None
    saved = json.loads(read_bytes(fs, f"{best}/{STEP_FILE}"))
    if saved.get("metric") != HELD_OUT_METRIC or not isinstance(saved.get("step"), int):
        return None
    return SavedCheckpoint(saved["step"], f"{run_dir.rstrip('/')}/best")


def is_half_truth_key(key: str) -> bool:
    return key.startswith(HALF_TRUTH_PREFIXES)


R = TypeVar("R")  # a checkpoint's evaluation: .metrics, .items, .scores, .skipped


def with_half_truth_of(report: R, half_truth: R) -> R:
    """`report` (a HalfTruthReport) with the half-truth metrics, items, scores and skips of
    `half_truth` (the held-out-best state's report); its suites' keys stay."""
    metrics = {k: v for k, v in report.metrics.items() if not is_half_truth_key(k)}
    metrics.update({k: v for k, v in half_truth.metrics.items() if is_half_truth_key(k)})
    return replace(report, metrics=metrics, items=half_truth.items, scores=half_truth.scores,
                   skipped=half_truth.skipped)


def saved_checkpoints(run_dir: str) -> list[SavedCheckpoint]:
    """The checkpoints a training run saved (its checkpoint_* folders, final/ and best/),
    one per step, in step order. `run_dir` is <run.storage_path>/<run name>, local or
    s3://. Raises ConfigError when it holds none (e.g. it is a single checkpoint)."""
    fs, path = filesystem_for(run_dir)
    if exists(fs, f"{path}/{SPEC_FILE}"):
        raise ConfigError(f"--select paper: {run_dir} is one checkpoint; give the run's "
                          "directory (<run.storage_path>/<run name>), whose saved steps are "
                          "compared")
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    found: dict[int, SavedCheckpoint] = {}
    # checkpoint_* first: final/ and best/ copy one of them (or a step they no longer keep).
    for info in sorted(infos, key=lambda i: (not i.base_name.startswith("checkpoint_"),
                                             i.base_name)):
        if info.type != pafs.FileType.Directory:
            continue
        step_file = f"{info.path}/{STEP_FILE}"
        if not (exists(fs, f"{info.path}/{SPEC_FILE}") and exists(fs, step_file)):
            continue
        step = json.loads(read_bytes(fs, step_file)).get("step")
        if isinstance(step, int) and step not in found:
            uri = info.path if "://" not in run_dir else \
                f"{run_dir.split('://', 1)[0]}://{info.path}"
            found[step] = SavedCheckpoint(step, uri, _checkpoint_every(fs, info.path))
    if not found:
        raise ConfigError(f"--select paper: {run_dir} holds no saved checkpoints (folders "
                          f"with {SPEC_FILE} and {STEP_FILE}); give a training run's directory")
    return [found[s] for s in sorted(found)]


def _checkpoint_every(fs, path: str) -> int | None:
    """run.checkpoint_every of the training config saved beside a checkpoint, if any."""
    if not exists(fs, f"{path}/{CONFIG_FILE}"):
        return None
    every = json.loads(read_bytes(fs, f"{path}/{CONFIG_FILE}")).get("run", {}).get(
        "checkpoint_every")
    return every if isinstance(every, int) and every > 0 else None


def candidate_checkpoints(run_dir: str) -> list[SavedCheckpoint]:
    """The saved steps the I2T rule chooses among: the run's evaluations only, the
    multiples of run.checkpoint_every. The authors evaluated every eval_every_k_steps and
    not at the last step (alignment/learning_alignment.py:904 @16276c7), while csclip.train
    also saves the last step whatever its number: that one competes only when it is a
    multiple. Raises ConfigError when no saved step is one."""
    saved = saved_checkpoints(run_dir)
    candidates = [c for c in saved if c.is_evaluation]
    if not candidates:
        raise ConfigError(f"--select paper: {run_dir} kept no checkpoint at a multiple of "
                          f"run.checkpoint_every (steps {[c.step for c in saved]}), the "
                          "evaluations the authors' rule chooses among; train with "
                          "run.checkpoint_every at most optim.max_steps")
    return candidates


@dataclass(frozen=True)
class PaperPick(Generic[R]):
    """What `--select paper` keeps of a run: the selection, the checkpoint chosen by mean
    I2T, the held-out-best checkpoint (None when the run kept none), each candidate step's
    report, and `report`: the chosen step's, with the held-out-best's half-truth."""

    selection: Selection
    checkpoint: SavedCheckpoint
    half_truth: SavedCheckpoint | None
    reports: dict[int, R]
    report: R


def pick_paper(run_dir: str, evaluate: Callable[[SavedCheckpoint], R]) -> PaperPick[R]:
    """The authors' two rules on a training run's directory: `evaluate` each candidate
    step (candidate_checkpoints), keep the suites of the one with the highest mean I2T
    (select_paper) and the half-truth of best/ when held-out contrastive accuracy chose it
    (held_out_best, evaluated too when it is not a candidate); without such a best/ the
    half-truth is the chosen step's, with a warning."""
    checkpoints = candidate_checkpoints(run_dir)
    reports = {saved.step: evaluate(saved) for saved in checkpoints}
    selection = select_paper({step: r.metrics for step, r in reports.items()})
    chosen = next(c for c in checkpoints if c.step == selection.step)
    report = reports[selection.step]
    best = held_out_best(run_dir)
    if best is None:
        log.warning("--select paper: %s has no best/ chosen by held-out contrastive "
                    "accuracy (train with data.val_ratio > 0 and run.best_metric "
                    "contrastive_accuracy); half-truth comes from step %d too",
                    run_dir, selection.step)
    else:
        selection = replace(selection, half_truth_step=best.step)
        best_report = reports[best.step] if best.step in reports else evaluate(best)
        report = with_half_truth_of(report, best_report)
    log.info("%s: step %d %s (mean I2T by step %s); half-truth from step %s", run_dir,
             selection.step, SELECTION_LABEL, selection.mean_i2t,
             selection.half_truth_step if best is not None else selection.step)
    return PaperPick(selection, chosen, best, reports, report)


@dataclass(frozen=True)
class SelectedEvaluation:
    """The selected checkpoint's evaluation (its report is labelled with the selection)."""

    selection: Selection
    checkpoint: SavedCheckpoint
    report: ComparisonReport
    files: dict[str, Path]


def selected_label(model_label: str, step: int, half_truth_step: int | None = None) -> str:
    """The model's name in every table: which step, and that the test benchmarks chose it,
    and the half-truth step when it is another (only characters MLflow accepts in metric
    keys)."""
    label = f"{model_label} step {step} - {SELECTION_LABEL}"
    if half_truth_step is None:
        return label
    return f"{label} - half-truth step {half_truth_step} best on held-out captions"


class CheckpointEvaluator:
    """`csclip evaluate`'s evaluation of one saved checkpoint, on one benchmark built from
    the config's records (built, and the named suites found, once, before any checkpoint
    loads); each report carries its checkpoint's identity (model, the checkpoint as
    pretrained, its step)."""

    def __init__(self, config: EvalConfig):
        self.config = config
        # A named suite not under suites.data_root fails before any checkpoint loads.
        self.found = (find_named_suites(config.suites, refuse_missing=True)
                      if config.suites.names else None)
        self.records = load_records(config.data, config.benchmark.image_root)
        self.prepared: PreparedBenchmark = prepare_benchmark(self.records, config.benchmark)

    def __call__(self, saved: SavedCheckpoint) -> HalfTruthReport:
        config = self.config
        bundle = load_bundle(saved.uri, device=config.scoring.device)
        report = evaluate_encoder(
            model_label(bundle), Encoder.for_bundle(bundle, config.scoring), self.prepared,
            self.records, config.benchmark, config.suites, self.found)
        log.info("step %d: mean I2T %s", saved.step, _mean_text(i2t_rows(report.metrics)))
        return replace(report, identity=model_identity(bundle))


def _mean_text(rows: Mapping[str, float]) -> str:
    return f"{sum(rows.values()) / len(rows):.2f} over {len(rows)} rows" if rows else "n/a"


def run_selected_evaluation(config: EvalConfig) -> SelectedEvaluation:
    """`csclip evaluate --checkpoint <run dir> --select paper`: evaluate every candidate
    step of the run, keep what the authors' rules pick (pick_paper), and write its tables
    (the model named "<model> step <S> - selected on the test benchmarks") plus
    selection.md/.csv (every step's mean I2T) to config.out_dir; log them to MLflow when
    tracking is on."""
    if not config.checkpoint:
        raise ConfigError("--select paper: give the run's directory with --checkpoint")
    out_dir = Path(resolve_output(config.out_dir, "out_dir"))
    candidate_checkpoints(config.checkpoint)  # no candidate: refused before out_dir is touched
    begin_outputs(out_dir)
    evaluate = CheckpointEvaluator(config)
    pick = pick_paper(config.checkpoint, evaluate)
    selection, report = pick.selection, pick.report
    label = selected_label(report.name, selection.step, selection.half_truth_step)
    selected = {label: replace(report, name=label)}
    identities: dict[int, ModelIdentity | None] = {
        step: r.identity for step, r in pick.reports.items()}
    markdown, files = write_outputs(selected, evaluate.prepared, out_dir,
                                    results_template=config.results_template, extra_files={
                                        "selection.md": selection.markdown(),
                                        "selection.csv": selection.csv(identities)})
    markdown = f"{selection.markdown()}\n{markdown}"
    run_id = None
    if config.tracking.enabled:
        params = {"seed": config.benchmark.seed, **flatten(config),
                  "checkpoint_selection": f"paper ({SELECTION_LABEL})",
                  "selected_step": selection.step, "selected_checkpoint": pick.checkpoint.uri,
                  "half_truth_step": selection.half_truth_step,
                  "half_truth_checkpoint": pick.half_truth.uri if pick.half_truth else None}
        run_id = log_comparison(selected, files, resolve_uri(config.tracking.uri),
                                config.tracking.experiment, params)
    return SelectedEvaluation(selection, pick.checkpoint,
                              ComparisonReport(selected, markdown, files, run_id), files)

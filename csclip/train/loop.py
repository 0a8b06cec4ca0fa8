"""Fine-tuning on Ray Train (TorchTrainer, Train V2): CLIP, NegCLIP or CS-CLIP from one loop.

The driver (`run`) validates the config, checks the data, opens the MLflow run and starts
the trainer; each worker (`train_loop_per_worker`) builds the model, restores the last
checkpoint if there is one (or `run.resume_from`), and steps through its Ray Data shard
with `csclip.train.step.train_step`. Rerunning the same config resumes: the run name is a hash of
the resolved config (or `run.name`). The batches are a function of the config
(csclip.train.stream.deterministic), and each epoch is its own Ray Train dataset: a resumed
worker starts with its step's epoch and skips exactly the batches of it trained on before
(`_epoch_batches`) and restores its random generators (csclip.train.rng), so its losses
are those of an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import torch

from csclip.config import flatten
from csclip.config.train import (
    DataConfig,
    RunSection,
    TrainConfig,
    worker_batch_size,
)
from csclip.errors import CheckpointMismatch, ConfigError
from csclip.loss import objective_for
from csclip.model import (
    SPEC_FILE,
    TRAIN_STATE_FILE,
    ClipBundle,
    ModelSpec,
    apply_training_options,
    bundle_from_config,
    check_spec,
    is_checkpoint_dir,
    load_train_state,
    load_weights_into,
    read_spec,
    save_checkpoint,
    spec_from_config,
    spec_of,
)
from csclip.ownership import output_lease
from csclip.tracking import StepLogger, check_shared_store, finish_run, open_run, resolve_uri
from csclip.train import rng as generators
from csclip.train.console import first_step_line, step_line
from csclip.train.finished import (  # noqa: F401  (TrainResult, storage_root: re-exported)
    METRICS_FILE,
    TrainResult,
    check_unfinished_run,
    export_final,
    finished_result,
    read_metrics,
    storage_root,
)
from csclip.train.global_batch import shard_name
from csclip.train.holdout import evaluation_due, load_held_out
from csclip.train.identity import (  # noqa: F401  (re-exported)
    HOW_IT_RUNS_FIELDS,
    IDENTITY_FIELDS,
    IDENTITY_FIELDS_WHEN_SET,
    run_identity,
    run_name,
)
from csclip.train.lookahead import NextEpoch, epochs_ahead
from csclip.train.optim import lr_at
from csclip.train.prepared import ImageNormalizer
from csclip.train.shards import held_out_rows, plan_shards, shard_datasets
from csclip.train.source_shards import source_shards
from csclip.train.step import (
    StepMetrics,
    StepOptions,
    Training,
    build_training,
    train_step,
)
from csclip.train.stream import (
    local_shuffle_seed,
    plan_steps,
    preprocess_key,
)
from csclip.train.warm_start import add_layout_head, layout_question

logger = logging.getLogger(__name__)





_DRIVER_DATA_PASSES = threading.Lock()  # _train: one run's driver-side data passes at a time

# Ray Train's own console lines: warnings only, so that the step lines (ours) stay
# readable; every level is in the session's log files (/tmp/ray/session_latest/logs).
RAY_TRAIN_CONSOLE_LEVEL = "WARNING"






# ---------------------------------------------------------------------------------------
# From the config to a step (no Ray)
# ---------------------------------------------------------------------------------------

def step_options(config: TrainConfig) -> StepOptions:
    """The csclip.train.step options of `config`."""
    return StepOptions(objective=objective_for(config.loss, config.sampling.num_unit_slots,
                                               _layout_question(config.data)),
                       precision=config.run.precision, accum_freq=config.optim.accum_freq,
                       grad_clip=config.optim.grad_clip,
                       logit_scale_max=config.optim.logit_scale_max,
                       channels_last=config.run.channels_last,
                       compile=config.run.compile is not None,
                       compile_mode=config.run.compile or "default",
                       trim_text=config.run.trim_text,
                       locked_image_cache_mb=config.run.locked_image_cache_mb)


def _layout_question(data: DataConfig):
    # loss.method layout's question: the synthetic world's (csclip.train.warm_start).
    return layout_question(data.world) if data.units_uri is None else None


@dataclass(frozen=True)
class WorkerHooks:
    """Test hooks, never user config (`run(..., hooks=)` only).

    fail_after_step: once this step is logged (and checkpointed, if it is a checkpoint
    step) on a fresh attempt (not a restored one), end the worker as a crash would:
    fail_by "raise" raises in the loop; "sigkill" kills the worker's process with SIGKILL
    (nothing of it runs after that). fail_rank: the rank that fails; None: every rank.
    loss_log: a local directory every worker reaches; each rank appends every logged
    step's losses, with its process id, to rank-<rank>.jsonl (tests/train_helpers.py reads them)."""

    fail_after_step: int | None = None
    fail_by: Literal["raise", "sigkill"] = "raise"
    fail_rank: int | None = None
    loss_log: str | None = None


@dataclass(frozen=True)
class WorkerPlan:
    """What the driver tells every worker besides the config: the step budget, where to
    log, where best/ goes, and the test hooks."""

    total_steps: int
    steps_per_epoch: int
    num_epochs: int
    mlflow_run_id: str | None
    tracking_uri: str | None
    best_uri: str
    hooks: WorkerHooks = WorkerHooks()
    heldout: tuple = ()  # data.val_ratio's held-out rows: Arrow ObjectRefs (csclip.train.holdout)


@dataclass
class _State:
    step: int = 0
    samples: int = 0
    restored_from: int | None = None
    # Every rank's generator states at the restored checkpoint (csclip.train.rng), in rank
    # order; None when it has none (a fresh start, or a checkpoint written before them).
    rng: list[dict] | None = None


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker trains with: the step's Training, the model's spec and bundle
    (preprocessing and tokenizer, for evaluation during training), and the step state."""

    training: Training
    spec: ModelSpec
    bundle: ClipBundle
    state: _State


def prepare_training(config: TrainConfig, device: torch.device, checkpoint_dir: str | None = None,
                     wrap=None) -> WorkerSetup:
    """Build the model with its training options (checkpointing, locking), load the
    weights of `checkpoint_dir` on the CPU, then `build_training` (device, runner, AdamW,
    optimizer and scaler state) and read the step to resume from.

    wrap: ray.train.torch.prepare_model in a worker (DDP); None in a single process.
    """
    bundle = bundle_from_config(config.model)
    model, spec = bundle.model, spec_of(bundle.model, config.model.name)
    apply_training_options(model, config.model)
    options = step_options(config)
    if options.objective.layout is not None:  # its head is trained, checkpointed, resumed
        add_layout_head(model, options.objective.layout)
    saved: dict = {}
    if checkpoint_dir is not None:
        load_weights_into(model, checkpoint_dir, spec)
        saved = load_train_state(checkpoint_dir) or {}
    model.train()
    training = build_training(model, config.optim, options, device,
                              train_state=saved, wrap=wrap)
    step = int(saved.get("step", 0))
    state = _State(step=step, samples=int(saved.get("samples", 0)),
                   restored_from=step if checkpoint_dir is not None else None,
                   rng=saved.get("rng"))
    return WorkerSetup(training, spec, bundle, state)


def batch_options(data: DataConfig, device: torch.device, seed: int,
                  num_workers: int = 1) -> dict:
    """Keyword arguments of Ray Data's `iter_torch_batches` for one worker."""
    return {"batch_size": worker_batch_size(data.batch_size, data.batch_scope, num_workers),
            "drop_last": True, "device": device,
            "prefetch_batches": data.prefetch_batches,
            # Page-locked buffers only help host-to-GPU copies (and need CUDA).
            "pin_memory": data.pin_memory and device.type == "cuda",
            "local_shuffle_buffer_size": data.shuffle_buffer or None,
            "local_shuffle_seed": seed if data.shuffle_buffer else None}


def check_resume_from(config: TrainConfig, spec: ModelSpec) -> None:
    """Raise ConfigError / CheckpointMismatch unless `run.resume_from` (when set) is a
    checkpoint directory with training state whose model matches `spec`."""
    path = config.run.resume_from
    if path is None:
        return
    if not Path(path).is_dir():
        raise ConfigError(f"run.resume_from: {path} is not a directory; give one of a run's "
                          "checkpoint_* directories")
    if not is_checkpoint_dir(path):
        raise CheckpointMismatch(f"run.resume_from: {path} has no {SPEC_FILE}; it is not a "
                                 "csclip checkpoint")
    if not Path(path, TRAIN_STATE_FILE).is_file():
        raise CheckpointMismatch(
            f"run.resume_from: {path} has no {TRAIN_STATE_FILE} (a run's final/ export keeps "
            "only the weights); resume from one of its checkpoint_* directories, or start "
            f"from the weights alone with model.pretrained={path}")
    check_spec(read_spec(path), spec, path)


# ---------------------------------------------------------------------------------------
# The worker loop
# ---------------------------------------------------------------------------------------

@dataclass
class _Window:
    """Samples since the last time the host read the step metrics (throughput)."""

    start: float
    samples: int = 0
    data_wait: float = 0.0  # seconds blocked on the Ray Data stream


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train entry: validate the config, build, restore, train, checkpoint, report."""
    import ray.train.torch  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    config = TrainConfig.model_validate(loop_config["config"])
    plan: WorkerPlan = loop_config["plan"]
    _worker_logging()
    if config.run.data_loop_period_s is not None:  # before the first epoch's executor starts
        from csclip.train.pace import pace_ray_data  # noqa: PLC0415  imports ray: a training step runs without Ray (tests/test_layout.py)

        pace_ray_data(config.run.data_loop_period_s)
    context = ray.train.get_context()
    rank = context.get_world_rank()
    generators.seed_all(config.run.seed + rank)
    if config.run.torch_threads is not None:
        torch.set_num_threads(config.run.torch_threads)
    device = ray.train.torch.get_device()
    open_epoch = _epoch_opener(config, device, rank)
    with _checkpoint_dir(config.run) as directory:
        # A fresh run starts with epoch 0: its stream starts (shuffle, first map task,
        # first batch) while the model is built and loaded, so neither waits for the other.
        first_epoch = NextEpoch(*open_epoch(0)) if directory is None else None
        try:
            setup = prepare_training(config, device, directory, wrap=ray.train.torch.prepare_model)
        except BaseException:
            if first_epoch is not None:
                first_epoch.close()
            raise
        if directory is not None:
            logger.info("resumed from %s at step %d", directory, setup.state.step)
    training, state = setup.training, setup.state
    step_logger = StepLogger(plan.tracking_uri, plan.mlflow_run_id if rank == 0 else None,
                             flush_every=config.run.log_every)
    evaluator = _periodic_evaluator(config, plan) if rank == 0 else None
    _restore_generators(state, rank, context.get_world_size(), device)  # the last draw first
    loss_log = None
    if plan.hooks.loss_log is not None:
        Path(plan.hooks.loss_log).mkdir(parents=True, exist_ok=True)
        loss_log = Path(plan.hooks.loss_log, f"rank-{rank}.jsonl")
    total = plan.total_steps
    metrics, window, last = StepMetrics(), _Window(time.perf_counter()), {}
    first_step = state.step + 1  # of this worker: a line says training began
    images = ImageNormalizer(setup.spec.preprocess_cfg, device)  # the stream ships uint8 pixels
    for epoch, batches in _epoch_batches(open_epoch, plan, state.step, rank, first_epoch):
        tick = time.perf_counter()
        for batch in batches:
            data_wait = time.perf_counter() - tick  # blocked on the Ray Data stream for this batch
            if state.step >= total:
                break
            lr = lr_at(state.step, config.optim, total, plan.steps_per_epoch)
            for group in training.optimizer.param_groups:
                group["lr"] = lr
            parts = train_step(training, images(batch))
            global_batch = batch["image"].shape[0] * context.get_world_size()
            state.step += 1
            state.samples += global_batch
            window.samples += global_batch
            window.data_wait += data_wait
            metrics.add(state.step, parts, training.model.logit_scale, lr)
            checkpoint_now = state.step % config.run.checkpoint_every == 0 or state.step == total
            if state.step % config.run.log_every == 0 or checkpoint_now:
                last = _publish(metrics, window, step_logger, plan.steps_per_epoch, loss_log)
                if (state.step % config.run.log_every == 0 or state.step == total) and rank == 0:
                    logger.info(step_line(config.loss.method, state.step, total, last, lr))
            elif state.step == first_step and rank == 0:
                logger.info(first_step_line(config.loss.method, state.step, total,
                                            time.perf_counter() - window.start))
            if evaluator is not None and evaluation_due(state.step, total, config.run.eval_every,
                                                        plan.steps_per_epoch):
                started = time.perf_counter()
                _evaluate_during_training(evaluator, setup, config, state.step, step_logger,
                                          str(device))
                window.start += time.perf_counter() - started  # samples/s counts training only
            if checkpoint_now:
                _checkpoint(training, setup.spec, state, config, last, rank, device)
            _injected_failure(plan.hooks, state, rank)
            tick = time.perf_counter()  # after logging and checkpointing: the next wait is the data's
        if state.step < min(total, (epoch + 1) * plan.steps_per_epoch):
            raise RuntimeError(f"epoch {epoch} ran out of data at step {state.step} "
                               f"(planned {plan.steps_per_epoch} steps an epoch)")
    step_logger.flush()
    if state.step < total:
        raise RuntimeError(f"data ran out at step {state.step} of {total}")
    if not last:  # restored at the end: nothing left to do, report the state
        ray.train.report({"step": state.step, "resumed_from": state.restored_from}, checkpoint=None)


def _epoch_batches(open_epoch: Callable[[int], tuple[object, Iterator[dict]]], plan: WorkerPlan,
                   step: int, rank: int, opened: NextEpoch | None = None
                   ) -> Iterator[tuple[int, Iterator[dict]]]:
    """(epoch, this worker's batches of it) from the epoch of `step` on, with the batches
    of that epoch before `step` (trained on before a restart) already skipped.

    Each epoch is its own Ray Train dataset (csclip.train.shards.shard_datasets), split
    equally over the workers (one worker iterates it whole, without a split), and each
    gets its own iterator and local shuffle buffer
    (seeded by seed, epoch and rank). Ray Train configures a dataset only when the workers
    first ask for its shard, and does so again for every worker group it starts: so a
    group restarted after a failure (run.max_failures) or a rerun of the config begins
    with the epoch it resumes in, and never runs the epochs before it. With the order
    deterministic (csclip.train.stream.deterministic), the skipped batches are exactly
    those already trained on. A split epoch's coordinator ends when the caller asks for
    the next epoch (csclip.train.ingest): iterate this to its end. The next epoch opens
    a few batches before this one ends (csclip.train.lookahead). opened: the first
    epoch, opened already (open_epoch gives each epoch's shard and batches).
    """
    from csclip.train.ingest import release_epoch  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    first = step // plan.steps_per_epoch
    # The next epoch's stream starts a few batches before this one ends (its shuffle is
    # a barrier): csclip.train.lookahead. The skipped batches were trained on before a
    # restart.
    for epoch, shard, batches in epochs_ahead(open_epoch, first, plan.num_epochs,
                                              plan.steps_per_epoch,
                                              skip=step - first * plan.steps_per_epoch,
                                              opened=opened):
        yield epoch, batches
        batches.close()  # stops its prefetching (the last epoch may end before its data)
        release_epoch(shard, rank)  # every worker is past it: its coordinator ends


def _epoch_opener(config: TrainConfig, device: torch.device, rank: int
                  ) -> Callable[[int], tuple[object, Iterator[dict]]]:
    """open_epoch(epoch) -> (this worker's shard of the epoch, an iterator of its batches)."""
    import ray.train  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    def open_epoch(epoch: int) -> tuple[object, Iterator[dict]]:
        shard = ray.train.get_dataset_shard(shard_name(epoch, rank, config.data.batch_scope))
        return shard, iter(shard.iter_torch_batches(**batch_options(
            config.data, device, local_shuffle_seed(config.run.seed, epoch, rank),
            config.run.num_workers)))

    return open_epoch


def _publish(metrics: StepMetrics, window: _Window, step_logger, steps_per_epoch: int,
             loss_log: Path | None = None) -> dict:
    """Read the buffered steps' metrics (one host sync), log each to MLflow (and to
    `loss_log`, WorkerHooks.loss_log's file of this rank), and return the last step's,
    with the window's samples/s."""
    rows = metrics.take()
    now = time.perf_counter()
    elapsed = max(now - window.start, 1e-9)
    rows[-1]["samples_per_s"] = window.samples / elapsed
    rows[-1]["data_wait_frac"] = window.data_wait / elapsed
    window.start, window.samples, window.data_wait = now, 0, 0.0
    if loss_log is not None:  # closed at once: a SIGKILL right after loses nothing
        with loss_log.open("a") as out:
            out.writelines(json.dumps({"pid": os.getpid(), "step": row["step"],
                                       "loss": row["loss"]}) + "\n" for row in rows)
    for row in rows:
        row["epoch"] = row["step"] / max(1, steps_per_epoch)
        step_logger.log(row["step"], row)
    return rows[-1]


def _injected_failure(hooks: WorkerHooks, state: _State, rank: int) -> None:
    """WorkerHooks.fail_after_step: end a fresh attempt after that step, as a crash would."""
    if (hooks.fail_after_step is None or state.restored_from is not None
            or state.step < hooks.fail_after_step or hooks.fail_rank not in (None, rank)):
        return
    if hooks.fail_by == "sigkill":
        logger.warning("rank %d: killing this worker (pid %d) after step %d (test hook)",
                       rank, os.getpid(), state.step)
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected failure after step {state.step} (fail_after_step)")


def _restore_generators(state: _State, rank: int, world_size: int,
                        device: torch.device) -> None:
    """Set this worker's random generators to its rank's state at the restored
    checkpoint, so the steps after a restart draw what the uninterrupted run drew. A
    checkpoint without them (written before they were saved) or of another number of
    workers leaves the generators seeded by (run.seed, rank), and says so."""
    if state.restored_from is None:
        return
    if state.rng is None or len(state.rng) != world_size:
        logger.warning("the checkpoint of step %d has %s; the random generators start from "
                       "run.seed instead", state.restored_from,
                       "no generator states" if state.rng is None else
                       f"the generator states of {len(state.rng)} workers, not {world_size}")
        return
    generators.restore(state.rng[rank], device)


# -- evaluation during training (run.eval_every; the logic lives in csclip.train.periodic) --

def _periodic_evaluator(config: TrainConfig, plan: WorkerPlan):
    """Rank 0's PeriodicEvaluator over the capped validation split, or None when
    run.eval_every is off."""
    if config.run.eval_every is None and not plan.heldout:
        return None
    from csclip.train.periodic import PeriodicEvaluator, validation_records  # noqa: PLC0415  imports csclip.eval, which a training step never loads (tests/test_layout.py)

    records = validation_records(config.data.units_uri, config.data.world,
                                 config.run.eval_max_images, required=not plan.heldout)
    return PeriodicEvaluator(records, config.run.best_metric, plan.best_uri,
                             seed=config.run.seed, heldout=load_held_out(plan.heldout, config))


def _evaluate_during_training(evaluator, setup: WorkerSetup, config: TrainConfig, step: int,
                              step_logger, device: str) -> None:
    """Score the live model, log val_<key> against the step, keep best/ when it improved."""
    from csclip.train.periodic import HELD_OUT_KEYS, LOGGED_KEYS  # noqa: PLC0415  imports csclip.eval, which a training step never loads (tests/test_layout.py)

    bundle, model = setup.bundle, setup.training.model  # the fp32 weights AdamW steps
    live = ClipBundle(model, bundle.preprocess, bundle.tokenizer, bundle.name, bundle.pretrained)
    metrics = evaluator.evaluate(live, device)
    keys = [k for k in LOGGED_KEYS + HELD_OUT_KEYS if k in metrics]
    step_logger.log(step, {f"val_{k}": metrics[k] for k in keys})
    step_logger.flush()
    logger.info("step %d eval: %s", step, ", ".join(f"{k} {metrics[k]:.1f}" for k in keys))
    if evaluator.is_better(metrics):
        evaluator.save_best(model, setup.spec, config.model_dump(mode="json"), step, metrics)


def _worker_logging() -> None:
    # Ray workers have no handler for our logger; progress lines should reach the driver.
    csclip_logger = logging.getLogger("csclip")
    csclip_logger.setLevel(logging.INFO)
    # open_clip logs every model construction step at INFO through the root logger.
    logging.getLogger().setLevel(logging.WARNING)
    if not csclip_logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        csclip_logger.addHandler(handler)


@contextlib.contextmanager
def _checkpoint_dir(run_section: RunSection) -> Iterator[str | None]:
    """The directory to restore from: this run's last checkpoint (a restart), else
    `run.resume_from`, else None."""
    import ray.train  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        yield run_section.resume_from
        return
    with checkpoint.as_directory() as directory:
        yield directory


def _checkpoint(training: Training, spec: ModelSpec, state: _State, config: TrainConfig,
                metrics: dict, rank: int, device: torch.device) -> None:
    import ray.train  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    report = {**metrics, "resumed_from": state.restored_from}
    # Every rank's generators, gathered to rank 0 (a collective), saved as plain tensors.
    rng = generators.gather(generators.capture(device), ray.train.get_context().get_world_size())
    if rank != 0:  # every rank reports (a barrier); only rank 0 writes
        ray.train.report(report, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as directory:
        train_state = {"optimizer": training.optimizer.state_dict(),
                       "scaler": training.scaler.state_dict(),
                       "step": state.step, "samples": state.samples, "rng": rng}
        save_checkpoint(training.model, spec, directory, train_state, config.model_dump(mode="json"))
        Path(directory, METRICS_FILE).write_text(json.dumps(report, default=str))
        ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(directory))


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------

def run(config: TrainConfig, callbacks: Sequence = (), *, hooks: WorkerHooks = WorkerHooks()
        ) -> TrainResult:
    """_train under the lease of the run's storage, <run.storage_path>/<run name>: two
    trainings of one run name would resume the same checkpoints and MLflow run, so a
    second live one is refused (a DataError naming the holder), and one whose holder died
    is taken over (csclip.ownership). A finished run is answered without a lease; the
    checks that can refuse the run come first, so a refused run writes nothing."""
    cached = finished_result(config)
    if cached is not None:
        logger.info("run %s already finished: %s", run_name(config), cached.checkpoint_uri)
        return cached
    check_run(config)
    uri = f"{storage_root(config).rstrip('/')}/{run_name(config)}"
    with output_lease(uri, "csclip train", config=config):
        return _train(config, callbacks, hooks=hooks)


def check_run(config: TrainConfig) -> ModelSpec:
    """What can refuse `config` before anything is written: the model name, another
    config's unfinished run under the same name, the tracking store, run.resume_from.
    Returns the model's spec."""
    spec = spec_from_config(config.model)  # a bad model name fails here, before Ray
    check_unfinished_run(config)
    if config.tracking.enabled:  # rank 0 logs every step from wherever it runs
        check_shared_store(resolve_uri(config.tracking.uri), "training")
    check_resume_from(config, spec)
    return spec


def _train(config: TrainConfig, callbacks: Sequence = (), *, hooks: WorkerHooks = WorkerHooks()
           ) -> TrainResult:
    """Train `config` on Ray Train and return where the final checkpoint went.

    callbacks: `ray.train.UserCallback`s for the Train RunConfig (e.g. Tune's
    `TuneReportCallback()` inside a Tune trial). A finished run with the same name is not
    trained again; an unfinished one resumes from its last checkpoint. hooks: for tests
    only (WorkerHooks).
    Raises CsclipError for bad data or a run name reused with a different config.
    """
    name, root = run_name(config), storage_root(config)
    cached = finished_result(config)
    if cached is not None:
        logger.info("run %s already finished: %s", name, cached.checkpoint_uri)
        return cached
    spec = check_run(config)
    from ray.data import DataContext  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    # The step lines are the training's progress. The stream's coordinator is a worker:
    # without this its tqdm bars are drawn into the driver's output between the step lines
    # (in a log file too); without them its progress goes to Ray Data's log.
    # Off a terminal Ray Data then logs its progress at INFO instead of drawing bars with
    # cursor escapes; the console shows Ray Data's warnings only (csclip.entry.ray_init),
    # ray-data.log keeps the rest. (enable_progress_bars=False would itself warn.)
    DataContext.get_current().use_ray_tqdm = False
    # Every dataset of the run keeps its blocks in order: the batches are a function of
    # the config, so a resumed run skips exactly what it trained on (csclip.train.shards).
    # The world's rows, or a units table's or webdataset shards (csclip.train.shards).
    objective = step_options(config).objective
    # Runs started from threads of one driver (the demo's two fine-tunings) check and
    # cache their data one at a time: two such passes at once take every CPU of a small
    # instance, and Ray Data then warns that a dataset will hang.
    with _DRIVER_DATA_PASSES:
        if config.data.shards is not None:
            plan, datasets, heldout, num_held = _shard_training(config, config.data, spec,
                                                                objective)
        else:
            plan, datasets, heldout, num_held = _source_training(config, spec, objective)
        logger.info("run %s: %d rows (%d undecodable), %d epochs, %d steps", name, plan.num_rows,
                    plan.num_decode_failures, plan.num_epochs, plan.total_steps)
    data_params = {"data.num_rows": plan.num_rows, "data.decode_failures": plan.num_decode_failures,
                   "data.total_steps": plan.total_steps, "data.num_epochs": plan.num_epochs,
                   "data.held_out_rows": num_held}
    run_id = open_run(config.tracking, name, {**flatten(config), **data_params})
    worker_plan = WorkerPlan(
        total_steps=plan.total_steps, steps_per_epoch=plan.steps_per_epoch,
        num_epochs=plan.num_epochs, mlflow_run_id=run_id,
        tracking_uri=resolve_uri(config.tracking.uri) if config.tracking.enabled else None,
        best_uri=f"{root.rstrip('/')}/{name}/best", hooks=hooks, heldout=tuple(heldout))
    loop_config = {"config": config.model_dump(mode="json"), "plan": worker_plan}
    try:
        result = _trainer(config, name, root, loop_config, datasets, callbacks).fit()
    except Exception:
        finish_run(config.tracking, run_id, status="FAILED")
        raise
    final_uri = export_final(result.checkpoint, root, name)
    metrics = {**read_metrics(final_uri), "decode_failures": plan.num_decode_failures,
               "num_rows": plan.num_rows}
    # Per-step metrics are already logged by rank 0; here only the run's totals.
    finish_run(config.tracking, run_id, tags={"checkpoint_uri": final_uri},
               metrics={"data.decode_failures": plan.num_decode_failures,
                        "final_loss": float(metrics.get("loss") or 0.0)})
    return TrainResult(name, final_uri, metrics, run_id)


def _source_training(config: TrainConfig, spec, objective) -> tuple:
    """(plan, datasets, held-out refs, held-out count) of a run on a units table or the
    world: the source written once as shards (csclip.train.source_shards), trained on as
    shards."""
    written = source_shards(config.data, seed=config.run.seed,
                            preprocess_cfg=spec.preprocess_cfg, model_name=config.model.name,
                            image_foils="image_foil" in objective.image_columns,
                            storage_root=storage_root(config))
    plan, datasets, heldout, num_held = _shard_training(config, written.data(config.data), spec,
                                                        objective)
    plan = replace(plan, num_decode_failures=sum(written.rejected.values()))
    return plan, datasets, heldout, num_held


def _shard_training(config: TrainConfig, data: DataConfig, spec, objective) -> tuple:
    """(plan, datasets, held-out refs, held-out count) of a run on webdataset shards
    (csclip.train.shards; `data`, config.data or a units table's shards): planned from
    the per-shard counts, no pass over the data."""
    shards = plan_shards(data, config.run.seed)
    plan = plan_steps(sum(shard.rows for shard in shards), 0, data,
                      config.run.num_workers, config.optim.epochs, config.optim.max_steps)
    logger.info("%d shards, %d rows with units", len(shards), plan.num_rows)
    check_data_cpus(config.run)
    datasets = shard_datasets(
        shards, data=data, sampling=config.sampling, preprocess_cfg=spec.preprocess_cfg,
        model_name=config.model.name, seed=config.run.seed, num_epochs=plan.num_epochs,
        steps_per_epoch=plan.steps_per_epoch, num_workers=config.run.num_workers,
        objective=objective,
        dataset_name=lambda epoch, rank: shard_name(epoch, rank, config.data.batch_scope))
    held = (held_out_rows(shards, preprocess_key(spec.preprocess_cfg), config.model.name)
            if data.val_ratio else [])
    return plan, datasets, held, sum(len(shard.held) for shard in shards)


def check_data_cpus(run_section: RunSection) -> None:
    """Warn when the workers would take every CPU of this Ray instance: Ray Data's tasks
    (each epoch's shuffle and text sampling, the decoding) need one of their own, and
    without it the run waits for them with no error."""
    import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    have = ray.cluster_resources().get("CPU", 0)
    workers = run_section.num_workers * run_section.cpus_per_worker
    if have - workers < 1:
        logger.warning(
            "run.num_workers=%d x run.cpus_per_worker=%g take %g of this Ray instance's %g "
            "CPUs, and Ray Data's tasks (the epochs' shuffle, sampling, decoding) need at "
            "least 1 beside them: unless nodes join, the run waits for data forever. Lower "
            "run.cpus_per_worker or run.num_workers, or give Ray more CPUs.",
            run_section.num_workers, run_section.cpus_per_worker, workers, have)


def _trainer(config: TrainConfig, name: str, root: str, loop_config: dict, datasets: dict,
             callbacks):
    import ray.train  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)
    from ray.data import DataContext, ExecutionOptions  # noqa: PLC0415  as ray.train
    from ray.train.torch import TorchConfig, TorchTrainer  # noqa: PLC0415  as ray.train

    from csclip.train.ingest import EpochSplitConfig  # noqa: PLC0415  imports ray: as ray.train

    # Train's default ingest options copy the deprecated `exclude_resources` (a
    # RayDeprecationWarning in every run); these are the same options without it, and
    # with preserve_order: Train replaces each dataset's execution options by these, and
    # under preserve_order the split hands out blocks in order, without locality hints.
    current = DataContext.get_current().execution_options
    ingest = ExecutionOptions(resource_limits=current.resource_limits, preserve_order=True,
                              verbose_progress=current.verbose_progress)
    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=config.run.num_workers, use_gpu=config.run.use_gpu,
            resources_per_worker={"CPU": config.run.cpus_per_worker,
                                  **config.run.worker_resources}),
        torch_config=TorchConfig(backend="nccl" if config.run.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name, storage_path=root,
            failure_config=ray.train.FailureConfig(max_failures=config.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=config.run.num_to_keep),
            # Ray Train's own console lines (worker group start, each report and checkpoint)
            # at INFO drown the step lines; its log files under the session keep them.
            logging_config=ray.train.LoggingConfig(log_level=RAY_TRAIN_CONSOLE_LEVEL),
            callbacks=list(callbacks)),
        datasets=datasets,
        # One worker needs no split: it runs each epoch's pipeline itself. Several share
        # a SplitCoordinator actor per epoch dataset, ended after its epoch
        # (csclip.train.ingest; Ray Train would keep each until the run ends). With
        # batch_scope global each worker reads a dataset of its own (global_batch).
        dataset_config=EpochSplitConfig(
            execution_options=ingest,
            datasets_to_split="all" if config.run.num_workers > 1
            and config.data.batch_scope == "worker" else []))

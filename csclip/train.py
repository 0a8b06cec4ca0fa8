"""Fine-tuning on Ray Train (TorchTrainer, Train V2): CLIP, NegCLIP or CS-CLIP from one loop.

The driver (`run`) validates the config, checks the data, opens the MLflow run and starts
the trainer; each worker (`train_loop_per_worker`) builds the model, restores the last
checkpoint if there is one, and steps through its Ray Data shard. Rerunning the same config
resumes: the run name is a hash of the resolved config (or `run.name`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from pydantic import Field

from csclip.config import StrictModel, flatten
from csclip.data import DataConfig
from csclip.errors import CsclipError
from csclip.loss import LossConfig, LossParts, Objective, objective_for
from csclip.model import (
    CONFIG_FILE,
    SPEC_FILE,
    WEIGHTS_FILE,
    ModelConfig,
    ModelSpec,
    bundle_from_config,
    load_train_state,
    load_weights_into,
    save_checkpoint,
    spec_of,
    unwrap,
)
from csclip.optim import OptimConfig, build_optimizer, lr_at
from csclip.sampling import SamplingConfig
from csclip.tracking import TrackingConfig

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
FINAL_DIR = "final"


class RunSection(StrictModel):
    """The `run` section: naming, storage, checkpoints, workers."""

    name: str | None = None  # None: "<method>-<hash of the resolved config>"
    storage_path: str = "runs/train"  # local path or s3://; Ray Train's RunConfig.storage_path
    checkpoint_every: int = Field(100, ge=1)  # optimizer steps between checkpoints
    num_to_keep: int = Field(2, ge=1)
    num_workers: int = Field(1, ge=1)  # one per GPU on a cluster; gloo workers on CPU
    cpus_per_worker: float = Field(1.0, gt=0)
    use_gpu: bool = False
    # auto: bf16 autocast on GPU, fp32 on CPU. fp16 adds a gradient scaler.
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    seed: int = 42
    log_every: int = Field(10, ge=1)  # steps between log lines and MLflow flushes
    max_failures: int = Field(0, ge=0)  # worker-group restarts (each resumes from a checkpoint)
    # For tests of resumption: raise after this step's checkpoint on a fresh (not restored)
    # attempt, as a killed job would. Not part of the run name.
    fail_after_step: int | None = Field(None, ge=1)
    # Evaluation during training (csclip.eval.periodic), rank 0: every eval_every steps the
    # half-truth and retrieval metrics of the first eval_max_images validation images are
    # logged as val_<key>, and the weights with the best `best_metric` (a report key such
    # as ht_all, ret_i2t; best_mode max or min) are kept in <storage>/<run>/best/.
    eval_every: int | None = Field(None, ge=1)
    eval_max_images: int = Field(200, ge=1)
    best_metric: str = "ht_all"
    best_mode: Literal["max", "min"] = "max"


class TrainConfig(StrictModel):
    """One fine-tuning run: pipelines/train.py, Tune trials and the demo all build this."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    sampling: SamplingConfig = SamplingConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    run: RunSection = RunSection()
    tracking: TrackingConfig = TrackingConfig()


@dataclass(frozen=True)
class TrainResult:
    """What a finished run produced. checkpoint_uri: a directory that `load_bundle` reads."""

    run_name: str
    checkpoint_uri: str
    metrics: dict = field(default_factory=dict)
    mlflow_run_id: str | None = None


# Fields that say where/how to run, not what is trained: they do not change the run name.
_NOT_IN_NAME = {"run": {"name", "storage_path", "fail_after_step", "max_failures", "log_every",
                        "eval_every", "eval_max_images", "best_metric", "best_mode"},
                "tracking": None}


def run_name(config: TrainConfig) -> str:
    """`run.name`, or "<method>-<12 hex digits of the resolved config's hash>"."""
    if config.run.name:
        return config.run.name
    data = config.model_dump(mode="json")
    for section, keys in _NOT_IN_NAME.items():
        if keys is None:
            data.pop(section, None)
        else:
            for key in keys:
                data[section].pop(key, None)
    digest = hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    return f"{config.loss.method}-{digest}"


def storage_root(config: TrainConfig) -> str:
    path = config.run.storage_path
    return path if "://" in path else str(Path(path).expanduser().resolve())


# ---------------------------------------------------------------------------------------
# Pure pieces of the loop: schedule, optimizer, loss, precision
# ---------------------------------------------------------------------------------------

def compute_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor],
                 objective: Objective) -> LossParts:
    """Encode the batch with one forward call (so DDP sees it) and apply the objective.

    batch: the objective's image columns (B, 3, H, W), token columns (B, L) and mask
    columns (B,).
    """
    columns = objective.columns
    images = torch.cat([batch[c] for c in objective.image_columns])   # (I*B, 3, H, W)
    texts = torch.cat([batch[c] for c in columns])                    # (T*B, L)
    image, text, scale = model(images, texts)[:3]                      # normalised features
    image_parts = image.chunk(len(objective.image_columns))            # I x (B, D)
    features = dict(zip(columns, text.chunk(len(columns)), strict=True))  # T x (B, D)
    masks = {name: batch[name] for name in objective.mask_columns}
    extra_images = dict(zip(objective.image_columns[1:], image_parts[1:], strict=True))
    return objective.loss(image_parts[0], features, masks, scale, extra_images)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for fp32."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


# ---------------------------------------------------------------------------------------
# The worker loop
# ---------------------------------------------------------------------------------------

@dataclass
class _State:
    step: int = 0
    samples: int = 0
    restored_from: int | None = None


def train_loop_per_worker(loop_config: dict) -> None:
    """Ray Train entry: validate the config, build, restore, train, checkpoint, report."""
    import ray.train
    import ray.train.torch

    config = TrainConfig.model_validate(loop_config["config"])
    plan = loop_config["plan"]
    _worker_logging()
    context = ray.train.get_context()
    rank = context.get_world_rank()
    torch.manual_seed(config.run.seed + rank)
    device = ray.train.torch.get_device()

    bundle = bundle_from_config(config.model)
    model, spec = bundle.model, spec_of(bundle.model, config.model.name)
    optimizer = build_optimizer(model, config.optim)
    dtype = autocast_dtype(config.run.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    state = _restore(model, optimizer, scaler, spec)
    model = ray.train.torch.prepare_model(model)
    model.train()

    from csclip.tracking import StepLogger

    step_logger = StepLogger(plan["tracking_uri"], plan["mlflow_run_id"] if rank == 0 else None,
                             flush_every=config.run.log_every)
    evaluator = _periodic_evaluator(config, plan) if rank == 0 else None
    shard = ray.train.get_dataset_shard("train")
    batches = shard.iter_torch_batches(
        batch_size=config.data.batch_size, drop_last=True, device=device,
        local_shuffle_buffer_size=config.data.shuffle_buffer or None,
        local_shuffle_seed=config.run.seed + rank if config.data.shuffle_buffer else None)
    total, skip = plan["total_steps"], state.step
    metrics: dict = {}
    tick = time.perf_counter()
    for batch in batches:
        if skip:  # resumed: these batches were trained on before the restart
            skip -= 1
            continue
        if state.step >= total:
            break
        lr = lr_at(state.step, config.optim, total, plan["steps_per_epoch"])
        for group in optimizer.param_groups:
            group["lr"] = lr
        parts = _step(model, optimizer, scaler, batch, config, dtype, device)
        global_batch = batch["image"].shape[0] * context.get_world_size()
        state.step += 1
        state.samples += global_batch
        now = time.perf_counter()
        metrics = _step_metrics(parts, lr, model, state.step, plan["steps_per_epoch"],
                                global_batch / max(now - tick, 1e-9))
        tick = now
        step_logger.log(state.step, metrics)
        if evaluator is not None and (state.step % config.run.eval_every == 0 or state.step == total):
            _evaluate_during_training(evaluator, bundle, model, spec, config, state.step,
                                      step_logger, str(device))
        if state.step % config.run.log_every == 0 and rank == 0:
            logger.info("step %d/%d loss %.4f (full %.4f unit %.4f) lr %.2e %.1f samples/s",
                        state.step, total, metrics["loss"], metrics["loss_full"],
                        metrics["loss_unit"], lr, metrics["samples_per_s"])
        if state.step % config.run.checkpoint_every == 0 or state.step == total:
            _checkpoint(model, optimizer, scaler, spec, state, config, metrics, rank)
            if (config.run.fail_after_step is not None and state.restored_from is None
                    and state.step >= config.run.fail_after_step):
                raise RuntimeError(f"injected failure after step {state.step} (run.fail_after_step)")
    step_logger.flush()
    if state.step < total:
        raise RuntimeError(f"data ran out at step {state.step} of {total}")
    if not metrics:  # restored at the end: nothing left to do, report the state
        ray.train.report({"step": state.step, "resumed_from": state.restored_from}, checkpoint=None)


def _step_metrics(parts: LossParts, lr: float, model, step: int, steps_per_epoch: int,
                  samples_per_s: float) -> dict:
    metrics = {"loss": parts.total.item(), "loss_full": parts.full.item(),
               "loss_unit": parts.unit.item(), "lr": lr,
               "logit_scale": unwrap(model).logit_scale.exp().item(),
               "samples_per_s": samples_per_s, "step": step,
               "epoch": step / max(1, steps_per_epoch)}
    if parts.image_foil is not None:
        metrics["loss_image_foil"] = parts.image_foil.item()
    return metrics


# -- evaluation during training (run.eval_every; the logic lives in csclip.eval.periodic) --

def _periodic_evaluator(config: TrainConfig, plan: dict):
    """Rank 0's PeriodicEvaluator over the capped validation split, or None when
    run.eval_every is off."""
    if config.run.eval_every is None:
        return None
    from csclip.data import load_split
    from csclip.eval.periodic import PeriodicEvaluator, capped_records

    records = capped_records(load_split(config.data.units_uri, "val", config.data.world),
                             config.run.eval_max_images)
    return PeriodicEvaluator(records, config.run.best_metric, config.run.best_mode,
                             plan["best_uri"], seed=config.run.seed)


def _evaluate_during_training(evaluator, bundle, model, spec: ModelSpec, config: TrainConfig,
                              step: int, step_logger, device: str) -> None:
    """Score the live model, log val_<key> against the step, keep best/ when it improved."""
    from csclip.eval.periodic import LOGGED_KEYS
    from csclip.model import ClipBundle

    live = ClipBundle(unwrap(model), bundle.preprocess, bundle.tokenizer, bundle.name,
                      bundle.pretrained)
    metrics = evaluator.evaluate(live, device)
    step_logger.log(step, {f"val_{k}": metrics[k] for k in LOGGED_KEYS if k in metrics})
    step_logger.flush()
    logger.info("step %d eval: %s", step, ", ".join(f"{k} {metrics[k]:.1f}" for k in LOGGED_KEYS
                                                    if k in metrics))
    if evaluator.is_better(metrics):
        evaluator.save_best(model, spec, config.model_dump(mode="json"), step, metrics)


def _worker_logging() -> None:
    # Ray workers have no handler for our logger; progress lines should reach the driver.
    csclip_logger = logging.getLogger("csclip")
    csclip_logger.setLevel(logging.INFO)
    if not csclip_logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        csclip_logger.addHandler(handler)


def _step(model, optimizer, scaler, batch, config: TrainConfig, dtype, device) -> LossParts:
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        parts = compute_loss(model, batch, objective_for(config.loss, config.sampling.num_unit_slots))
    scaler.scale(parts.total).backward()
    if config.optim.grad_clip is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    # As open_clip_train: keep the temperature in [1, 100] (logit_scale = ln 100 at most).
    with torch.no_grad():
        unwrap(model).logit_scale.clamp_(0, math.log(100))
    return parts


def _restore(model, optimizer, scaler, spec: ModelSpec) -> _State:
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return _State()
    with checkpoint.as_directory() as directory:
        load_weights_into(model, directory, spec)
        saved = load_train_state(directory) or {}
    if "optimizer" in saved:
        optimizer.load_state_dict(saved["optimizer"])
    if "scaler" in saved:
        scaler.load_state_dict(saved["scaler"])
    step = int(saved.get("step", 0))
    logger.info("resumed from checkpoint at step %d", step)
    return _State(step=step, samples=int(saved.get("samples", 0)), restored_from=step)


def _checkpoint(model, optimizer, scaler, spec, state: _State, config: TrainConfig,
                metrics: dict, rank: int) -> None:
    import ray.train

    report = {**metrics, "resumed_from": state.restored_from}
    if rank != 0:  # every rank reports (a barrier); only rank 0 writes
        ray.train.report(report, checkpoint=None)
        return
    with tempfile.TemporaryDirectory() as directory:
        train_state = {"optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                       "step": state.step, "samples": state.samples}
        save_checkpoint(model, spec, directory, train_state, config.model_dump(mode="json"))
        Path(directory, METRICS_FILE).write_text(json.dumps(report, default=str))
        ray.train.report(report, checkpoint=ray.train.Checkpoint.from_directory(directory))


# ---------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------

def run(config: TrainConfig, callbacks: Sequence = ()) -> TrainResult:
    """Train `config` on Ray Train and return where the final checkpoint went.

    callbacks: `ray.train.UserCallback`s for the Train RunConfig (e.g. Tune's
    `TuneReportCallback()` inside a Tune trial). A finished run with the same name is not
    trained again; an unfinished one resumes from its last checkpoint.
    Raises CsclipError for bad data or a run name reused with a different config.
    """
    name, root = run_name(config), storage_root(config)
    cached = finished_result(config)
    if cached is not None:
        logger.info("run %s already finished: %s", name, cached.checkpoint_uri)
        return cached
    from csclip.data import plan_data, source_dataset, training_stream
    from csclip.model import spec_from_config
    from csclip.tracking import finish_run, open_run, resolve_uri

    spec = spec_from_config(config.model)  # a bad model name fails here, before Ray
    if not sys.stderr.isatty():
        # Ray Data's bars redraw with cursor escapes; in a log (CI, `make demo > log`) they
        # bury the per-step lines, which already show progress.
        from ray.data import DataContext

        DataContext.get_current().enable_progress_bars = False
    source = source_dataset(config.data)
    if config.data.units_uri is None:
        # The world is generated: keep its rows (PNG bytes, a few KB each) instead of
        # rendering every scene again in every epoch. A units table streams from storage.
        source = source.materialize()
    plan = plan_data(source, config.data, config.run.num_workers, config.optim.epochs,
                     config.optim.max_steps)
    logger.info("run %s: %d rows (%d undecodable), %d epochs, %d steps", name, plan.num_rows,
                plan.num_decode_failures, plan.num_epochs, plan.total_steps)
    stream = training_stream(source, sampling=config.sampling, preprocess_cfg=spec.preprocess_cfg,
                             model_name=config.model.name, seed=config.run.seed,
                             num_epochs=plan.num_epochs,
                             objective=objective_for(config.loss, config.sampling.num_unit_slots))
    data_params = {"data.num_rows": plan.num_rows, "data.decode_failures": plan.num_decode_failures,
                   "data.total_steps": plan.total_steps, "data.num_epochs": plan.num_epochs}
    run_id = open_run(config.tracking, name, {**flatten(config), **data_params})
    loop_config = {"config": config.model_dump(mode="json"),
                   "plan": {"total_steps": plan.total_steps, "steps_per_epoch": plan.steps_per_epoch,
                            "mlflow_run_id": run_id, "best_uri": f"{root.rstrip('/')}/{name}/best",
                            "tracking_uri": resolve_uri(config.tracking.uri)}}
    try:
        result = _trainer(config, name, root, loop_config, stream, callbacks).fit()
    except Exception:
        finish_run(config.tracking, run_id, status="FAILED")
        raise
    final_uri = _export_final(result.checkpoint, root, name)
    metrics = {**_read_metrics(final_uri), "decode_failures": plan.num_decode_failures,
               "num_rows": plan.num_rows}
    # Per-step metrics are already logged by rank 0; here only the run's totals.
    finish_run(config.tracking, run_id, tags={"checkpoint_uri": final_uri},
               metrics={"data.decode_failures": plan.num_decode_failures,
                        "final_loss": float(metrics.get("loss") or 0.0)})
    return TrainResult(name, final_uri, metrics, run_id)


def _trainer(config: TrainConfig, name: str, root: str, loop_config: dict, stream, callbacks):
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    return TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=config.run.num_workers, use_gpu=config.run.use_gpu,
            resources_per_worker={"CPU": config.run.cpus_per_worker}),
        torch_config=TorchConfig(backend="nccl" if config.run.use_gpu else "gloo"),
        run_config=ray.train.RunConfig(
            name=name, storage_path=root,
            failure_config=ray.train.FailureConfig(max_failures=config.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=config.run.num_to_keep),
            callbacks=list(callbacks)),
        datasets={"train": stream})


def _final_uri(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}/{FINAL_DIR}"


def _export_final(checkpoint, root: str, name: str) -> str:
    """Copy the last checkpoint's weights, spec, config and metrics (not the optimizer
    state) to <storage>/<name>/final: a stable path that open_clip and load_bundle read."""
    from csclip.storage import filesystem_for

    if checkpoint is None:
        raise CsclipError(f"run {name} finished without a checkpoint; check run.checkpoint_every")
    uri = _final_uri(root, name)
    fs, path = filesystem_for(uri)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.to_directory(tmp)
        staging = Path(tmp, FINAL_DIR)
        staging.mkdir()
        for file in (WEIGHTS_FILE, SPEC_FILE, CONFIG_FILE, METRICS_FILE):
            if Path(tmp, file).exists():
                shutil.copy(Path(tmp, file), staging / file)
        import pyarrow.fs as pafs

        fs.create_dir(path, recursive=True)
        pafs.copy_files(str(staging), path, destination_filesystem=fs)
    return uri


def _read_metrics(final_uri: str) -> dict:
    from csclip.storage import exists, filesystem_for, read_bytes

    fs, path = filesystem_for(final_uri)
    file = f"{path}/{METRICS_FILE}"
    return json.loads(read_bytes(fs, file)) if exists(fs, file) else {}


def finished_result(config: TrainConfig) -> TrainResult | None:
    """The result of an already finished run of `config`, or None.

    Raises CsclipError when `run.name` names a finished run with a different config.
    """
    from csclip.storage import exists, filesystem_for, read_bytes

    name = run_name(config)
    uri = _final_uri(storage_root(config), name)
    fs, path = filesystem_for(uri)
    if not exists(fs, f"{path}/{METRICS_FILE}"):
        return None
    saved = TrainConfig.model_validate(json.loads(read_bytes(fs, f"{path}/{CONFIG_FILE}")))
    if run_name(saved.model_copy(update={"run": saved.run.model_copy(update={"name": None})})) != \
            run_name(config.model_copy(update={"run": config.run.model_copy(update={"name": None})})):
        raise CsclipError(f"run.name {name!r} already finished with a different config at {uri}; "
                          "choose another run.name or remove that directory")
    return TrainResult(name, uri, _read_metrics(uri), None)


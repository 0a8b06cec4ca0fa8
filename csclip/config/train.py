"""The training config (`csclip train`, Tune trials, the demo): model, data, sampling
(SPEC §3), loss, optimizer, run and tracking sections."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from csclip.config.base import StrictModel
from csclip.config.loss import LossConfig
from csclip.config.model import ModelConfig
from csclip.config.tracking import TrackingConfig
from csclip.config.world import WorldConfig
from csclip.units import ChangeType

__all__ = ["AUTHORS_SCHEDULE", "RUN_NAME_MAX", "RUN_NAME_PATTERN", "CompileMode", "DataConfig",
           "OptimConfig", "Precision", "RunSection", "SamplingConfig", "TrainConfig",
           "check_global_batch", "worker_batch_size"]


# auto: bf16 autocast on GPU, fp32 on CPU. fp16 adds a gradient scaler. bf16_pure: bf16
# weights, activations and gradients with fp32 master weights in the optimizer.
Precision = Literal["auto", "fp32", "bf16", "fp16", "bf16_pure"]


CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]


class SamplingConfig(StrictModel):
    """How the text slots of a training sample are drawn (SPEC §3). Defaults follow the
    authors' COCO config (their configs/dataset/coco_neg.yaml and utils/sampler.py)."""

    num_unit_slots: int = Field(2, ge=1, le=16)      # N (paper: 2; ablated 1..4)
    # P(a slot tries a relation first); it falls back to the other kind only when the sample
    # has none with a foil, so this is the share of relation slots (paper: 1.0).
    relation_prob: float = Field(1.0, ge=0, le=1)
    # Caption-level negative, first that applies: a word-order shuffle with swap_prob, else
    # an in-place entity foil with inplace_prob, else a composite (SPEC §3). The authors'
    # COCO config sets both to 1.0; Tables 16-17 ablate swap_prob ("swap-foil fraction").
    swap_prob: float = Field(1.0, ge=0, le=1)
    inplace_prob: float = Field(1.0, ge=0, le=1)
    # Composite: P("entities where s r' o") when the sample has a stored relation foil, else
    # "other entities and one entity foil" (the authors' negative_relation_sample_prob).
    relation_negative_prob: float = Field(0.5, ge=0, le=1)
    entity_context_prob: float = Field(0.5, ge=0, le=1)  # "A and C" vs "A' and C" (SPEC: 0.5)
    # Negation foils ("is not on") are relation-foil candidates in the authors' sampler, so
    # in the paper's runs; False leaves them out (SPEC §2 keeps them out of the tables).
    use_negation: bool = True
    # Ours, empty in every paper preset: relative weights of the relation-foil
    # candidates by change type (antonym, negation, subject_object_swap, subject_replace,
    # object_replace; a type not named weighs 1). Empty: the authors' uniform draw. E.g.
    # {antonym: 3, subject_object_swap: 3} spends more of L_unit on the foils that only
    # the layout or the word order tells apart. A relation whose candidates all weigh 0
    # falls back to the uniform draw.
    relation_foil_weights: dict[ChangeType, Annotated[float, Field(ge=0)]] = Field(
        default_factory=dict)


# The authors' scheduler (their configs/optimizer/adamw_ft.yaml, utils/optimizer_factory.py):
# linear warmup over 3 epochs from 0.1 x lr (torch LambdaLR), then CosineAnnealingLR. Their
# config asks for a floor of min_lr_ratio 0.01 x lr, but the code reads the lr for eta_min
# after the warmup scheduler has already scaled it to 0.1 x lr, so the floor in effect is
# 0.001 x lr. `schedule: authors_per_epoch` fills these when they are left unset.
AUTHORS_SCHEDULE: dict[str, float] = {"warmup_epochs": 3.0, "warmup_start_ratio": 0.1,
                                      "min_lr_ratio": 0.001}


class OptimConfig(StrictModel):
    """The `optim` section: AdamW with a warmup + cosine schedule."""

    lr: float = Field(5e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    # False: open_clip's groups (no decay on gains, biases, logit_scale). True: every
    # parameter decays, as in the authors' AdamW(model.parameters(), weight_decay=...).
    decay_all_params: bool = False
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-6, gt=0)
    warmup_steps: int = Field(50, ge=0)
    # Warmup length in epochs (x steps per epoch); when set it replaces warmup_steps.
    warmup_epochs: float | None = Field(None, ge=0)
    # None: open_clip's warmup, lr * (step + 1) / warmup. r: linear from r * lr at step 0
    # to lr at the end of warmup (the authors' LambdaLR, r = 0.1).
    warmup_start_ratio: float | None = Field(None, ge=0, le=1)
    min_lr_ratio: float | None = Field(None, ge=0, le=1)  # cosine floor / lr; None: 0
    epochs: int = Field(5, ge=1)
    max_steps: int | None = Field(None, ge=1)  # stop after this many steps (overrides epochs)
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None: no clipping
    # The temperature's ceiling: logit_scale clamped to ln(this) after every step, as
    # open_clip_train (100). None: never clamped, as the authors' code (configs/paper.yaml).
    logit_scale_max: float | None = Field(100.0, gt=1)
    # Gradient accumulation: each step's batch (data.batch_size) is encoded in accum_freq
    # micro-batches; the loss is still one loss over the whole batch (csclip.train.step), so
    # loss and gradients equal the unsplit step's. Less activation memory, ~1/3 more compute.
    accum_freq: int = Field(1, ge=1)
    fused: bool = True  # fused AdamW kernel (CUDA, and CPU: faster than foreach)
    # cosine: warmup then cosine, advanced every optimizer step (as intended).
    # authors_per_epoch: the authors' run. Their scheduler is built over optimizer steps
    # but stepped once per epoch, so during epoch e it sits at step e: warmup never ends
    # and the lr stays at ~0.1 x lr for the whole run (SPEC §6). Unset warmup_epochs,
    # warmup_start_ratio and min_lr_ratio take the authors' values (AUTHORS_SCHEDULE).
    schedule: Literal["cosine", "authors_per_epoch", "constant"] = "cosine"

    @model_validator(mode="before")
    @classmethod
    def _authors_schedule_values(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("schedule") == "authors_per_epoch":
            data = {**data, **{k: v for k, v in AUTHORS_SCHEDULE.items() if data.get(k) is None}}
        return data

    @model_validator(mode="after")
    def _betas_in_range(self) -> OptimConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {self.betas} must each be in [0, 1)")
        return self


class DataConfig(StrictModel):
    """The `data` section of a training config."""

    world: WorldConfig = WorldConfig()
    # A units table (Parquet, local or s3://) with image_bytes or image_path, written once
    # as webdataset shards beside it and trained on as shards (csclip.train.source_shards);
    # None trains on the synthetic world generated from `world` (written as shards once too).
    units_uri: str | None = None
    # The folder (local or s3://) a units table's relative image paths are in; a path that
    # leaves it is not read (counted with the images that do not decode). None: as written.
    image_root: str | None = None
    # Webdataset shards to train on (a brace pattern, local or s3://:
    # 's3://bucket/laion/{00000..25599}.tar'); units_uri is then the output of `csclip
    # extract --format webdataset` over them (csclip.train.shards). None: units_uri's table.
    shards: str | None = None
    # Shards' samples permuted together: consecutive shards of each epoch's seeded shard
    # order are grouped until a group holds this many (the bounded buffer of a streamed
    # epoch; open_clip_train's sample buffer holds 5000).
    shard_buffer: int = Field(10_000, ge=1)
    split: str = "train"
    batch_size: int = Field(32, ge=1)  # rows per worker, or per optimizer step (batch_scope)
    # "worker": batch_size rows on each worker, W x batch_size per optimizer step (ours:
    # coco.yaml). "global": batch_size rows per optimizer step over all workers, each
    # worker taking batch_size / W, the same rows in each step on any run.num_workers
    # (csclip.train.global_batch; the paper's run, configs/paper.yaml).
    batch_scope: Literal["worker", "global"] = "worker"
    # Rows of the local shuffle buffer in each worker, on top of the epoch's order (the
    # shards' seeded order and buffer); 0 = none.
    shuffle_buffer: int = Field(512, ge=0)
    # open_clip's training transform (RandomResizedCrop, scale 0.9-1) instead of the eval
    # transform. The paper trains with the eval transform, hence off; seeded per sample.
    augment: bool = False
    # Worker-side feed (Ray Data iter_torch_batches): batches prepared ahead of the step
    # in a background thread, and page-locked host memory for the copy to the GPU (used
    # only when the worker has a CUDA device).
    prefetch_batches: int = Field(2, ge=0)
    pin_memory: bool = True
    # Held out of training: this fraction of the rows (by sample_id, seeded by run.seed),
    # scored at each evaluation as val_contrastive_accuracy (csclip.train.holdout). 0: off.
    val_ratio: float = Field(0.0, ge=0.0, lt=1.0)

    @model_validator(mode="after")
    def _sources_consistent(self) -> DataConfig:
        if self.image_root is not None and (self.units_uri is None or self.shards is not None):
            raise ValueError("data.image_root is the folder of a units table's relative image "
                             "paths: give data.units_uri (the world and shards hold their images)")
        if self.shards is not None and self.units_uri is None:
            raise ValueError("data.shards needs data.units_uri: the output of `csclip extract "
                             "--format webdataset` over the same shards")
        return self


RUN_NAME_MAX = 200


RUN_NAME_PATTERN = re.compile(rf"[A-Za-z0-9_-][A-Za-z0-9._-]{{0,{RUN_NAME_MAX - 1}}}")


class RunSection(StrictModel):
    """The `run` section: naming, storage, checkpoints, workers."""

    name: str | None = None  # None: "<method>-<hash of the resolved config>"
    storage_path: str = "runs/train"  # local path or s3://; Ray Train's RunConfig.storage_path
    checkpoint_every: int = Field(100, ge=1)  # optimizer steps between checkpoints
    num_to_keep: int = Field(2, ge=1)
    num_workers: int = Field(1, ge=1)  # one per GPU on a cluster; gloo workers on CPU
    cpus_per_worker: float = Field(1.0, gt=0)
    # torch intra-op threads per worker; None: Ray's default, one per CPU of cpus_per_worker.
    # More than the CPUs Ray reserves lets a worker use cores the data stage leaves idle.
    torch_threads: int | None = Field(None, ge=1)
    use_gpu: bool = False
    # auto: bf16 autocast on GPU, fp32 on CPU. fp16 adds a gradient scaler. bf16_pure:
    # the model runs in bf16 (no autocast casts), AdamW steps fp32 master weights, the
    # loss stays fp32 (csclip.train.step.Bf16Shadow).
    precision: Precision = "auto"
    # torch.compile the model (the DDP-wrapped one, as open_clip_train) in this mode; true
    # is "default" (torch.compile's own), null or false: eager.
    compile: CompileMode | None = None
    channels_last: bool = False  # images and the patch convolution in NHWC
    # The text tower runs each row only up to its end-of-text token (the same features to
    # float rounding, ~2x less text work on short units; csclip.train.trimmed_text). It
    # reads each batch's lengths, one host sync per step on a GPU.
    trim_text: bool = True
    # MiB of a locked image tower's features kept per distinct image, so that the tower
    # runs once per image rather than once per epoch (CPU runs with trim_text, without
    # compile; csclip.train.locked_images). 0: the tower runs on every batch.
    locked_image_cache_mb: float = Field(256, ge=0)
    # The least time between two passes of Ray Data's scheduling loop in a worker's process
    # (csclip.train.pace): unpaced, the loop holds the GIL the step needs. None: Ray's loop.
    data_loop_period_s: float | None = Field(0.02, gt=0, le=1)
    # Start from this checkpoint directory (a checkpoint_* directory of any run, with its
    # train_state.pt; a local path every worker reads): model, optimizer, scaler and step.
    # The run's own checkpoints, once it has any, take precedence (restarts resume there).
    resume_from: str | None = None
    seed: int = 42
    # Steps between log lines, MLflow flushes and the host reading the step metrics (the
    # only host-device sync of the loop outside checkpoints).
    log_every: int = Field(10, ge=1)
    max_failures: int = Field(0, ge=0)  # worker-group restarts (each resumes from a checkpoint)
    # Custom resources each worker also takes, e.g. {"csclip_train": 1} so that workers land
    # only on the nodes that advertise it (cluster.yaml's training nodes), one per unit.
    worker_resources: dict[str, float] = Field(default_factory=dict)
    # Evaluation during training (csclip.train.periodic), rank 0: every eval_every steps the
    # half-truth and retrieval metrics of the first eval_max_images validation images are
    # logged as val_<key>, and the weights with the highest `best_metric` (a report key such
    # as ht_all, ret_i2t; every one of them, gaps and accuracies alike, is better higher)
    # are kept in <storage>/<run>/best/.
    eval_every: int | None = Field(None, ge=1)
    eval_max_images: int = Field(200, ge=1)
    best_metric: str = "ht_all"

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_flag(cls, value: object) -> object:
        # run.compile=true / false, as open_clip_train's --torchcompile is on or off.
        if value is True:
            return "default"
        return None if value is False else value

    @field_validator("name")
    @classmethod
    def _safe_name(cls, value: str | None) -> str | None:
        # The name is a directory under storage_path (a "/" or ".." would leave it) and a
        # value inside MLflow's search filters (a quote would break them).
        if value is None:
            return None
        if not RUN_NAME_PATTERN.fullmatch(value) or ".." in value:
            raise ValueError(f"{value[:80]!r}: a run name is 1-{RUN_NAME_MAX} characters of "
                             "A-Z a-z 0-9 . _ -, not starting with '.' and without '..'")
        return value

    @field_validator("resume_from")
    @classmethod
    def _local_absolute_path(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if "://" in value:
            raise ValueError(f"{value}: resume_from takes a local checkpoint directory; copy "
                             "it from storage first (or rerun the same config to resume by name)")
        # Ray workers run in their own working directory.
        return str(Path(value).expanduser().resolve())


class TrainConfig(StrictModel):
    """One fine-tuning run: pipelines/train.py, Tune trials and the demo all build this."""

    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    sampling: SamplingConfig = SamplingConfig()
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()
    run: RunSection = RunSection()
    tracking: TrackingConfig = TrackingConfig()

    @model_validator(mode="after")
    def _batch_splits_into_micro_batches(self) -> TrainConfig:
        data, workers = self.data, self.run.num_workers
        if data.batch_scope == "global":
            check_global_batch(data.batch_size, workers, self.loss.gather, data.shuffle_buffer)
        batch = worker_batch_size(data.batch_size, data.batch_scope, workers)
        if batch % self.optim.accum_freq:
            raise ValueError(f"a worker's batch of {batch} rows is not a multiple of "
                             f"optim.accum_freq {self.optim.accum_freq}; each step's batch is "
                             "split into accum_freq equal micro-batches")
        return self


def worker_batch_size(batch_size: int, batch_scope: str, num_workers: int) -> int:
    """Rows per worker and step: data.batch_size, or its share of the global batch."""
    return batch_size // num_workers if batch_scope == "global" else batch_size


def check_global_batch(batch_size: int, num_workers: int, gather: bool,
                       shuffle_buffer: int) -> None:
    """Why a batch_scope global config cannot run as one optimisation (ValueError)."""
    if batch_size % num_workers:
        raise ValueError(f"data.batch_scope global splits data.batch_size {batch_size} over "
                         f"run.num_workers {num_workers}: use a multiple of {num_workers}")
    if not gather:
        raise ValueError("data.batch_scope global needs loss.gather true: without it each "
                         "worker's negatives are its own share of the batch, and they shrink "
                         "as workers are added")
    if shuffle_buffer:
        raise ValueError("data.batch_scope global orders each epoch's rows itself (a seeded "
                         "permutation of the whole epoch); set data.shuffle_buffer=0 (a worker's "
                         "local buffer would reorder its share differently on every worker count)")

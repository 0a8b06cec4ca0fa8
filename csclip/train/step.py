"""One training step without Ray: encode a batch, apply the objective's loss (with gradient
accumulation that stays exact for contrastive losses), backward, clip, AdamW, clamp the
temperature; how the model runs (torch.compile, channels-last, pure bf16) and per-step
metrics that stay on the device until a log step. Ray Train workers (csclip.train) and
benchmarks/bench_gpu.py both drive it.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from csclip.config.train import CompileMode, OptimConfig, Precision
from csclip.loss import LossParts, Objective
from csclip.train.locked_images import LockedImageFeatures, tower_is_fixed
from csclip.train.optim import build_optimizer
from csclip.train.trimmed_text import TrimmedTextForward, can_trim
from csclip.train.warm_start import LayoutForward


@dataclass(frozen=True)
class StepOptions:
    """How a step runs (from a TrainConfig's `loss`, `optim` and `run` sections)."""

    objective: Objective
    precision: Precision = "auto"
    accum_freq: int = 1               # micro-batches per step (optim.accum_freq)
    grad_clip: float | None = 1.0     # max gradient norm (optim.grad_clip)
    logit_scale_max: float | None = 100.0  # exp(logit_scale) ceiling (optim.logit_scale_max)
    channels_last: bool = False       # images and conv weights in NHWC (run.channels_last)
    compile: bool = False             # torch.compile the model (run.compile)
    compile_mode: CompileMode = "default"
    trim_text: bool = True            # the text tower without its padding (run.trim_text)
    locked_image_cache_mb: float = 0  # a locked image tower's features kept (run.locked_image_cache_mb)


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype, or None for no autocast (fp32, or bf16_pure: bf16 weights)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16,
            "bf16_pure": None}[precision]


# ---------------------------------------------------------------------------------------
# Encoding and the loss
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Encoded:
    """One batch's L2-normalised features: image (B, D), each text column (B, D),
    scale = logit_scale.exp(), and each further image column (B, D) (e.g. image foils)."""

    image: Tensor
    texts: dict[str, Tensor]
    scale: Tensor
    images: dict[str, Tensor] = field(default_factory=dict)


def encode(model: torch.nn.Module, batch: Mapping[str, Tensor], columns: tuple[str, ...], *,
           image_columns: tuple[str, ...] = ("image",), input_dtype: torch.dtype | None = None,
           channels_last: bool = False) -> Encoded:
    """Encode the batch's image columns and token columns with one forward call (so DDP
    sees one forward). batch: each image column (B, 3, H, W), each token column (B, L).
    Without token columns (loss.method layout) the model sees the images alone."""
    images = torch.cat([batch[c] for c in image_columns])              # (I*B, 3, H, W)
    if input_dtype is not None:
        images = images.to(input_dtype)
    if channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    texts = torch.cat([batch[c] for c in columns]) if columns else None  # (T*B, L)
    image, text, scale = model(images, texts)[:3]                      # normalised features
    image_parts = image.chunk(len(image_columns))                      # I x (B, D)
    text_parts = dict(zip(columns, text.chunk(len(columns)), strict=True)) if columns else {}
    return Encoded(image_parts[0], text_parts, scale,
                   dict(zip(image_columns[1:], image_parts[1:], strict=True)))


def split_batch(batch: Mapping[str, Tensor], parts: int) -> list[dict[str, Tensor]]:
    """`parts` micro-batches along dim 0 (sizes differ by at most one row)."""
    pieces = {name: torch.tensor_split(value, parts) for name, value in batch.items()}
    return [{name: pieces[name][i] for name in batch} for i in range(parts)]


# ---------------------------------------------------------------------------------------
# Pure bf16: a bf16 copy runs, fp32 master weights are stepped
# ---------------------------------------------------------------------------------------

class Bf16Shadow:
    """A bf16 copy of the fp32 model that runs forward and backward (run.precision =
    bf16_pure). The optimizer, the temperature clamp and checkpoints keep the fp32 model:
    AdamW's updates at the paper's lr 5e-6 are far below bf16's resolution (2^-8 of a
    weight) and would round away on bf16 weights."""

    def __init__(self, model: torch.nn.Module):
        self.module = copy.deepcopy(model).to(torch.bfloat16)
        self._pairs = [(master, shadow) for master, shadow
                       in zip(model.parameters(), self.module.parameters(), strict=True)
                       if master.requires_grad]

    def grads_to_master(self) -> None:
        """Move the bf16 gradients onto the fp32 parameters (as fp32)."""
        for master, shadow in self._pairs:
            master.grad = None if shadow.grad is None else shadow.grad.float()
            shadow.grad = None

    @torch.no_grad()
    def weights_from_master(self) -> None:
        """Copy the stepped fp32 weights into the bf16 copy."""
        if self._pairs:
            torch._foreach_copy_([s for _, s in self._pairs], [m for m, _ in self._pairs])


# ---------------------------------------------------------------------------------------
# Building what a step needs
# ---------------------------------------------------------------------------------------

@dataclass
class Training:
    """What a step works on.

    model: the fp32 open_clip model (optimizer, checkpoints, logit_scale clamp).
    runner: what runs forward and backward: the model, or its bf16 copy, after `wrap`
    (DDP) and torch.compile.
    """

    model: torch.nn.Module
    runner: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    options: StepOptions
    device: torch.device
    shadow: Bf16Shadow | None = None

    @property
    def input_dtype(self) -> torch.dtype | None:
        return torch.bfloat16 if self.shadow is not None else None


def build_training(model: torch.nn.Module, optim: OptimConfig, options: StepOptions,
                   device: torch.device, *, train_state: Mapping | None = None,
                   wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> Training:
    """Move `model` to `device`, make its runner, then build AdamW and restore the
    optimizer and scaler state of `train_state` (a checkpoint's train_state.pt).

    With loss.method layout the model carries its layout head (warm_start.add_layout_head)
    and the runner answers the layout question (LayoutForward); otherwise, with
    options.trim_text, the runner skips the text tower's padding (TrimmedTextForward), and
    with a locked image tower it keeps that tower's features per image
    (locked_image_features).
    The order matters: AdamW is built, and its state loaded, only once the parameters are
    on their device, so its state tensors land beside them (a GPU resume used to leave
    them on the CPU) and fused AdamW sees CUDA parameters.
    wrap: e.g. ray.train.torch.prepare_model (DDP); applied before torch.compile, as
    open_clip_train compiles the DDP-wrapped model.
    """
    model.to(device)
    shadow = Bf16Shadow(model) if options.precision == "bf16_pure" else None
    runner = shadow.module if shadow is not None else model
    if options.objective.layout is not None:
        # The layout objective runs the image tower and its head (csclip.train.warm_start).
        runner = LayoutForward(runner)
    elif options.trim_text and can_trim(runner):
        runner = TrimmedTextForward(runner, image_features=locked_image_features(runner, options, device))
    if options.channels_last:
        runner = runner.to(memory_format=torch.channels_last)
    if wrap is not None:
        runner = wrap(runner)
    if options.compile:
        if _ddp_of(runner) is not None and _uses_grad_checkpointing(model):
            # As open_clip_train: DDP's graph splitting fails with checkpointed blocks.
            torch._dynamo.config.optimize_ddp = False
        runner = torch.compile(runner, mode=options.compile_mode)
    optimizer = build_optimizer(model, optim)
    dtype = autocast_dtype(options.precision, device)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    if train_state:
        if "optimizer" in train_state:
            optimizer.load_state_dict(train_state["optimizer"])
        if "scaler" in train_state:
            scaler.load_state_dict(train_state["scaler"])
    return Training(model, runner, optimizer, scaler, options, device, shadow)


def locked_image_features(model: torch.nn.Module, options: StepOptions,
                          device: torch.device) -> LockedImageFeatures | None:
    """The features of `model`'s image tower kept per image, where that gives the same
    features (a locked tower without dropout, csclip.train.locked_images.tower_is_fixed)
    and saves time: on a CPU, without torch.compile (which would trace the digests)."""
    if (options.locked_image_cache_mb <= 0 or device.type != "cpu" or options.compile
            or not tower_is_fixed(model.visual)):
        return None
    return LockedImageFeatures(options.locked_image_cache_mb)


def _ddp_of(runner: torch.nn.Module) -> torch.nn.parallel.DistributedDataParallel | None:
    inner = getattr(runner, "_orig_mod", runner)
    return inner if isinstance(inner, torch.nn.parallel.DistributedDataParallel) else None


def _uses_grad_checkpointing(model: torch.nn.Module) -> bool:
    return any(getattr(m, "grad_checkpointing", False) for m in model.modules())


# ---------------------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------------------

def train_step(training: Training, batch: Mapping[str, Tensor]) -> LossParts:
    """One optimizer step on `batch` (the worker's whole batch; options.accum_freq splits
    its encoding). Returns the loss terms, detached, still on the device: nothing here
    waits for the GPU."""
    options, optimizer, scaler = training.options, training.optimizer, training.scaler
    optimizer.zero_grad(set_to_none=True)
    if options.accum_freq == 1:
        with _autocast(training):
            parts = _loss(training, batch, encode_batch(training, batch))
        scaler.scale(parts.total).backward()
    else:
        parts = _accumulated_backward(training, batch)
    if training.shadow is not None:
        training.shadow.grads_to_master()
    if options.grad_clip is not None:
        scaler.unscale_(optimizer)
        params = [p for p in training.model.parameters() if p.grad is not None]
        torch.nn.utils.clip_grad_norm_(params, options.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    # As open_clip_train: keep the temperature in [1, 100] (logit_scale = ln 100 at most);
    # the authors' code never clamps it (optim.logit_scale_max None).
    if options.logit_scale_max is not None:
        with torch.no_grad():
            training.model.logit_scale.clamp_(0, math.log(options.logit_scale_max))
    if training.shadow is not None:
        training.shadow.weights_from_master()
    return LossParts(parts.full.detach(), parts.unit.detach(), parts.total.detach(),
                     None if parts.image_foil is None else parts.image_foil.detach(),
                     None if parts.ranking is None else parts.ranking.detach())


def encode_batch(training: Training, batch: Mapping[str, Tensor]) -> Encoded:
    """`encode` with the training's runner, input dtype and memory format."""
    objective = training.options.objective
    return encode(training.runner, batch, objective.columns,
                  image_columns=objective.image_columns, input_dtype=training.input_dtype,
                  channels_last=training.options.channels_last)


def _loss(training: Training, batch: Mapping[str, Tensor], encoded: Encoded) -> LossParts:
    objective = training.options.objective
    masks = {name: batch[name] for name in objective.mask_columns}
    return objective.loss(encoded.image, encoded.texts, masks, encoded.scale, encoded.images)


def _autocast(training: Training) -> contextlib.AbstractContextManager:
    dtype = autocast_dtype(training.options.precision, training.device)
    return torch.autocast(training.device.type, dtype=dtype or torch.float32,
                          enabled=dtype is not None)


def _accumulated_backward(training: Training, batch: Mapping[str, Tensor]) -> LossParts:
    """Gradient accumulation for a contrastive loss, as open_clip_train's accum_freq.

    Every sample's negatives are the whole batch, so the loss cannot be split into
    micro-batch losses. First every micro-batch is encoded without a graph; then each is
    encoded again with one, its features replace the cached ones, and the loss over the
    whole batch is backpropagated: only that micro-batch's activations are alive, and the
    gradients summed over micro-batches are the unsplit step's. Where we differ from
    open_clip: the temperature enters every micro-batch's loss, and open_clip backpropagates
    it each time (its gradient counted accum_freq times); here only the first pass keeps
    it, so the temperature's gradient is also the unsplit step's.
    """
    micro = split_batch(batch, training.options.accum_freq)
    with torch.no_grad(), _autocast(training):
        cached = [encode_batch(training, m) for m in micro]
    parts = None
    for index, micro_batch in enumerate(micro):
        last = index == len(micro) - 1
        with _no_sync(training.runner, skip=not last):  # DDP reduces once, after the last
            with _autocast(training):
                live = encode_batch(training, micro_batch)
            features = [live if i == index else c for i, c in enumerate(cached)]
            merged = Encoded(
                image=torch.cat([f.image for f in features]),                      # (B, D)
                texts={c: torch.cat([f.texts[c] for f in features]) for c in live.texts},
                scale=live.scale if index == 0 else live.scale.detach(),
                images={c: torch.cat([f.images[c] for f in features]) for c in live.images})
            parts = _loss(training, batch, merged)
            training.scaler.scale(parts.total).backward()
    assert parts is not None  # accum_freq >= 1
    return parts


@contextlib.contextmanager
def _no_sync(runner: torch.nn.Module, skip: bool) -> Iterator[None]:
    ddp = _ddp_of(runner)
    if ddp is None or not skip:
        yield
        return
    with ddp.no_sync():
        yield


# ---------------------------------------------------------------------------------------
# Metrics without host syncs
# ---------------------------------------------------------------------------------------

METRIC_NAMES = ("loss", "loss_full", "loss_unit", "logit_scale", "loss_image_foil",
                "loss_ranking")


class StepMetrics:
    """Per-step loss terms and temperature, kept as device tensors; `take` moves every
    buffered step to the host in one transfer. Reading a GPU scalar (`.item()`) waits for
    the GPU to finish the step, so the host could not queue the next one meanwhile; the
    loop calls `take` only at log and checkpoint steps."""

    def __init__(self) -> None:
        self._steps: list[int] = []
        self._lrs: list[float] = []
        self._values: list[Tensor] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, step: int, parts: LossParts, logit_scale: Tensor, lr: float) -> None:
        self._steps.append(step)
        self._lrs.append(lr)
        # An objective without the image-foil (ranking) term logs no such metric (NaN is
        # dropped).
        absent = parts.total.new_full((), math.nan)
        image_foil = absent if parts.image_foil is None else parts.image_foil.detach()
        ranking = absent if parts.ranking is None else parts.ranking.detach()
        self._values.append(torch.stack([parts.total.detach().float(), parts.full.detach().float(),
                                         parts.unit.detach().float(),
                                         logit_scale.detach().float().exp().reshape(()),
                                         image_foil.float(), ranking.float()]))

    def take(self) -> list[dict[str, float]]:
        """The buffered steps as {"step", "lr", "loss", "loss_full", "loss_unit",
        "logit_scale"[, "loss_image_foil"][, "loss_ranking"]} dicts, oldest first, and an
        empty buffer."""
        if not self._steps:
            return []
        values = torch.stack(self._values).tolist()                    # the one sync
        rows = [{"step": step, "lr": lr, **{name: value for name, value
                                             in zip(METRIC_NAMES, row, strict=True)
                                             if not math.isnan(value)}}
                for step, lr, row in zip(self._steps, self._lrs, values, strict=True)]
        self._steps, self._lrs, self._values = [], [], []
        return rows

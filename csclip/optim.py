"""The optimizer and its learning-rate schedule: AdamW with open_clip's parameter groups,
and a schedule that is a pure function of the optimizer step (as open_clip_train's
scheduler), with the authors' per-epoch stepping kept as a named option (SPEC §6)."""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field, model_validator

from csclip.config import StrictModel


class OptimConfig(StrictModel):
    """The `optim` section: AdamW with a warmup + cosine schedule."""

    lr: float = Field(5e-6, gt=0)
    weight_decay: float = Field(0.01, ge=0)
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = Field(1e-6, gt=0)
    warmup_steps: int = Field(50, ge=0)
    epochs: int = Field(5, ge=1)
    max_steps: int | None = Field(None, ge=1)  # stop after this many steps (overrides epochs)
    grad_clip: float | None = Field(1.0, gt=0)  # max gradient norm; None: no clipping
    # Gradient accumulation: each step's batch (data.batch_size) is encoded in accum_freq
    # micro-batches; the loss is still one loss over the whole batch (csclip.step), so
    # loss and gradients equal the unsplit step's. Less activation memory, ~1/3 more compute.
    accum_freq: int = Field(1, ge=1)
    fused: bool = True  # fused AdamW kernel when every parameter is on CUDA
    # cosine: the schedule advances every optimizer step (as intended). authors_per_epoch:
    # the authors' code builds the same per-step schedule but steps it once per epoch, so
    # warmup never ends and lr stays near lr * epoch / warmup (SPEC §6); for comparisons.
    schedule: Literal["cosine", "authors_per_epoch", "constant"] = "cosine"

    @model_validator(mode="after")
    def _betas_in_range(self) -> OptimConfig:
        if not all(0 <= b < 1 for b in self.betas):
            raise ValueError(f"betas {self.betas} must each be in [0, 1)")
        return self


def lr_at(step: int, optim: OptimConfig, total_steps: int, steps_per_epoch: int) -> float:
    """Learning rate for optimizer step `step` (0-based): linear warmup, then cosine to 0,
    as open_clip_train's `cosine_lr`. authors_per_epoch evaluates the same curve at the
    epoch index, as the authors' per-epoch `scheduler.step()` does (SPEC §6)."""
    if optim.schedule == "constant":
        return optim.lr
    position = step if optim.schedule == "cosine" else step // max(1, steps_per_epoch)
    if position < optim.warmup_steps:
        return optim.lr * (position + 1) / optim.warmup_steps
    decay_steps = max(1, total_steps - optim.warmup_steps)
    progress = min(1.0, (position - optim.warmup_steps) / decay_steps)
    return 0.5 * (1 + math.cos(math.pi * progress)) * optim.lr


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with open_clip's parameter groups: no weight decay on gains, biases,
    embeddings-like 1-d tensors and logit_scale."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = (param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name
                   or "logit_scale" in name)
        (no_decay if exclude else decay).append(param)
    groups = [{"params": no_decay, "weight_decay": 0.0},
              {"params": decay, "weight_decay": optim.weight_decay}]
    # One fused kernel instead of a dozen foreach kernels per step, and no host sync for
    # the step count; only on CUDA (the CPU kernel's numerics differ from the foreach path
    # every CPU test and result was made with). Build after the model is on its device.
    params = decay + no_decay
    fused = optim.fused and bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                             fused=fused or None)

"""The optimizer and its learning-rate schedule: AdamW with open_clip's parameter groups,
and a schedule that is a pure function of the optimizer step (as open_clip_train's
scheduler), with the authors' per-epoch stepping kept as a named option (SPEC §6)."""

from __future__ import annotations

import math

import torch

from csclip.config.train import OptimConfig


def warmup_steps_of(optim: OptimConfig, steps_per_epoch: int) -> int:
    """The warmup length in optimizer steps (warmup_epochs x steps_per_epoch when set)."""
    if optim.warmup_epochs is not None:
        return round(optim.warmup_epochs * steps_per_epoch)
    return optim.warmup_steps


def lr_at(step: int, optim: OptimConfig, total_steps: int, steps_per_epoch: int) -> float:
    """Learning rate for optimizer step `step` (0-based): warmup, then cosine to the floor
    at total_steps, as open_clip_train's `cosine_lr` (with the authors' warmup start and
    floor when set). authors_per_epoch evaluates the same curve at the epoch index, as the
    authors' per-epoch `scheduler.step()` does (SPEC §6)."""
    if optim.schedule == "constant":
        return optim.lr
    warmup = warmup_steps_of(optim, steps_per_epoch)
    position = step if optim.schedule == "cosine" else step // max(1, steps_per_epoch)
    if position < warmup:
        if optim.warmup_start_ratio is None:
            return optim.lr * (position + 1) / warmup
        start = optim.warmup_start_ratio
        return optim.lr * (start + (1 - start) * position / warmup)
    floor = optim.min_lr_ratio or 0.0
    progress = min(1.0, (position - warmup) / max(1, total_steps - warmup))
    return optim.lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_optimizer(model: torch.nn.Module, optim: OptimConfig) -> torch.optim.AdamW:
    """AdamW with open_clip's parameter groups (no weight decay on gains, biases,
    embeddings-like 1-d tensors and logit_scale), or with every parameter decayed when
    optim.decay_all_params (the authors' optimizer)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        exclude = not optim.decay_all_params and (
            param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name
            or "logit_scale" in name)
        (no_decay if exclude else decay).append(param)
    groups = [{"params": no_decay, "weight_decay": 0.0},
              {"params": decay, "weight_decay": optim.weight_decay}]
    # One fused kernel instead of a dozen foreach kernels per step, and no host sync for
    # the step count. On CPU too: csclip-tiny's update (3.3M parameters, most of them the
    # token embedding) is several times faster fused (docs/performance.md); the two
    # round differently, so the losses agree to float rounding, not bit for bit.
    # Build after the model is on its device.
    params = decay + no_decay
    fused = optim.fused and bool(params) and all(p.device.type in ("cuda", "cpu")
                                                 for p in params)
    return torch.optim.AdamW(groups, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                             fused=fused or None)

"""Helpers of the training tests: one batch's loss without a Training (compute_loss), and
what csclip.train.loop.WorkerHooks.loss_log recorded (read_loss_log)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from csclip.loss import LossParts, Objective
from csclip.train.step import encode


def compute_loss(model: torch.nn.Module, batch: Mapping[str, Tensor],
                 objective: Objective) -> LossParts:
    """Encode the batch with one forward call and apply the objective.

    batch: the objective's image columns (B, 3, H, W), token columns (B, L) and mask
    columns (B,).
    """
    encoded = encode(model, batch, objective.columns, image_columns=objective.image_columns)
    masks = {name: batch[name] for name in objective.mask_columns}
    return objective.loss(encoded.image, encoded.texts, masks, encoded.scale, encoded.images)


def read_loss_log(directory: str | Path) -> dict[int, list[list[tuple[int, float]]]]:
    """What WorkerHooks.loss_log recorded: for each rank, the (step, loss) pairs of each
    worker process it ran in (an attempt: before a kill, after the restart), in order."""
    ranks: dict[int, list[list[tuple[int, float]]]] = {}
    for file in sorted(Path(directory).glob("rank-*.jsonl")):
        attempts: dict[int, list[tuple[int, float]]] = {}  # by process id, in order
        for line in file.read_text().splitlines():
            row = json.loads(line)
            attempts.setdefault(row["pid"], []).append((row["step"], row["loss"]))
        ranks[int(file.stem.removeprefix("rank-"))] = list(attempts.values())
    return ranks

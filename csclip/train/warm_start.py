"""The layout warm start (ours, beyond the paper): loss.method `layout`, the image tower
learning where every object kind of the synthetic world is. The demo runs it before its
contrastive pretraining, as any training: a TrainConfig through csclip.train.run and the
one step (csclip.train.step), with MLflow, checkpoints and resume; the loss equation is
csclip.loss.layout_loss. This module holds what the objective adds to that program: the
targets (each kind's grid cell, from the scene), the linear head on the image embedding,
the runner that answers the question, and the held-out measurement of a trained tower.

Why: contrastive pretraining from random weights never asks the image tower where things
are (in-batch negatives differ in their objects, not in their layout), and fine-tuning then
meets a saddle: each tower's gradient on layout is proportional to the other tower's layout
signal, both ~0, so no objective teaches "left of". An image tower that already encodes
layout breaks it (docs/research/spatial.md).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from csclip.config.world import SHAPES, WorldConfig
from csclip.loss import LayoutQuestion, layout_loss
from csclip.model import bundle_from_config, load_weights_into, remote_checkpoint_check, spec_of
from csclip.storage import is_s3, local_dir
from csclip.units import record_from_row
from csclip.world.generate import world_record
from csclip.world.scene import Scene, scene_from_record

HEAD = "layout_head"  # the head's attribute on the model (csclip.model.OBJECTIVE_HEADS)


@dataclass(frozen=True)
class LayoutVocabulary:
    """The object kinds the question is asked about (a world's colors x shapes); a study
    may ask another question of the same shape (research/spatial)."""

    colors: tuple[str, ...]
    shapes: tuple[str, ...] = SHAPES

    @property
    def num_kinds(self) -> int:
        return len(self.colors) * len(self.shapes)

    def kind(self, color: str | None, shape: str) -> int | None:
        if color not in self.colors or shape not in self.shapes:
            return None
        return self.colors.index(color) * len(self.shapes) + self.shapes.index(shape)


def layout_question(world: WorldConfig) -> LayoutQuestion:
    """The layout question of `world`'s scenes."""
    return LayoutQuestion(tuple(world.colors), tuple(world.shapes), world.grid_size)


def image_cell_targets(vocabulary: LayoutVocabulary | LayoutQuestion, scene: Scene) -> np.ndarray:
    """(num_kinds,) int64: each object kind's grid cell (row * grid + col), or
    grid_size**2 ("absent") for a kind the scene does not hold."""
    cells = scene.grid_size ** 2
    target = np.full(vocabulary.num_kinds, cells, dtype=np.int64)
    for obj in scene.objects:
        kind = vocabulary.kind(obj.color, obj.shape)
        if kind is not None:
            target[kind] = obj.row * scene.grid_size + obj.col
    return target


def layout_targets(rows: Sequence[dict], question: LayoutQuestion) -> np.ndarray:
    """(n, num_kinds) int64: image_cell_targets of each units row's scene (the training
    stream's `layout_target` column). Raises DataError for a row without a scene."""
    return np.stack([image_cell_targets(question, scene_from_record(record_from_row(row)))
                     for row in rows]).reshape(len(rows), question.num_kinds)


# ---------------------------------------------------------------------------------------
# The head and the runner
# ---------------------------------------------------------------------------------------

def add_layout_head(model: torch.nn.Module, question: LayoutQuestion) -> None:
    """Give `model` (an open_clip CLIP, in place) the layout head: a linear map of the
    image embedding (before normalisation) to each kind's class logits. Everything but
    the image tower and the head is frozen: the question is the image tower's alone, and
    the text tower and temperature leave as they came."""
    for name, param in model.named_parameters():
        if not name.startswith("visual."):
            param.requires_grad_(False)
    setattr(model, HEAD, torch.nn.Linear(model.visual.output_dim,
                                         question.num_kinds * question.num_classes))


class LayoutForward(torch.nn.Module):
    """What the step runs for loss.method layout: images -> the head's logits
    (B, K * classes), in the shape of CLIP's forward (features, text features, scale), so
    the step's encoding, accumulation and DDP treat it as any runner."""

    wraps_model = True  # csclip.model.unwrap finds the model inside

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor, texts: Tensor | None = None):
        model = self.model
        return getattr(model, HEAD)(model.visual(images)), None, model.logit_scale.exp()


# ---------------------------------------------------------------------------------------
# What a trained image tower knows
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WarmStartResult:
    """What the layout question's held-out scenes say of a trained image tower and its
    head: the share (%) of present objects put in their cell (chance ~1/9) and of kinds
    rightly called present or absent; absent_share: the share (%) of kinds absent from
    their held-out scene, what a head that always answers "absent" gets right;
    held_out_loss: layout_loss on those scenes."""

    cell_accuracy: float
    presence_accuracy: float
    absent_share: float
    held_out_loss: float
    held_out: int


@torch.no_grad()
def measure_layout(model: torch.nn.Module, preprocess, world: WorldConfig, held_out: int,
                   device: str | torch.device = "cpu") -> WarmStartResult:
    """WarmStartResult of `model` (with its layout head) on the first `held_out` scenes of
    `world`'s validation split."""
    if held_out < 1:
        raise ValueError("held_out must be >= 1")
    question = layout_question(world)
    source = world.model_copy(update={"num_val": held_out})
    images, targets = [], []
    for index in range(held_out):
        record = world_record(source, "val", index)
        images.append(preprocess(Image.open(io.BytesIO(record.image_bytes)).convert("RGB")))
        targets.append(torch.from_numpy(image_cell_targets(question, scene_from_record(record))))
    runner = LayoutForward(model).to(device).eval()
    x, y = torch.stack(images).to(device), torch.stack(targets).to(device)
    flat = runner(x)[0]
    logits = flat.view(len(x), question.num_kinds, question.num_classes)
    cells = question.num_classes - 1
    present = y < cells
    cell = logits[..., :cells].argmax(-1)
    called_present = logits.argmax(-1).ne(cells)
    return WarmStartResult(
        cell_accuracy=100.0 * float(cell[present].eq(y[present]).float().mean())
        if present.any() else float("nan"),
        presence_accuracy=100.0 * float(called_present.eq(present).float().mean()),
        absent_share=100.0 * float((~present).float().mean()),
        held_out_loss=float(layout_loss(flat, y)), held_out=held_out)


def measure_checkpoint(checkpoint_uri: str, model_config, world: WorldConfig,
                       held_out: int | None = None) -> WarmStartResult:
    """measure_layout of a layout run's checkpoint (its model, with the head it was saved
    with). model_config: the run's `model` section; held_out: default world.num_val."""
    bundle = bundle_from_config(model_config.model_copy(update={"pretrained": None}))
    add_layout_head(bundle.model, layout_question(world))
    spec = spec_of(bundle.model, model_config.name)
    # From S3: the spec is checked before the rest of the prefix is copied.
    local = local_dir(checkpoint_uri, kind="checkpoints",
                      check=remote_checkpoint_check(checkpoint_uri, lambda: spec)
                      ) if is_s3(checkpoint_uri) else checkpoint_uri
    load_weights_into(bundle.model, local, spec)
    return measure_layout(bundle.model, bundle.preprocess, world,
                          world.num_val if held_out is None else held_out)

"""The layout warm start of the demo's pretraining (ours, beyond the paper): the image tower
learns where every object kind of the synthetic world is, before contrastive pretraining.

Why: contrastive pretraining from random weights never asks the image tower where things
are (in-batch negatives differ in their objects, not in their layout), and fine-tuning then
meets a saddle: each tower's gradient on layout is proportional to the other tower's layout
signal, both ~0, so no objective teaches "left of". An image tower that already encodes
layout breaks it (docs/research/spatial.md). Pure torch and the world's scenes; no Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from csclip.world.config import SHAPES
from csclip.world.scene import Scene, scene_from_record


@dataclass(frozen=True)
class LayoutVocabulary:
    """The object kinds the question is asked about (a world's colors x shapes)."""

    colors: tuple[str, ...]
    shapes: tuple[str, ...] = SHAPES

    @property
    def num_kinds(self) -> int:
        return len(self.colors) * len(self.shapes)

    def kind(self, color: str | None, shape: str) -> int | None:
        if color not in self.colors or shape not in self.shapes:
            return None
        return self.colors.index(color) * len(self.shapes) + self.shapes.index(shape)


def image_cell_targets(vocabulary: LayoutVocabulary, scene: Scene) -> np.ndarray:
    """(num_kinds,) int64: each object kind's grid cell (row * grid + col), or
    grid_size**2 ("absent") for a kind the scene does not hold."""
    cells = scene.grid_size ** 2
    target = np.full(vocabulary.num_kinds, cells, dtype=np.int64)
    for obj in scene.objects:
        kind = vocabulary.kind(obj.color, obj.shape)
        if kind is not None:
            target[kind] = obj.row * scene.grid_size + obj.col
    return target


@dataclass(frozen=True)
class WarmStartResult:
    """What the layout question's held-out scenes say of the trained image tower:
    the share (%) of present objects put in their cell (chance ~1/9) and of kinds
    rightly called present or absent; absent_share: the share (%) of kinds absent from
    their held-out scene, what a head that always answers "absent" gets right."""

    cell_accuracy: float
    presence_accuracy: float
    absent_share: float
    steps: int
    seconds: float
    first_loss: float  # the training loss of the first and the last step
    last_loss: float


def image_layout_warm_start(model: torch.nn.Module, preprocess, world, steps: int, *,
                            batch_size: int = 64, lr: float = 1e-3, weight_decay: float = 0.1,
                            seed: int = 0, held_out: int = 300, log_every: int = 100,
                            device: str | torch.device = "cpu",
                            cell_targets: Callable[[LayoutVocabulary, Scene], np.ndarray]
                            = image_cell_targets, log=print) -> WarmStartResult:
    """Train `model`'s image tower, in place, to say where every object kind is: a
    linear head on the image embedding predicts each kind's grid cell or "absent" (cross
    entropy), on the scenes of `world` (a WorldConfig; its train split), for `steps`
    AdamW steps, on `device` (the model is moved there and left there). The text tower
    is left as it is. held_out: validation scenes of `world` the result is measured on.
    cell_targets: each kind's class in a scene (image_cell_targets: its cell, or
    grid_size**2 for "absent"); a study may ask another question of the same shape.
    """
    import io
    import time

    from PIL import Image

    from csclip.world.generate import world_record

    torch.manual_seed(seed)
    vocabulary = LayoutVocabulary(tuple(world.colors), tuple(world.shapes))
    cells = world.grid_size ** 2

    def examples(source, split: str, count: int) -> tuple[Tensor, Tensor]:
        images, targets = [], []
        for index in range(count):
            record = world_record(source, split, index)
            image = Image.open(io.BytesIO(record.image_bytes)).convert("RGB")
            images.append(preprocess(image))
            target = cell_targets(vocabulary, scene_from_record(record))
            targets.append(torch.from_numpy(target))
        return torch.stack(images), torch.stack(targets)

    if held_out < 1:
        raise ValueError("held_out must be >= 1")
    started = time.perf_counter()
    train_x, train_y = examples(world, "train", world.num_train)
    test_x, test_y = examples(world.model_copy(update={"num_val": held_out}), "val", held_out)
    device = torch.device(device)
    train_x, train_y, test_x, test_y = (t.to(device) for t in (train_x, train_y, test_x, test_y))
    visual = model.visual.to(device).train()
    head = torch.nn.Linear(visual.output_dim, vocabulary.num_kinds * (cells + 1)).to(device)
    optimizer = torch.optim.AdamW([*visual.parameters(), *head.parameters()], lr=lr,
                                  weight_decay=weight_decay)
    generator = torch.Generator().manual_seed(seed)
    first_loss = last_loss = float("nan")
    for step in range(1, steps + 1):
        index = torch.randint(len(train_x), (batch_size,), generator=generator).to(device)
        logits = head(visual(train_x[index])).view(batch_size, vocabulary.num_kinds, cells + 1)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), train_y[index].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        logged = bool(log_every) and (step % log_every == 0 or step == steps)
        # .item() waits for the device: only where the value is read, not every step.
        if step == 1 or step == steps or logged:
            last_loss = loss.item()
            first_loss = last_loss if step == 1 else first_loss
        if logged:
            log(f"layout warm start: step {step}/{steps} loss {last_loss:.4f} "
                f"({time.perf_counter() - started:.0f} s)")
    visual.eval()
    with torch.no_grad():
        logits = head(visual(test_x)).view(len(test_x), vocabulary.num_kinds, cells + 1)
    present = test_y < cells
    cell = logits[..., :cells].argmax(-1)
    called_present = logits.argmax(-1).ne(cells)
    return WarmStartResult(
        cell_accuracy=100.0 * float(cell[present].eq(test_y[present]).float().mean())
        if present.any() else float("nan"),
        presence_accuracy=100.0 * float(called_present.eq(present).float().mean()),
        absent_share=100.0 * float((~present).float().mean()),
        steps=steps, seconds=time.perf_counter() - started, first_loss=first_loss,
        last_loss=last_loss)

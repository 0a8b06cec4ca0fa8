"""The pairwise layout question, a study of the spatial-relations work (docs/research/
spatial.md): one auxiliary task for both towers, answered through one shared head.

Why: contrastive pretraining on world captions erases layout from both towers (in-batch
negatives differ in their objects, never in where they are), and CS-CLIP's unit loss
cannot bring it back on a small budget: separating "A left of B" from "A right of B" in the
text needs an image embedding that differs between the two layouts, and vice versa.
Asking each tower about layout *separately* (a head per tower) teaches both, but in
unrelated directions of the joint space, and the next contrastive steps wash them out
again.

The question: for every ordered pair of object kinds (color + shape) and each direction,
"is A left of / right of / above / below B?". An image answers it for every pair of its
objects; a relation text "A r B" for the pair it names (r true, its antonym false, and the
same for B and A). Both towers answer through ONE linear head on the normalized embedding,
so a relation lands in the same direction of the joint space in both, where cosine scoring
sees it. Pure torch + the world's scene; no ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from csclip.config.world import ANTONYMS, LEFT, PREDICATES
from csclip.train.warm_start import LayoutVocabulary, image_cell_targets
from csclip.units import Unit, UnitsRecord, render_relation
from csclip.world.scene import Scene, scene_from_record
from csclip.world.truth import WorldLanguageError, parse_entity

# The order of the head's direction slots; PREDICATES is (left, right, above, below).
DIRECTIONS: tuple[str, ...] = PREDICATES
assert DIRECTIONS[0] == LEFT


@dataclass(frozen=True)
class PairVocabulary(LayoutVocabulary):
    """The warm start's object kinds, asked about in ordered pairs and directions."""

    @property
    def size(self) -> int:
        """Answers per example: ordered kind pairs x directions."""
        return self.num_kinds ** 2 * len(DIRECTIONS)

    def index(self, first: int, second: int, direction: int) -> int:
        return (first * self.num_kinds + second) * len(DIRECTIONS) + direction

    def image_targets(self, scene: Scene) -> tuple[np.ndarray, np.ndarray]:
        """(target, mask), float32 (size,): every ordered pair of the scene's objects, each
        direction, answered (the picture shows them all); other pairs masked out."""
        target, mask = np.zeros(self.size, np.float32), np.zeros(self.size, np.float32)
        for a in scene.objects:
            for b in scene.objects:
                ia, ib = self.kind(a.color, a.shape), self.kind(b.color, b.shape)
                if a is b or ia is None or ib is None:
                    continue
                truths = (a.col < b.col, a.col > b.col, a.row < b.row, a.row > b.row)
                for direction, truth in enumerate(truths):
                    index = self.index(ia, ib, direction)
                    target[index], mask[index] = float(truth), 1.0
        return target, mask

    def text_targets(self, subject: str, predicate: str, object: str
                     ) -> tuple[np.ndarray, np.ndarray] | None:
        """(target, mask) of the relation text "subject predicate object": (A r B) and
        (B r' A) true, (A r' B) and (B r A) false; the other axis is not said, so masked.
        None when the text is not a world relation between two kinds of this vocabulary."""
        if predicate not in DIRECTIONS:
            return None
        try:
            first, second = (parse_entity(part.split(), part) for part in (subject, object))
        except WorldLanguageError:
            return None
        ia, ib = self.kind(first.color, first.shape), self.kind(second.color, second.shape)
        if ia is None or ib is None or ia == ib:
            return None
        r, r_ = DIRECTIONS.index(predicate), DIRECTIONS.index(ANTONYMS[predicate])
        target, mask = np.zeros(self.size, np.float32), np.zeros(self.size, np.float32)
        for a, b, direction, truth in ((ia, ib, r, 1.0), (ia, ib, r_, 0.0),
                                       (ib, ia, r_, 1.0), (ib, ia, r, 0.0)):
            index = self.index(a, b, direction)
            target[index], mask[index] = truth, 1.0
        return target, mask

    def text_examples(self, record: UnitsRecord) -> list[tuple[str, np.ndarray, np.ndarray]]:
        """Each relation unit of a world record with its antonym and swap texts, and their
        answers: the three differ only in layout, so the text tower must read the
        predicate and the word order to tell them apart."""
        examples = []
        for unit in record.relations:
            for a, p, b in relation_variants(unit):
                answers = self.text_targets(a, p, b)
                if answers is not None:
                    examples.append((render_relation(a, p, b), *answers))
        return examples


def relation_variants(unit: Unit) -> list[tuple[str, str, str]]:
    """(subject, predicate, object) of a world relation unit, of its antonym and of its
    swap; [] for a unit whose predicate is not a world direction."""
    s, r, o = unit.subject or "", unit.predicate or "", unit.object or ""
    if r not in DIRECTIONS:
        return []
    return [(s, r, o), (s, ANTONYMS[r], o), (o, r, s)]


def record_image_targets(vocabulary: PairVocabulary, record: UnitsRecord
                         ) -> tuple[np.ndarray, np.ndarray]:
    """image_targets of a world record's scene; all masked for a record without one."""
    if not record.meta.get("scene"):
        return np.zeros(vocabulary.size, np.float32), np.zeros(vocabulary.size, np.float32)
    return vocabulary.image_targets(scene_from_record(record))


class LayoutHead(torch.nn.Module):
    """The shared head: a linear map of the L2-normalized joint embedding, times a scale
    (the normalized embedding is what cosine scoring sees).

    frozen: a fixed random map (seeded, no bias) and a fixed scale, nothing to train, sync
    across workers or checkpoint: the towers learn to answer through it."""

    def __init__(self, embed_dim: int, vocabulary: PairVocabulary, frozen: bool = False,
                 seed: int = 0) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(embed_dim, vocabulary.size, bias=not frozen)
        self.log_scale = torch.nn.Parameter(torch.tensor(float(np.log(10.0))))
        if frozen:
            generator = torch.Generator().manual_seed(seed)
            with torch.no_grad():
                self.linear.weight.copy_(torch.randn(vocabulary.size, embed_dim,
                                                     generator=generator))
                # z.w for a unit z is ~N(0, 1): logits start at std 3, reach ~3 sqrt(D).
                self.log_scale.fill_(float(np.log(3.0)))
            self.requires_grad_(False)

    def forward(self, features: Tensor) -> Tensor:
        normalized = torch.nn.functional.normalize(features.float(), dim=-1)
        return self.linear(normalized * self.log_scale.exp())


def layout_loss(logits: Tensor, target: Tensor, mask: Tensor) -> Tensor:
    """Binary cross-entropy over the answered entries (mask 1), averaged; 0 when none is."""
    losses = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.float(), target.float(), reduction="none")
    answered = mask.float()
    return (losses * answered).sum() / answered.sum().clamp_min(1.0)


def layout_accuracy(logits: Tensor, target: Tensor, mask: Tensor) -> float:
    """Share (%) of the answered entries the head gets right."""
    right = (logits > 0).float().eq(target.float()).float() * mask.float()
    return 100.0 * float(right.sum() / mask.float().sum().clamp_min(1.0))




def presence_targets(vocabulary: LayoutVocabulary, scene: Scene) -> np.ndarray:
    """The warm start's control question: every present kind's class is cell 0, so the
    tower learns which objects there are, not where (cell_targets of the warm start)."""
    from csclip.train.warm_start import image_cell_targets

    target = image_cell_targets(vocabulary, scene)
    return np.where(target < scene.grid_size ** 2, 0, target)


@dataclass(frozen=True)
class SupervisedLayoutResult:
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


def supervised_layout_training(model: torch.nn.Module, preprocess, world, steps: int, *,
                            batch_size: int = 64, lr: float = 1e-3, weight_decay: float = 0.1,
                            seed: int = 0, held_out: int = 300, log_every: int = 100,
                            device: str | torch.device = "cpu",
                            cell_targets: Callable[[LayoutVocabulary, Scene], np.ndarray]
                            = image_cell_targets, log=print) -> SupervisedLayoutResult:
    """The study's own loop (the product's warm start is loss.method layout, trained by
    csclip.train.run): train `model`'s image tower, in place, to say where every object kind is: a
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
    return SupervisedLayoutResult(
        cell_accuracy=100.0 * float(cell[present].eq(test_y[present]).float().mean())
        if present.any() else float("nan"),
        presence_accuracy=100.0 * float(called_present.eq(present).float().mean()),
        absent_share=100.0 * float((~present).float().mean()),
        steps=steps, seconds=time.perf_counter() - started, first_loss=first_loss,
        last_loss=last_loss)

"""The authors' held-out captions (`data.val_ratio`): a seeded fraction of the training
rows kept out of training, scored at each evaluation by the authors' contrastive accuracy,
the best state kept in best/ (run.best_metric contrastive_accuracy).

The authors (kargibora/CS-CLIP@98b40c0) draw it in data_loading/coco_neg.py:274-340
(`split_dataset`, split_type "object"): the rows grouped by `sample_id` (one per caption,
`coco_{imgid}_{sentid}`, neg_pipeline/main.py:202 at 16276c7), the ids shuffled with
random.Random(seed), the first int(n * val_ratio) held out. Their metric is
utils/evaluate.py:9-55 (`get_contrastive_accuracy`) on alignment/evaluation/metrics.py:83:
for each held-out row, the image's similarity with the full caption above its similarity
with every paired negative (the caption's own and each unit's foil). Called by
csclip.train (driver: the split; rank 0: the score); it imports the stream, never the loop.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from csclip.errors import ConfigError
from csclip.train.stream import (
    PIXELS,
    image_shape,
    prepare_batch,
    preprocess_key,
    sample_batch,
)

log = logging.getLogger(__name__)

METRIC = "contrastive_accuracy"  # the report key; logged as val_contrastive_accuracy


def held_out_ids(sample_ids: Iterable[str], ratio: float, seed: int) -> frozenset[str]:
    """The held-out sample ids, drawn as the authors' split_type "object": the distinct
    ids (sorted, so the draw does not depend on the order a reader lists the rows),
    shuffled with random.Random(seed), the first int(n * ratio)."""
    if not 0.0 <= ratio < 1.0:
        raise ConfigError(f"data.val_ratio {ratio}: give a fraction in [0, 1)")
    ids = sorted({str(s) for s in sample_ids})
    random.Random(seed).shuffle(ids)
    return frozenset(ids[:int(len(ids) * ratio)])


def contrastive_accuracy(image: Any, caption: Any, negatives: Any, valid: Any) -> float:
    """The authors' contrastive accuracy (utils/evaluate.py:9-55) as a fraction: of the
    rows with at least one negative, those whose image-caption similarity is above the
    image's similarity with every valid negative (strictly, as their `pos > neg`).

    image, caption: (N, D) features (normalised by the caller); negatives (N, K, D);
    valid (N, K) bool: False where a slot holds no negative (their fallback is an empty
    string; ours is left out). NaN when no row has a negative.
    """
    import torch  # noqa: PLC0415  Ray Data's tasks run keep_rows/drop_rows and never need torch

    pos = (image * caption).sum(-1)                              # (N,)
    neg = torch.einsum("nd,nkd->nk", image, negatives)           # (N, K)
    valid = torch.as_tensor(valid, dtype=torch.bool, device=neg.device)
    wins = (pos.unsqueeze(1) > neg) | ~valid
    counted = valid.any(dim=1)
    if not bool(counted.any()):
        return math.nan
    return float(wins.all(dim=1)[counted].float().mean())


class HeldOut:
    """The held-out rows prepared once (image, caption and negatives drawn as epoch 0 of
    training draws them, seeded), scored on the live model at each evaluation."""

    def __init__(self, table: pa.Table, *, sampling: dict, preprocess_cfg: dict,
                 model_name: str, seed: int, chunk: int = 128) -> None:
        slots = int(sampling.get("num_unit_slots", 0))
        columns = ["caption", "caption_negative",
                   *[f"unit_{k}" for k in range(slots)], *[f"foil_{k}" for k in range(slots)]]
        preprocess = preprocess_key(preprocess_cfg)
        if PIXELS in table.column_names:  # from shards of uint8 pixels, tokens made
            out = sample_batch(table, sampling=sampling, model_name=model_name, seed=seed,
                               epoch=0, image_shape=image_shape(preprocess_cfg),
                               columns=columns, preprocess=preprocess)
        else:
            out = prepare_batch(table, sampling=sampling, preprocess=preprocess,
                                model_name=model_name, seed=seed, epoch=0, columns=columns)
        if not out:
            raise ConfigError("data.val_ratio: no held-out image decodes")
        self.image = out["image"]
        self.caption = out["caption"]
        negatives = [out["caption_negative"], *[out[f"foil_{k}"] for k in range(slots)]]
        self.negatives = np.stack(negatives, axis=1)                 # (N, 1+K, L)
        masks = [out["negative_mask"], *([out["unit_mask"]] * slots if slots else [])]
        self.valid = np.stack(masks, axis=1).astype(bool)            # (N, 1+K)
        self.chunk = chunk

    def __len__(self) -> int:
        return len(self.image)

    def score(self, model: Any, device: str) -> float:
        """Percent of held-out rows the authors' metric counts as correct (x100 of their
        fraction, as the other val_ keys), on `model` in eval mode, then back."""
        import torch  # noqa: PLC0415  Ray Data's tasks run keep_rows/drop_rows and never need torch

        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                feats = [self._encode(model, device, start) for start in
                         range(0, len(self), self.chunk)]
        finally:
            model.train(was_training)
        image = torch.cat([f[0] for f in feats])
        caption = torch.cat([f[1] for f in feats])
        negatives = torch.cat([f[2] for f in feats])
        normalize = torch.nn.functional.normalize
        return 100.0 * contrastive_accuracy(normalize(image, dim=-1), normalize(caption, dim=-1),
                                            normalize(negatives, dim=-1), self.valid)

    def _encode(self, model: Any, device: str, start: int) -> tuple:
        import torch  # noqa: PLC0415  Ray Data's tasks run keep_rows/drop_rows and never need torch

        end = start + self.chunk
        dtype = next(model.parameters()).dtype
        image = model.encode_image(torch.as_tensor(self.image[start:end], device=device,
                                                    dtype=dtype)).float()
        caption = model.encode_text(torch.as_tensor(self.caption[start:end], device=device))
        n, k, length = self.negatives[start:end].shape
        tokens = torch.as_tensor(self.negatives[start:end].reshape(n * k, length), device=device)
        negatives = model.encode_text(tokens).float().reshape(n, k, -1)
        return image.cpu(), caption.float().cpu(), negatives.cpu()


def load_held_out(refs: Sequence, config) -> HeldOut | None:
    """Rank 0's HeldOut from the driver's refs (None when there are none): units rows
    with their images' bytes, or rows of uint8 pixels (csclip.train.shards.held_out_rows)."""
    if not refs:
        return None
    import ray  # noqa: PLC0415  a training step runs without Ray (tests/test_layout.py)

    from csclip.model import spec_from_config  # noqa: PLC0415  imports torch, which Ray Data's tasks of this module never need

    table = pa.concat_tables([t for t in ray.get(list(refs)) if t.num_rows])
    return HeldOut(table, sampling=config.sampling.model_dump(mode="json"),
                   preprocess_cfg=spec_from_config(config.model).preprocess_cfg,
                   model_name=config.model.name, seed=config.run.seed)


def evaluation_due(step: int, total: int, eval_every: int | None, steps_per_epoch: int) -> bool:
    """When rank 0 evaluates: every run.eval_every steps, or without it at the end of each
    epoch (the authors' eval_n 1: learning_alignment.py:426,751). These are the only
    checkpoint candidates, as the authors' (their last candidate is their last evaluation,
    not the last step); a run too short for any evaluation evaluates its last step, so
    that it has one."""
    every = eval_every if eval_every is not None else steps_per_epoch
    return step % every == 0 or (step == total and total < every)

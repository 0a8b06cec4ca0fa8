"""Image-side half-truth (SPEC §4): a text must rank its image above distractors."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from csclip.errors import DataError
from csclip.eval.halftruth.construction import entity_may_hold, joined, stable_rng
from csclip.units import UnitsRecord, normalize_text


@dataclass(frozen=True)
class ImageSideItem:
    """Text "{shared} and {distinct}" with its target image and 2-5 distractor images that
    show the shared entity but not the distinct one."""

    image_id: str
    text: str
    shared: str
    distinct: str
    distractors: tuple[str, ...] = field(default_factory=tuple)


def build_image_side_benchmark(
    records: Iterable[UnitsRecord],
    seed: int = 0,
    min_distractors: int = 2,
    max_distractors: int = 5,
) -> list[ImageSideItem]:
    """One item per image where some entity pair has at least `min_distractors` images
    sharing the first entity and lacking the second; seeded and deterministic."""
    entities: dict[str, set[str]] = defaultdict(set)
    has_image: dict[str, bool] = {}
    for record in records:
        entities[record.image_id].update(normalize_text(u.text) for u in record.entities)
        has_image[record.image_id] = has_image.get(record.image_id, False) or bool(
            record.image_bytes is not None or record.image_path
        )
    if not entities:
        raise DataError("image-side benchmark: no records; pass a non-empty units table")
    images_with: dict[str, set[str]] = defaultdict(set)
    for image_id, texts in entities.items():
        if has_image[image_id]:
            for text in texts:
                images_with[text].add(image_id)
    with_head: dict[str, set[str]] = defaultdict(set)
    for image_id, texts in entities.items():
        for text in texts:
            with_head[text.split()[-1] if text else ""].add(image_id)
    blocked: dict[str, set[str]] = {}
    pools: dict[tuple[str, str], set[str]] = {}

    def pool(shared: str, distinct: str) -> set[str]:
        if (shared, distinct) not in pools:
            pools[(shared, distinct)] = _pool(shared, distinct)
        return pools[(shared, distinct)]

    def _pool(shared: str, distinct: str) -> set[str]:
        # Images showing `shared` where `distinct` may not hold. Which images block a
        # distinct entity does not depend on the target image: computed once per text,
        # only over images with the same head noun (linear, not quadratic, in images).
        if distinct not in blocked:
            head = distinct.split()[-1] if distinct else ""
            blocked[distinct] = {
                other
                for other in with_head[head]
                if entity_may_hold(distinct, sorted(entities[other]))
            }
        return images_with[shared] - blocked[distinct]

    items = []
    for image_id in sorted(entities):
        if not has_image[image_id]:
            continue
        options = [
            (shared, distinct)
            for shared in sorted(entities[image_id])
            for distinct in sorted(entities[image_id] - {shared})
            # The image itself shows `distinct`, so it is never in its own pool.
            if len(pool(shared, distinct)) >= min_distractors
        ]
        if options:
            rng = stable_rng(seed, image_id, "image_side")
            shared, distinct = rng.choice(options)
            candidates = sorted(pool(shared, distinct))
            chosen = rng.sample(candidates, min(max_distractors, len(candidates)))
            items.append(
                ImageSideItem(
                    image_id, joined(shared, distinct), shared, distinct, tuple(sorted(chosen))
                )
            )
    return items


def image_side_metrics(target: np.ndarray, distractors: Sequence[np.ndarray]) -> dict[str, float]:
    """Top-1 accuracy (percent), MRR and mean margin s(target) - max s(distractor).

    target: (num_items,) scores of each text with its own image; distractors[i]: scores of
    item i's text with its distractor images. Ties rank the target below (strict).
    """
    if len(distractors) != len(target):
        raise ValueError(f"{len(target)} targets but {len(distractors)} distractor lists")
    if len(target) == 0:
        return {"image_side_num_items": 0.0}
    ranks = np.array(
        [1 + int((np.asarray(d) >= t).sum()) for t, d in zip(target, distractors, strict=True)]
    )
    margins = np.array([t - float(np.max(d)) for t, d in zip(target, distractors, strict=True)])
    return {
        "image_side_top1": float((ranks == 1).mean() * 100),
        "image_side_mrr": float((1.0 / ranks).mean()),
        "image_side_margin": float(margins.mean()),
        "image_side_num_items": float(len(target)),
    }

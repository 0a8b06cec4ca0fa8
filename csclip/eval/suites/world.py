"""The synthetic world's compositional suites: Winoground-style mirrored pairs (I2T, T2I,
Group) and SugarCrepe-style in-place replace items (I2T), both checked by the world's truth
oracle (csclip.world.pairs)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from csclip.eval.encoder import Encoder, FeatureTables, ImageSource, image_sources
from csclip.eval.suites.rules import strict_accuracy, winoground_metrics
from csclip.units import UnitsRecord
from csclip.world.pairs import MirroredPair, ReplaceItem, build_mirrored_pairs, build_replace_items

log = logging.getLogger(__name__)


def _pair_images(pairs: Sequence[MirroredPair]) -> dict[str, ImageSource]:
    images: dict[str, ImageSource] = {}
    for pair in pairs:
        # Image A is the record's own image, so the benchmark's features are reused.
        images[pair.image_id] = pair.image_a
        images[f"{pair.pair_id}/b"] = pair.image_b
    return images


def world_pair_metrics(features: FeatureTables, pairs: Sequence[MirroredPair]) -> dict[str, float]:
    """comp_i2t / comp_t2i / comp_group over mirrored pairs."""
    a_ids = [p.image_id for p in pairs]
    b_ids = [f"{p.pair_id}/b" for p in pairs]
    captions_a = [p.caption_a for p in pairs]
    captions_b = [p.caption_b for p in pairs]
    return winoground_metrics(
        features.similarity(a_ids, captions_a),
        features.similarity(a_ids, captions_b),
        features.similarity(b_ids, captions_a),
        features.similarity(b_ids, captions_b),
    )


def replace_metrics(features: FeatureTables, items: Sequence[ReplaceItem]) -> dict[str, float]:
    """comp_i2t_replace: the image scores its caption above the in-place foil edit."""
    if not items:
        return {"comp_num_replace_items": 0.0}
    image_ids = [i.image_id for i in items]
    return {
        "comp_i2t_replace": strict_accuracy(
            features.similarity(image_ids, [i.caption for i in items]),
            features.similarity(image_ids, [i.foil_caption for i in items]),
        ),
        "comp_num_replace_items": float(len(items)),
    }


def evaluate_world_suites(
    encoder: Encoder,
    records: Sequence[UnitsRecord],
    seed: int = 0,
    num_pairs: int = 200,
    num_replace_items: int = 200,
) -> dict[str, float]:
    """Mirrored pairs (at most num_pairs) and replace items (at most num_replace_items) on
    the world records among `records` ({} when there are none)."""
    world = [r for r in records if r.meta.get("scene")]
    if not world:
        return {}
    pairs = build_mirrored_pairs(world, seed, num_pairs)
    items = build_replace_items(world, seed, num_replace_items)
    texts = [t for p in pairs for t in (p.caption_a, p.caption_b)]
    texts += [t for i in items for t in (i.caption, i.foil_caption)]
    images = _pair_images(pairs)
    images.update(image_sources(world, [i.image_id for i in items]))
    features = encoder.features(texts, images)
    metrics = {**world_pair_metrics(features, pairs), **replace_metrics(features, items)}
    log.info("world suites: %d mirrored pairs, %d replace items", len(pairs), len(items))
    return metrics

"""Compositional suites (SPEC §5): Winoground-style mirrored pairs and SugarCrepe-style
replace items on the synthetic world, the real SugarCrepe subsets, and `evaluate_suites`,
which adds them and retrieval to an evaluation's metrics."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import Field, model_validator

from csclip.config import StrictModel
from csclip.errors import DataError
from csclip.model import ClipBundle
from csclip.retrieval import extend_features, retrieval_metrics, retrieval_set
from csclip.scoring import (
    BundleScorer,
    FeatureTables,
    ImageSource,
    Scorer,
    encode_features,
    image_sources,
)
from csclip.units import UnitsRecord
from csclip.world.pairs import MirroredPair, ReplaceItem, build_mirrored_pairs, build_replace_items

log = logging.getLogger(__name__)

SUGARCREPE_SUBSETS: tuple[str, ...] = (
    "add_att",
    "add_obj",
    "replace_att",
    "replace_obj",
    "replace_rel",
    "swap_att",
    "swap_obj",
)


class SuitesConfig(StrictModel):
    """Which suites run next to the half-truth benchmark, and how large they are."""

    retrieval: bool = True  # Recall@k over the records' images and captions
    world_pairs: bool = True  # mirrored pairs + replace items (world records only)
    num_world_pairs: int = Field(200, ge=0)  # mirrored pairs, at most one per record
    num_replace_items: int = Field(200, ge=0)  # replace items, at most one per record
    seed: int = 0
    sugarcrepe_dir: str | None = None  # the SugarCrepe JSON files; None: not run
    coco_images: str | None = None  # COCO val2017 images (local dir or s3:// URI)

    @model_validator(mode="after")
    def _sugarcrepe_needs_images(self) -> SuitesConfig:
        if self.sugarcrepe_dir and not self.coco_images:
            raise ValueError(
                "suites.sugarcrepe_dir is set but suites.coco_images is not; "
                "point coco_images at the COCO val2017 images"
            )
        return self


def as_scorer(scorer_or_bundle: Scorer | ClipBundle, batch_size: int = 64) -> Scorer:
    """A ClipBundle wrapped in a BundleScorer; a Scorer as is."""
    if isinstance(scorer_or_bundle, ClipBundle):
        return BundleScorer(scorer_or_bundle, batch_size=batch_size)
    return scorer_or_bundle


# ---------------------------------------------------------------------------------------
# Scores: strict comparisons, a tie fails
# ---------------------------------------------------------------------------------------


def winoground_metrics(
    image_a_caption_a: np.ndarray,
    image_a_caption_b: np.ndarray,
    image_b_caption_a: np.ndarray,
    image_b_caption_b: np.ndarray,
) -> dict[str, float]:
    """Winoground's text / image / group scores in percent, from s(I_x, C_y) per pair.

    comp_i2t (text score): each image scores its own caption above the other caption.
    comp_t2i (image score): each caption scores its own image above the other image.
    comp_group: both hold. Strict: a tie is a failure.
    """
    text_ok = (image_a_caption_a > image_a_caption_b) & (image_b_caption_b > image_b_caption_a)
    image_ok = (image_a_caption_a > image_b_caption_a) & (image_b_caption_b > image_a_caption_b)
    if len(text_ok) == 0:
        return {"comp_num_pairs": 0.0}
    return {
        "comp_i2t": 100.0 * float(np.mean(text_ok)),
        "comp_t2i": 100.0 * float(np.mean(image_ok)),
        "comp_group": 100.0 * float(np.mean(text_ok & image_ok)),
        "comp_num_pairs": float(len(text_ok)),
    }


def strict_accuracy(positive: np.ndarray, negative: np.ndarray) -> float:
    """100 * mean[s(positive) > s(negative)]: a tie counts as wrong (as in SugarCrepe's
    official script)."""
    return 100.0 * float(np.mean(np.asarray(positive) > np.asarray(negative)))


# ---------------------------------------------------------------------------------------
# The world suites
# ---------------------------------------------------------------------------------------


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
    scorer: Scorer,
    records: Sequence[UnitsRecord],
    config: SuitesConfig | None = None,
    known: FeatureTables | None = None,
) -> dict[str, float]:
    """Mirrored pairs and replace items on the world records among `records` ({} when
    there are none); `known` features are reused."""
    config = config or SuitesConfig()
    world = [r for r in records if r.meta.get("scene")]
    if not world:
        return {}
    pairs = build_mirrored_pairs(world, config.seed, config.num_world_pairs)
    items = build_replace_items(world, config.seed, config.num_replace_items)
    texts = [t for p in pairs for t in (p.caption_a, p.caption_b)]
    texts += [t for i in items for t in (i.caption, i.foil_caption)]
    images = _pair_images(pairs)
    images.update(image_sources(world, [i.image_id for i in items]))
    features = extend_features(scorer, texts, images, known)
    metrics = {**world_pair_metrics(features, pairs), **replace_metrics(features, items)}
    log.info("world suites: %d mirrored pairs, %d replace items", len(pairs), len(items))
    return metrics


# ---------------------------------------------------------------------------------------
# All suites next to the half-truth benchmark
# ---------------------------------------------------------------------------------------


def evaluate_suites(
    scorer_or_bundle: Scorer | ClipBundle,
    records: Sequence[UnitsRecord],
    config: SuitesConfig | None = None,
    known: FeatureTables | None = None,
) -> dict[str, float]:
    """Retrieval (when the records have images), the world suites (world records) and
    SugarCrepe (when configured). Only measured metrics get a key."""
    config = config or SuitesConfig()
    scorer = as_scorer(scorer_or_bundle)
    metrics: dict[str, float] = {}
    has_images = bool(records) and all(r.image_bytes is not None or r.image_path for r in records)
    if config.retrieval and has_images:
        rset = retrieval_set(records)
        known = extend_features(scorer, rset.texts, image_sources(records, rset.image_ids), known)
        metrics.update(retrieval_metrics(known, rset))  # the world suites reuse `known`
    if config.world_pairs:
        metrics.update(evaluate_world_suites(scorer, records, config, known))
    if config.sugarcrepe_dir:
        metrics.update(evaluate_sugarcrepe(scorer, config.sugarcrepe_dir, config.coco_images))
    return metrics


# ---------------------------------------------------------------------------------------
# SugarCrepe (Hsieh et al. 2023): COCO val2017 images, a caption and a hard negative
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SugarCrepeItem:
    filename: str  # a COCO val2017 file name, e.g. "000000391895.jpg"
    caption: str
    negative_caption: str


def load_sugarcrepe(directory: str | Path) -> dict[str, list[SugarCrepeItem]]:
    """The subsets found in `directory` (`<subset>.json`, each a JSON object index ->
    {filename, caption, negative_caption}), items in index order.

    Raises DataError when the directory has no subset file or a file is malformed.
    """
    root = Path(directory)
    found = {s: root / f"{s}.json" for s in SUGARCREPE_SUBSETS if (root / f"{s}.json").is_file()}
    if not found:
        raise DataError(
            f"{root}: no SugarCrepe subset files ({', '.join(SUGARCREPE_SUBSETS)}.json); "
            "point suites.sugarcrepe_dir at the SugarCrepe data folder"
        )
    subsets: dict[str, list[SugarCrepeItem]] = {}
    for subset, path in found.items():
        try:
            data = json.loads(path.read_text())
            rows = sorted(data.items(), key=lambda kv: int(kv[0]))
            subsets[subset] = [
                SugarCrepeItem(row["filename"], row["caption"], row["negative_caption"])
                for _, row in rows
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(
                f"{path}: not a SugarCrepe file (expected index -> {{filename, caption, "
                f"negative_caption}}): {err!r}"
            ) from err
    return subsets


def _image_listing(image_root: str) -> tuple[str, set[str]]:
    """The root as a storage path and the file names directly under it."""
    from csclip.storage import filesystem_for, is_dir, list_files

    filesystem, path = filesystem_for(image_root)
    if not is_dir(filesystem, path):
        raise DataError(
            f"COCO image folder {image_root!r} does not exist; set suites.coco_images to the "
            "folder holding the val2017 images"
        )
    return path, {name.rsplit("/", 1)[-1] for name in list_files(filesystem, path)}


def evaluate_sugarcrepe(
    scorer_or_bundle: Scorer | ClipBundle,
    directory: str | Path,
    image_root: str,
    max_per_subset: int | None = None,
) -> dict[str, float]:
    """Per-subset I2T accuracy (caption vs negative_caption, strict: a tie is wrong, as in
    SugarCrepe's official script) and their mean, in percent.

    Keys: `sugarcrepe_<subset>`, `sugarcrepe_avg` (mean over subsets with items),
    `sugarcrepe_num_<subset>` (scored) and `sugarcrepe_skipped_<subset>` (image missing).
    An item whose image is not under `image_root` is skipped and counted.

    Raises DataError when `image_root` is missing or holds none of the images.
    """
    subsets = load_sugarcrepe(directory)
    if max_per_subset is not None:
        subsets = {s: items[:max_per_subset] for s, items in subsets.items()}
    root, present = _image_listing(image_root)
    kept = {s: [i for i in items if i.filename in present] for s, items in subsets.items()}
    skipped = {s: len(subsets[s]) - len(kept[s]) for s in subsets}
    if not any(kept.values()):
        raise DataError(
            f"none of the {sum(skipped.values())} SugarCrepe images is under {image_root!r}; "
            "point suites.coco_images at COCO val2017"
        )
    from csclip.storage import join

    scheme = "s3://" if image_root.startswith("s3://") else ""
    images = {i.filename: scheme + join(root, i.filename) for items in kept.values() for i in items}
    texts = [t for items in kept.values() for i in items for t in (i.caption, i.negative_caption)]
    features = encode_features(as_scorer(scorer_or_bundle), texts, images)
    metrics: dict[str, float] = {}
    for subset, items in kept.items():
        metrics[f"sugarcrepe_num_{subset}"] = float(len(items))
        metrics[f"sugarcrepe_skipped_{subset}"] = float(skipped[subset])
        if items:
            ids = [i.filename for i in items]
            metrics[f"sugarcrepe_{subset}"] = strict_accuracy(
                features.similarity(ids, [i.caption for i in items]),
                features.similarity(ids, [i.negative_caption for i in items]),
            )
    accuracies = [metrics[f"sugarcrepe_{s}"] for s in kept if f"sugarcrepe_{s}" in metrics]
    metrics["sugarcrepe_avg"] = float(np.mean(accuracies))
    summary = ", ".join(f"{s} {len(kept[s])} scored / {skipped[s]} skipped" for s in kept)
    if any(skipped.values()):
        log.warning("SugarCrepe: images missing under %s: %s", image_root, summary)
    else:
        log.info("SugarCrepe: %s", summary)
    return metrics

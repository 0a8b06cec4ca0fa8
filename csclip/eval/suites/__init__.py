"""Compositional suites (SPEC §5) next to the half-truth benchmark: one module per
benchmark family (world.py, sugarcrepe.py), shared scoring rules (rules.py), and
`evaluate_suites`, which adds them and retrieval to an evaluation's metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pydantic import Field, model_validator

from csclip.config import StrictModel
from csclip.eval.encoder import Encoder, image_sources
from csclip.eval.retrieval import retrieval_metrics, retrieval_set
from csclip.eval.suites.sugarcrepe import evaluate_sugarcrepe
from csclip.eval.suites.world import evaluate_world_suites
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)


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


def evaluate_suites(
    encoder: Encoder, records: Sequence[UnitsRecord], config: SuitesConfig | None = None
) -> dict[str, float]:
    """Retrieval (when the records have images), the world suites (world records) and
    SugarCrepe (when configured), encoded through `encoder` (its cache is shared with the
    half-truth benchmark). Only measured metrics get a key."""
    config = config or SuitesConfig()
    metrics: dict[str, float] = {}
    has_images = bool(records) and all(r.image_bytes is not None or r.image_path for r in records)
    if config.retrieval and has_images:
        rset = retrieval_set(records)
        features = encoder.features(rset.texts, image_sources(records, rset.image_ids))
        metrics.update(retrieval_metrics(features, rset))
    if config.world_pairs:
        metrics.update(evaluate_world_suites(encoder, records, config.seed, config.num_world_pairs,
                                             config.num_replace_items))
    if config.sugarcrepe_dir:
        metrics.update(evaluate_sugarcrepe(encoder, config.sugarcrepe_dir, config.coco_images))
    return metrics

"""Compositional suites (SPEC §5) next to the half-truth benchmark: the world's suites
(world.py), the real-data benchmarks by name (registry.py: one module per benchmark
family, found under --data-root in their published layouts), shared scoring (core.py,
rules.py), and `evaluate_suites`, which adds them, retrieval and zero-shot to an
evaluation's metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from csclip.config import StrictModel
from csclip.eval.encoder import Encoder
from csclip.eval.retrieval import (
    KARPATHY_LAYOUT,
    evaluate_karpathy,
    evaluate_retrieval,
)
from csclip.eval.suites.core import first_existing, join
from csclip.eval.suites.protocol import expand_paper_suite
from csclip.eval.suites.registry import BENCHMARKS, evaluate_benchmarks
from csclip.eval.suites.sugarcrepe import evaluate_sugarcrepe
from csclip.eval.suites.world import evaluate_world_suites
from csclip.eval.zeroshot import LAYOUT as ZEROSHOT_LAYOUT
from csclip.eval.zeroshot import evaluate_world_zeroshot, evaluate_zeroshot_datasets
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

# Suites that are not compositional benchmarks but are run by name the same way.
RETRIEVAL_SUITES = {"coco_retrieval": "coco", "flickr30k_retrieval": "flickr30k"}
ZEROSHOT_SUITE = "zeroshot"
SUITE_NAMES: tuple[str, ...] = (*sorted(BENCHMARKS), *RETRIEVAL_SUITES, ZEROSHOT_SUITE)


class SuitesConfig(StrictModel):
    """Which suites run next to the half-truth benchmark, and how large they are."""

    retrieval: bool = True  # Recall@k over the records' images and captions
    world_pairs: bool = True  # mirrored pairs + replace items (world records only)
    num_world_pairs: int = Field(200, ge=0)  # mirrored pairs, at most one per record
    num_replace_items: int = Field(200, ge=0)  # replace items, at most one per record
    world_zeroshot: bool = True  # zs_world_*: classify world objects (world records only)
    num_zeroshot_items: int = Field(500, ge=0)  # world zero-shot items, one per record
    seed: int = 0
    sugarcrepe_dir: str | None = None  # the SugarCrepe JSON files; None: not run
    coco_images: str | None = None  # COCO val2017 images (local dir or s3:// URI)
    # Real-data suites by name (SUITE_NAMES, or "paper": the paper's sixteen,
    # protocol.PAPER_SUITE), each read from <data_root>/<name>/ in its published layout
    # (docs/evaluation.md); a suite whose files are missing is skipped with one line
    # saying what it expects.
    names: tuple[str, ...] = ()
    data_root: str | None = None  # local folder or s3:// prefix
    max_items_per_subset: int | None = Field(None, ge=1)  # a quick look at large suites
    # A benchmark with a missing or unreadable image fails with one line naming its
    # layout; true scores the rest and counts those records as skipped (reported).
    allow_partial: bool = False
    # official: each benchmark's own scorer; paper: the CS-CLIP authors' (docs/evaluation.md).
    # Unset (None): "paper" with the suite "paper" (set on validation), else "official".
    protocol: Literal["official", "paper"] | None = None

    @property
    def scoring_protocol(self) -> str:
        """The protocol the named suites are scored with."""
        return self.protocol or "official"

    @model_validator(mode="before")
    @classmethod
    def _paper_suite(cls, values):
        return expand_paper_suite(values)

    @field_validator("names", mode="before")
    @classmethod
    def _split_names(cls, value):
        if isinstance(value, str):  # --set suites.names=aro,winoground
            value = [v.strip() for v in value.split(",") if v.strip()]
        return value

    @model_validator(mode="after")
    def _check(self) -> SuitesConfig:
        if self.sugarcrepe_dir and not self.coco_images:
            raise ValueError(
                "suites.sugarcrepe_dir is set but suites.coco_images is not; "
                "point coco_images at the COCO val2017 images"
            )
        unknown = [n for n in self.names if n not in SUITE_NAMES]
        if unknown:
            raise ValueError(f"unknown suites {unknown}; choose from {', '.join(SUITE_NAMES)} "
                             "or paper (the paper's sixteen)")
        if self.names and not self.data_root:
            raise ValueError("suites.names needs suites.data_root (--data-root): the folder "
                             "holding one sub-folder per suite")
        return self


def evaluate_suites(
    encoder: Encoder, records: Sequence[UnitsRecord], config: SuitesConfig | None = None
) -> dict[str, float]:
    """Retrieval (when the records have images), the world suites and world zero-shot
    (world records), SugarCrepe (sugarcrepe_dir) and the named real-data suites, encoded
    through `encoder` (its cache is shared with the half-truth benchmark). Only measured
    metrics get a key."""
    config = config or SuitesConfig()
    metrics: dict[str, float] = {}
    has_images = bool(records) and all(r.image_bytes is not None or r.image_path for r in records)
    if config.retrieval and has_images:
        metrics.update(evaluate_retrieval(encoder, records))
    if config.world_pairs:
        metrics.update(evaluate_world_suites(encoder, records, config.seed, config.num_world_pairs,
                                             config.num_replace_items))
    if config.world_zeroshot and config.num_zeroshot_items:
        metrics.update(evaluate_world_zeroshot(encoder, records, config.seed,
                                               config.num_zeroshot_items))
    if config.sugarcrepe_dir:
        metrics.update(evaluate_sugarcrepe(encoder, config.sugarcrepe_dir, config.coco_images,
                                           config.max_items_per_subset, config.allow_partial))
    if config.names:
        metrics.update(evaluate_named_suites(encoder, config))
    return metrics


def evaluate_named_suites(encoder: Encoder, config: SuitesConfig) -> dict[str, float]:
    """The suites of config.names under config.data_root; a missing one is one warning."""
    root = config.data_root
    benchmarks = [n for n in config.names if n in BENCHMARKS]
    metrics = evaluate_benchmarks(encoder, benchmarks, root, config.max_items_per_subset,
                                  config.allow_partial, config.scoring_protocol
                                  ) if benchmarks else {}
    for name, dataset in RETRIEVAL_SUITES.items():
        if name not in config.names:
            continue
        folder = join(root, dataset)
        json_uri = first_existing(folder, f"dataset_{dataset}.json")
        images = first_existing(folder, "flickr30k-images", "images") if dataset == "flickr30k" \
            else folder
        if json_uri is None or images is None:
            log.warning("%s: not found under %s (expects %s); skipped", name, folder,
                        KARPATHY_LAYOUT[dataset])
            continue
        metrics.update(evaluate_karpathy(encoder, dataset, json_uri, images))
    if ZEROSHOT_SUITE in config.names:
        folder = join(root, ZEROSHOT_SUITE)
        if first_existing(root, ZEROSHOT_SUITE) is None:
            log.warning("zeroshot: not found under %s (expects %s); skipped", folder,
                        ZEROSHOT_LAYOUT)
        else:
            metrics.update(evaluate_zeroshot_datasets(encoder, folder))
    return metrics

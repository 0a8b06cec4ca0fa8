"""The prepared benchmark and its scores: BenchmarkConfig (the seed lives here only), the
items for a protocol, and their scores from an Encoder's features."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from csclip.config.eval import BenchmarkConfig
from csclip.errors import DataError
from csclip.eval.encoder import FeatureTables, ImageSource, image_sources
from csclip.eval.halftruth.construction import build_half_truth_benchmark
from csclip.eval.halftruth.image_side import ImageSideItem, build_image_side_benchmark
from csclip.eval.halftruth.items import HalfTruthBenchmark, HalfTruthItem, Protocol
from csclip.eval.halftruth.metrics import ItemScores
from csclip.eval.halftruth.paper import build_paper_benchmark, verbatim_from_units
from csclip.eval.halftruth.table import load_benchmark
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)




@dataclass(frozen=True)
class PreparedBenchmark:
    """A benchmark with the image bytes it needs: built once, scored by many models."""

    benchmark: HalfTruthBenchmark
    image_side: tuple[ImageSideItem, ...]
    images: dict[str, ImageSource]  # bytes, or a URI read when encoded

    @property
    def texts(self) -> list[str]:
        return benchmark_texts(self.benchmark.items, self.image_side)


def prepare_benchmark(
    records: Sequence[UnitsRecord], config: BenchmarkConfig | None = None
) -> PreparedBenchmark:
    """Build the half-truth (and image-side) benchmark, or load config.table_uri, and
    collect its image sources.

    Raises DataError for no records, no usable items, or an image missing from `records`.
    """
    config = config or BenchmarkConfig()
    seed = config.seed
    if config.table_uri:
        items = tuple(load_benchmark(config.table_uri))
        num_images = len({item.image_id for item in items})
        protocol = resolve_protocol(config.protocol, records)
        benchmark = HalfTruthBenchmark(items, {}, num_images, len(records), protocol)
    else:
        benchmark = build_for_protocol(records, config)
    if not benchmark.items:
        reasons = ", ".join(f"{c}/{r}: {n}" for (c, r), n in benchmark.skipped.items())
        raise DataError(
            f"half-truth benchmark: {benchmark.num_images} images gave no items "
            f"(skips: {reasons}); units need foils and images"
        )
    side: list[ImageSideItem] = []
    if config.image_side:
        # 2-5 distractor images per item (SPEC §4), the builder's defaults.
        side = build_image_side_benchmark(records, seed)
    image_ids = [i.image_id for i in benchmark.items]
    image_ids += [image_id for item in side for image_id in (item.image_id, *item.distractors)]
    images = image_sources(records, image_ids)
    log.info(
        "half-truth benchmark (protocol %s, %s): %d images, %d items, %d image-side items, "
        "skips %s",
        benchmark.protocol,
        benchmark.content_hash,
        benchmark.num_images,
        len(benchmark.items),
        len(side),
        dict(benchmark.skipped),
    )
    return PreparedBenchmark(benchmark, tuple(side), images)


def resolve_protocol(protocol: str, records: Sequence[UnitsRecord]) -> str:
    """`auto` -> csclip when every record is the synthetic world's (source "gold"), else
    paper; `paper` and `csclip` as given."""
    if protocol != "auto":
        return Protocol(protocol).value
    is_world = bool(records) and all(r.source == "gold" for r in records)
    return (Protocol.CSCLIP if is_world else Protocol.PAPER).value


def build_for_protocol(
    records: Sequence[UnitsRecord], config: BenchmarkConfig
) -> HalfTruthBenchmark:
    """The half-truth benchmark of `records` under config.protocol (resolved)."""
    if resolve_protocol(config.protocol, records) == Protocol.PAPER:
        return build_paper_benchmark(
            [verbatim_from_units(r) for r in records], config.num_samples, config.paper_seed
        )
    return build_half_truth_benchmark(records, config.seed)


def benchmark_texts(
    items: Sequence[HalfTruthItem], image_side: Sequence[ImageSideItem] = ()
) -> list[str]:
    texts = [t for item in items for t in (item.anchor, item.completion, item.half_truth)]
    return texts + [item.text for item in image_side]


def score_items(features: FeatureTables, items: Sequence[HalfTruthItem]) -> ItemScores:
    """s(I, A), s(I, A+), s(I, A-) of every item from precomputed features."""
    image_ids = [item.image_id for item in items]
    return ItemScores(
        features.similarity(image_ids, [i.anchor for i in items]),
        features.similarity(image_ids, [i.completion for i in items]),
        features.similarity(image_ids, [i.half_truth for i in items]),
    )


def score_image_side(
    features: FeatureTables, items: Sequence[ImageSideItem]
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Scores of each image-side text with its target image and with its distractors."""
    target = features.similarity([i.image_id for i in items], [i.text for i in items])
    distractors = [
        features.similarity(list(i.distractors), [i.text] * len(i.distractors)) for i in items
    ]
    return target, distractors

"""SPEC §4 half-truth benchmark: its construction under two protocols (`paper`: the
authors' builder item for item; `csclip`: ours, seeded per image), the shareable benchmark
table (Parquet / CSV) and the metrics (Acc_HT, Δ, win rate, consistency, bootstrap CIs;
image-side top-1 / MRR / margin), and its scoring from an Encoder's features. Every
half-truth condition is defined here (items.py) and nowhere else. Pure: no ray.

One module per part, everything importable from here: items.py (conditions, items, skip
reasons, content hash), construction.py (protocol `csclip`), paper.py (protocol `paper`),
table.py (the benchmark table), metrics.py, image_side.py, prepare.py (BenchmarkConfig,
the prepared benchmark, scoring)."""

from __future__ import annotations

from csclip.config.eval import PAPER_NUM_SAMPLES, PAPER_SEED, BenchmarkConfig
from csclip.eval.halftruth.construction import (
    RELATION_SLUGS,
    build_benchmark,
    build_half_truth_benchmark,
    entity_may_hold,
    stable_rng,
)
from csclip.eval.halftruth.image_side import (
    ImageSideItem,
    build_image_side_benchmark,
    image_side_metrics,
)
from csclip.eval.halftruth.items import (
    ALL_CONDITIONS,
    CONDITION_BY_SLUG,
    CONDITIONS,
    EXTRA_CONDITIONS,
    GROUPS,
    Condition,
    HalfTruthBenchmark,
    HalfTruthItem,
    Protocol,
    SkipReason,
    benchmark_hash,
)
from csclip.eval.halftruth.metrics import ItemScores, bootstrap_ci, half_truth_metrics
from csclip.eval.halftruth.paper import build_paper_benchmark, is_valid_caption, verbatim_from_units
from csclip.eval.halftruth.prepare import (
    PreparedBenchmark,
    benchmark_texts,
    build_for_protocol,
    prepare_benchmark,
    resolve_protocol,
    score_image_side,
    score_items,
)
from csclip.eval.halftruth.table import (
    BENCHMARK_SCHEMA,
    items_to_table,
    load_benchmark,
    save_benchmark,
    table_to_items,
)

__all__ = ["ALL_CONDITIONS", "BENCHMARK_SCHEMA", "BenchmarkConfig", "CONDITIONS",
    "CONDITION_BY_SLUG", "Condition", "EXTRA_CONDITIONS", "GROUPS", "HalfTruthBenchmark",
    "HalfTruthItem", "ImageSideItem", "ItemScores", "PAPER_NUM_SAMPLES", "PAPER_SEED",
    "PreparedBenchmark", "Protocol", "RELATION_SLUGS", "SkipReason", "benchmark_hash",
    "benchmark_texts", "bootstrap_ci", "build_benchmark", "build_for_protocol",
    "build_half_truth_benchmark", "build_image_side_benchmark", "build_paper_benchmark",
    "entity_may_hold", "half_truth_metrics", "image_side_metrics", "is_valid_caption",
    "items_to_table", "load_benchmark", "prepare_benchmark", "resolve_protocol",
    "save_benchmark", "score_image_side", "score_items", "stable_rng", "table_to_items",
    "verbatim_from_units"]

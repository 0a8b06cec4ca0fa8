"""Compositional suites (SPEC §5) next to the half-truth benchmark: the world's suites
(world.py), the real-data benchmarks by name (registry.py: one module per benchmark
family, found under --data-root in their published layouts), shared scoring (core.py,
rules.py), and `evaluate_suites`, which adds them, retrieval (Karpathy splits, webdataset
shards) and zero-shot to an evaluation's metrics."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from csclip.config.eval import (
    RETRIEVAL_SUITES,
    ZEROSHOT_PAPER_SUITE,
    ZEROSHOT_SUITE,
    SuitesConfig,
)
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.retrieval import KARPATHY_LAYOUT, evaluate_karpathy, evaluate_retrieval
from csclip.eval.shards import evaluate_shard_retrieval
from csclip.eval.suites.core import SuiteData, first_existing, join, listing
from csclip.eval.suites.registry import BENCHMARKS, evaluate_benchmarks, load_present_benchmarks
from csclip.eval.suites.sugarcrepe import evaluate_sugarcrepe
from csclip.eval.suites.world import evaluate_world_suites
from csclip.eval.zeroshot import LAYOUT as ZEROSHOT_LAYOUT
from csclip.eval.zeroshot import evaluate_world_zeroshot, evaluate_zeroshot_datasets
from csclip.eval.zeroshot_paper import LAYOUT as ZEROSHOT_PAPER_LAYOUT
from csclip.eval.zeroshot_paper import PAPER_DATASETS, evaluate_paper_zeroshot, find_paper_datasets
from csclip.units import UnitsRecord

__all__ = ["MAX_MISSING_SHOWN", "RETRIEVAL_FILES", "NamedSuites", "evaluate_named_suites",
           "evaluate_suites", "find_named_suites", "paper_retrieval"]

log = logging.getLogger(__name__)

# Where each retrieval suite's captions and images are, first match first (under
# <data_root>/<dataset>/): (caption files, image folders). A .txt is CLIP_benchmark's.
RETRIEVAL_FILES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "coco": (("dataset_coco.json",), ("",)),
    "flickr30k": (("dataset_flickr30k.json",), ("flickr30k-images", "images")),
    "flickr8k": (("flickr8k_test_karpathy.txt", "dataset_flickr8k.json"),
                 ("Images", "Flicker8k_Dataset", "images", "")),
}


def evaluate_suites(
    encoder: Encoder, records: Sequence[UnitsRecord], config: SuitesConfig | None = None,
    found: NamedSuites | None = None, seed: int = 0,
) -> dict[str, float]:
    """Retrieval (when the records have images), the world suites and world zero-shot
    (world records; their draws seeded by `seed`, the evaluation's benchmark.seed), SugarCrepe (sugarcrepe_dir), the named real-data suites (`found`:
    find_named_suites' result, read once before the models) and retrieval over shards
    (retrieval_shards), encoded through `encoder` (its cache is shared with the half-truth
    benchmark). Only measured metrics get a key."""
    config = config or SuitesConfig()
    metrics: dict[str, float] = {}
    has_images = bool(records) and all(r.image_bytes is not None or r.image_path for r in records)
    if config.retrieval and has_images:
        metrics.update(evaluate_retrieval(encoder, records, counting=config.retrieval_rule))
    if config.num_world_pairs:
        metrics.update(evaluate_world_suites(encoder, records, seed, config.num_world_pairs,
                                             config.num_world_pairs))
    if config.num_zeroshot_items:
        metrics.update(evaluate_world_zeroshot(encoder, records, seed,
                                               config.num_zeroshot_items))
    if config.sugarcrepe_dir:
        metrics.update(evaluate_sugarcrepe(encoder, config.sugarcrepe_dir, config.coco_images,
                                           config.max_items_per_subset, config.allow_partial))
    if config.names or config.retrieval_shards:
        metrics.update(evaluate_named_suites(encoder, config, found))
    return metrics


@dataclass(frozen=True)
class NamedSuites:
    """The suites of SuitesConfig.names as found under data_root (find_named_suites): the
    benchmarks loaded, each retrieval suite's (caption file, image folder), the zero-shot
    folder, the paper's zero-shot datasets found ({name: folder}), and one "<name>: not
    found under ... (expects ...)" line per missing suite."""

    benchmarks: dict[str, SuiteData]
    retrieval: dict[str, tuple[str, str]]
    zeroshot: str | None
    missing: dict[str, str]  # suite name -> what was expected where
    num_benchmarks_asked: int  # of BENCHMARKS (the suite average's denominator)
    zeroshot_paper: dict[str, str] | None = None  # None: zeroshot_paper not asked


MAX_MISSING_SHOWN = 3  # missing suites whose layout the error line spells out


def find_named_suites(config: SuitesConfig, refuse_missing: bool = False) -> NamedSuites:
    """Find and load the suites of config.names under config.data_root, before any model
    is loaded. refuse_missing (csclip evaluate): a missing suite raises a DataError (one
    line: the layout expected and what is under the root) unless config.allow_missing;
    otherwise each missing one is a warning line and skipped."""
    root = config.data_root or ""
    asked = [n for n in config.names if n in BENCHMARKS]
    benchmarks, not_found = load_present_benchmarks(asked, root, config.allow_partial,
                                                    config.scoring_protocol) if asked else ({}, {})
    missing = {name: str(err) for name, err in not_found.items()}
    retrieval: dict[str, tuple[str, str]] = {}
    for name, dataset in RETRIEVAL_SUITES.items():
        if name not in config.names:
            continue
        folder = join(root, dataset)
        caption_files, image_folders = RETRIEVAL_FILES[dataset]
        json_uri = first_existing(folder, *caption_files)
        images = first_existing(folder, *image_folders)
        if json_uri is None or images is None:
            missing[name] = f"{name}: not found under {folder} (expects {KARPATHY_LAYOUT[dataset]})"
        else:
            retrieval[name] = (json_uri, images)
    zeroshot = None
    if ZEROSHOT_SUITE in config.names:
        zeroshot = join(root, ZEROSHOT_SUITE)
        if first_existing(root, ZEROSHOT_SUITE) is None:
            missing[ZEROSHOT_SUITE] = (f"zeroshot: not found under {zeroshot} (expects "
                                       f"{ZEROSHOT_LAYOUT})")
            zeroshot = None
    zeroshot_paper = None
    if ZEROSHOT_PAPER_SUITE in config.names:
        zeroshot_paper, not_there = find_paper_datasets(join(root, ZEROSHOT_PAPER_SUITE))
        folder = join(root, ZEROSHOT_PAPER_SUITE)
        if not zeroshot_paper:
            missing[ZEROSHOT_PAPER_SUITE] = (f"zeroshot_paper: not found under {folder} (expects "
                                             f"{ZEROSHOT_PAPER_LAYOUT})")
        elif not_there:
            missing[ZEROSHOT_PAPER_SUITE] = (
                f"zeroshot_paper: {len(not_there)} of {len(PAPER_DATASETS)} datasets not found "
                f"under {folder}: {'; '.join(not_there.values())}")
    if missing and refuse_missing and not config.allow_missing:
        raise DataError(_missing_line(missing, len(config.names), root))
    for line in missing.values():
        log.warning("%s; skipped", line)
    return NamedSuites(benchmarks, retrieval, zeroshot, missing, len(asked), zeroshot_paper)


def _missing_line(missing: dict[str, str], num_asked: int, root: str) -> str:
    """One line: which named suites are not under `root`, the layout each expects (the
    first few), and what is there."""
    shown = list(missing.values())[:MAX_MISSING_SHOWN]
    more = len(missing) - len(shown)
    rest = f"; and {', '.join(list(missing)[len(shown):])} (docs/evaluation.md)" if more else ""
    return (f"--suite: {len(missing)} of {num_asked} named suites not found under --data-root "
            f"{root}: {'; '.join(shown)}{rest}; found under {root}: {listing(root)}; fix "
            "--data-root, or pass --allow-missing (suites.allow_missing=true) to score the "
            "suites that are there")


def evaluate_named_suites(encoder: Encoder, config: SuitesConfig,
                          found: NamedSuites | None = None) -> dict[str, float]:
    """The suites of config.names under config.data_root (`found`, or find_named_suites
    now: a missing one is one warning) and retrieval over the shards of
    config.retrieval_shards, under the keys of that dataset's retrieval suite
    (`coco_ret_*`; the paper's Retr mean over COCO and Flickr8k from either). With
    benchmarks named: `suite_benchmarks_asked` and `suite_benchmarks_found`, the k of n
    the suite average is over."""
    found = found or find_named_suites(config)
    asked = [n for n in config.names if n in BENCHMARKS]
    metrics = evaluate_benchmarks(encoder, asked, config.data_root or "",
                                  config.max_items_per_subset, config.allow_partial,
                                  config.scoring_protocol, loaded=found.benchmarks
                                  ) if asked else {}
    if found.num_benchmarks_asked:
        metrics["suite_benchmarks_asked"] = float(found.num_benchmarks_asked)
        metrics["suite_benchmarks_found"] = float(len(found.benchmarks))
    for name, (json_uri, images) in found.retrieval.items():
        metrics.update(evaluate_karpathy(encoder, RETRIEVAL_SUITES[name], json_uri, images,
                                         counting=config.retrieval_rule))
    for dataset, source in config.retrieval_shards.items():
        metrics.update(evaluate_shard_retrieval(encoder, source, dataset,
                                                counting=config.retrieval_rule))
    metrics.update(paper_retrieval(metrics))
    if found.zeroshot is not None:
        metrics.update(evaluate_zeroshot_datasets(encoder, found.zeroshot))
    if found.zeroshot_paper:
        metrics.update(evaluate_paper_zeroshot(encoder, found.zeroshot_paper))
    return metrics


def paper_retrieval(metrics: dict[str, float]) -> dict[str, float]:
    """The paper's Retr columns (Tables 16-17): `ret_paper_i2t` / `ret_paper_t2i`, the mean
    R@1 of COCO and Flickr8k (the authors' I2T is CLIP_benchmark's text_retrieval_recall@1,
    image -> text), when both ran; else {}."""
    out = {}
    for direction in ("i2t", "t2i"):
        keys = (f"coco_ret_{direction}", f"flickr8k_ret_{direction}")
        if all(k in metrics for k in keys):
            out[f"ret_paper_{direction}"] = (metrics[keys[0]] + metrics[keys[1]]) / 2
    return out

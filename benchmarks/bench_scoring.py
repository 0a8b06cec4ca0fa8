"""Half-truth scoring throughput: the batched scorer (unique texts and images encoded once,
in batches) against scoring one image and one text at a time, on the same model.

    .venv/bin/python benchmarks/bench_scoring.py                 # print the table
    .venv/bin/python benchmarks/bench_scoring.py --write-docs    # also update docs/performance.md
    .venv/bin/python benchmarks/bench_scoring.py --model csclip-small --images 100

Pairs are the (image, text) similarities the metrics need: three per item (A, A+, A-).
The baseline encodes the image and the text of every pair separately (batch of one),
which is what a naive loop over the benchmark table does. Both run in this process on
world validation images, one thread, CPU time, so neighbours on a shared machine move the
numbers little. The baseline runs on the first --baseline-items items only (it is slow);
rates are per pair, so the ratio is fair.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch
from perfdoc import publish  # benchmarks/perfdoc.py (scripts run from benchmarks/)

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Half-truth scoring (benchmarks/bench_scoring.py)"


def measure(model: str, num_images: int, baseline_items: int, batch_size: int) -> dict[str, float]:
    from csclip.config.world import WorldConfig
    from csclip.eval.encoder import BundleScorer, encode_features, load_image
    from csclip.eval.halftruth import BenchmarkConfig, prepare_benchmark, score_items
    from csclip.model import create_bundle
    from csclip.world import iter_world

    records = list(
        iter_world(WorldConfig(num_train=0, num_val=num_images, num_test=0), splits=("val",))
    )
    prepared = prepare_benchmark(records, BenchmarkConfig(image_side=False))
    items = prepared.benchmark.items
    scorer = BundleScorer(create_bundle(model), batch_size=batch_size)
    scorer.encode_texts(["warm up"])  # first-call allocations are not what we measure

    start = time.process_time()
    batched = score_items(encode_features(scorer, prepared.texts, prepared.images), items)
    batched_seconds = time.process_time() - start

    subset = items[:baseline_items]
    start = time.process_time()
    naive = []
    for item in subset:
        for text in (item.anchor, item.completion, item.half_truth):
            image = scorer.encode_images([load_image(prepared.images[item.image_id])])[0]
            naive.append(float(image @ scorer.encode_texts([text])[0]))
    naive_seconds = time.process_time() - start
    expected = np.stack([batched.anchor, batched.completion, batched.half_truth], 1)[
        : len(subset)
    ].ravel()
    # Same model, same pairs: the fast path must give the same scores (batch order aside).
    max_diff = float(np.abs(np.array(naive) - expected).max())
    return {
        "images": len(prepared.images),
        "items": len(items),
        "pairs": 3 * len(items),
        "unique_texts": len(set(prepared.texts)),
        "batched_s": batched_seconds,
        "batched_pairs_per_s": 3 * len(items) / batched_seconds,
        "naive_pairs": 3 * len(subset),
        "naive_s": naive_seconds,
        "naive_pairs_per_s": 3 * len(subset) / naive_seconds,
        "max_abs_diff": max_diff,
    }



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="csclip-tiny,csclip-small", help="comma-separated")
    parser.add_argument("--images", type=int, default=100, help="world validation images")
    parser.add_argument("--baseline-items", type=int, default=100, help="items the baseline scores")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, diffs, m = [], [], {}
    for model in args.models.split(","):
        print(f"scoring {args.images} world images with {model} ...", file=sys.stderr, flush=True)
        m = measure(model, args.images, args.baseline_items, args.batch_size)
        ratio = m["batched_pairs_per_s"] / m["naive_pairs_per_s"]
        rows += [
            f"| {model} | one image + one text at a time (baseline) | {m['naive_pairs']} | "
            f"{m['naive_s']:.2f} | {m['naive_pairs_per_s']:.0f} | 1.0x |",
            f"| {model} | batched, unique texts / images once | {m['pairs']} | "
            f"{m['batched_s']:.2f} | {m['batched_pairs_per_s']:.0f} | {ratio:.1f}x |",
        ]
        diffs.append(f"{model} {m['max_abs_diff']:.1e}")
    command = "python benchmarks/bench_scoring.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    section = "\n".join(
        [
            SECTION,
            "",
            f"Command: `{command.strip()}` ({platform.processor() or platform.machine()}, torch "
            f"{torch.__version__}, 1 thread, CPU time). Random weights, {m['images']} world "
            f"validation images, {m['items']} items = {m['pairs']} (image, text) pairs, "
            f"{m['unique_texts']} unique texts, batch {args.batch_size}.",
            "",
            "| model | scorer | pairs | CPU s | pairs/s | ratio |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Largest score difference between the two paths: {', '.join(diffs)} (float32 "
            "summation order differs with batch size). The batched path wins twice: each of the "
            "texts is encoded once instead of once per pair (anchors repeat across conditions, "
            "each image is shared by its 8 items), and encoders run on batches instead of "
            "single rows.",
            "",
        ]
    )
    publish(SECTION, section, args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

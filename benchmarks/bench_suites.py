"""Cost of the retrieval and compositional suites next to the half-truth benchmark: the
suites reusing the benchmark's features (what evaluate_bundle does) and encoding
everything afresh, each as a ratio of the half-truth scoring time in the same run.

    .venv/bin/python benchmarks/bench_suites.py                 # print the table
    .venv/bin/python benchmarks/bench_suites.py --write-docs    # also update docs/performance.md
    .venv/bin/python benchmarks/bench_suites.py --checkpoint runs/train/<run>/final

One thread, CPU time, world validation images, so neighbours on a shared machine move the
numbers little. Also prints the suites' metrics (random weights unless --checkpoint).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

import torch
from perfdoc import publish  # benchmarks/perfdoc.py (scripts run from benchmarks/)

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Compositional suites and retrieval (benchmarks/bench_suites.py)"
SHOWN = ("comp_i2t", "comp_t2i", "comp_group", "comp_i2t_replace", "ret_i2t", "ret_t2i",
         "ret_i2t_r10", "ret_t2i_r10")  # fmt: skip


def measure(model: str, num_images: int, checkpoint: str | None) -> dict:
    from csclip.config.eval import SuitesConfig
    from csclip.config.world import WorldConfig
    from csclip.eval.encoder import BundleScorer, Encoder
    from csclip.eval.halftruth import BenchmarkConfig, prepare_benchmark
    from csclip.eval.pipeline import evaluate_encoder
    from csclip.eval.suites import evaluate_suites
    from csclip.model import create_bundle, load_bundle
    from csclip.world import iter_world

    records = list(
        iter_world(WorldConfig(num_train=0, num_val=num_images, num_test=0), splits=("val",))
    )
    bundle = load_bundle(checkpoint) if checkpoint else create_bundle(model)
    scorer = BundleScorer(bundle)
    scorer.encode_texts(["warm up"])  # first-call allocations are not what we measure
    config = BenchmarkConfig(num_bootstrap=0)
    suites = SuitesConfig()

    start = time.process_time()
    prepared = prepare_benchmark(records, config)
    encoder = Encoder(scorer)
    evaluate_encoder(model, encoder, prepared, records, config)
    halftruth_s = time.process_time() - start

    start = time.process_time()
    reused = evaluate_suites(encoder, records, suites)  # the benchmark's cache is reused
    reused_s = time.process_time() - start

    start = time.process_time()
    fresh = evaluate_suites(Encoder(scorer), records, suites)
    fresh_s = time.process_time() - start
    # Same model, same items: reuse must not change a number.
    assert all(abs(reused[k] - fresh[k]) < 1e-9 for k in reused), "reuse changed a metric"
    return {"halftruth_s": halftruth_s, "reused_s": reused_s, "fresh_s": fresh_s,
            "metrics": reused}  # fmt: skip



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="csclip-tiny")
    parser.add_argument("--checkpoint", help="score a trained checkpoint instead")
    parser.add_argument("--images", type=int, default=100, help="world validation images")
    parser.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    label = args.checkpoint or f"{args.model} (random weights)"
    print(f"{label}: {args.images} world images ...", file=sys.stderr, flush=True)
    m = measure(args.model, args.images, args.checkpoint)
    metrics = m["metrics"]
    base = m["halftruth_s"]
    command = "python benchmarks/bench_suites.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    section = "\n".join(
        [
            SECTION,
            "",
            f"Command: `{command.strip()}` ({platform.processor() or platform.machine()}, torch "
            f"{torch.__version__}, 1 thread, CPU time). {label}, {args.images} world "
            f"validation images: {int(metrics['comp_num_pairs'])} mirrored pairs, "
            f"{int(metrics['comp_num_replace_items'])} replace items, retrieval over "
            f"{int(metrics['ret_num_images'])} images and {int(metrics['ret_num_texts'])} "
            "captions.",
            "",
            "| step | CPU s | ratio to half-truth scoring |",
            "|---|---|---|",
            f"| half-truth benchmark: build + encode + metrics (baseline) | {base:.2f} | 1.00x |",
            f"| suites, reusing the benchmark's features | {m['reused_s']:.2f} | "
            f"{m['reused_s'] / base:.2f}x |",
            f"| suites, encoding everything afresh | {m['fresh_s']:.2f} | "
            f"{m['fresh_s'] / base:.2f}x |",
            "",
            "Metrics (%): " + ", ".join(f"{k} {metrics[k]:.1f}" for k in SHOWN if k in metrics)
            + ". Reuse saves the record images and captions the benchmark already encoded; "
            "the mirrored images and pair captions are new either way.",
            "",
        ]
    )
    publish(SECTION, section, args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

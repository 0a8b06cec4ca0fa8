"""Cost of the CS-CLIP losses and of the text-slot sampler, as ratios to baselines run in
the same command.

    .venv/bin/python benchmarks/bench_loss.py               # print the table
    .venv/bin/python benchmarks/bench_loss.py --write-docs  # also update docs/performance.md

Losses: forward + backward of our losses on random L2-normalised features, against
open_clip's `ClipLoss` on the same batch (the baseline every CLIP trainer pays). Sampler:
`sample_text_columns` on world records, against open_clip's tokenizer on the texts it
produces (the step that follows it in every training batch). One thread, CPU time, median
of repeats, so neighbours on a shared machine move the numbers little.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from perfdoc import publish  # benchmarks/perfdoc.py (scripts run from benchmarks/)

REPO_ROOT = Path(__file__).resolve().parents[1]
SECTION = "## Losses and text sampling (benchmarks/bench_loss.py)"


def cpu_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median CPU seconds of `fn` over `repeats` runs, after one warm-up run."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def loss_rows(batch: int, dim: int, slots: int, repeats: int) -> list[tuple[str, float]]:
    from open_clip.loss import ClipLoss

    from csclip.loss import clip_loss, csclip_loss, negclip_loss

    generator = torch.Generator().manual_seed(0)

    def leaf(*shape: int) -> torch.Tensor:
        return F.normalize(torch.randn(*shape, generator=generator), dim=-1).requires_grad_(True)

    image, caption, negative = leaf(batch, dim), leaf(batch, dim), leaf(batch, dim)
    units, foils = leaf(slots, batch, dim), leaf(slots, batch, dim)
    mask = torch.rand(batch, generator=generator) > 0.1   # ~10% samples without units
    scale = torch.tensor(14.3, requires_grad=True)
    reference = ClipLoss()
    cases = {
        "open_clip ClipLoss (baseline)": lambda: reference(image, caption, scale),
        "clip_loss": lambda: clip_loss(image, caption, scale),
        "negclip_loss (L_full)": lambda: negclip_loss(image, caption, negative, scale),
        f"csclip_loss (L_full + L_unit, N={slots})": lambda: csclip_loss(
            image, caption, negative, units, foils, mask, scale).total,
    }
    return [(name, cpu_seconds(lambda f=f: f().backward(), repeats)) for name, f in cases.items()]


def sampler_rows(num_records: int, slots: int, repeats: int) -> list[tuple[str, float]]:
    import open_clip

    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.train.sampling import sample_text_columns
    from csclip.world import iter_world

    world = WorldConfig(seed=0, num_train=num_records, num_val=0, num_test=0)
    records = list(iter_world(world, splits=("train",)))
    config = SamplingConfig(num_unit_slots=slots)
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    columns = sample_text_columns(records, config, seed=0, epoch=0)
    texts = [t for name, values in columns.items() if not name.endswith("_mask") for t in values]
    return [
        ("open_clip tokenizer on the sampled texts (baseline)",
         cpu_seconds(lambda: tokenizer(texts), repeats)),
        (f"sample_text_columns (N={slots})",
         cpu_seconds(lambda: sample_text_columns(records, config, seed=0, epoch=1), repeats)),
    ]


def table(title: str, rows: list[tuple[str, float]], per: int, unit: str) -> list[str]:
    base = rows[0][1]
    lines = [f"**{title}**", "", f"| what | {unit} | vs baseline |", "|---|---:|---:|"]
    for name, seconds in rows:
        lines.append(f"| {name} | {seconds / per * 1e6:.1f} | {seconds / base:.2f} |")
    return lines + [""]



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256, help="global batch of the losses")
    parser.add_argument("--dim", type=int, default=512, help="embedding width (ViT-B/32: 512)")
    parser.add_argument("--slots", type=int, default=2, help="N unit slots")
    parser.add_argument("--records", type=int, default=500, help="world records to sample")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--write-docs", action="store_true", help="update docs/performance.md")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("timing losses ...", file=sys.stderr, flush=True)
    losses = loss_rows(args.batch, args.dim, args.slots, args.repeats)
    print("timing sampler ...", file=sys.stderr, flush=True)
    sampler = sampler_rows(args.records, args.slots, args.repeats)
    command = "python benchmarks/bench_loss.py " + " ".join(argv or sys.argv[1:])
    lines = [SECTION, "",
             f"Command: `{command.strip()}` ({platform.processor() or platform.machine()}, "
             f"torch {torch.__version__}, 1 thread, CPU time, median of {args.repeats}).", "",
             *table(f"Loss forward + backward, batch {args.batch}, width {args.dim}",
                    losses, 1, "µs per step"),
             *table(f"Text sampling, {args.records} world records",
                    sampler, args.records, "µs per sample")]
    section = "\n".join(lines)
    publish(SECTION, section, args.write_docs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The training step without the text tower's padding (run.trim_text), with fused AdamW
(optim.fused) and with a locked image tower's features kept (run.locked_image_cache_mb)
against the step before them (full context, foreach AdamW), in one process.

    python benchmarks/bench_step.py [--steps 12] [--repeats 3] [--threads 1] [--write-docs]

Part 1, csclip's step (csclip.train.step.train_step) on the demo's stages: csclip-tiny,
world batches of 64 with the columns each stage trains (CLIP-FT: the caption; the
pretraining: the caption and the image-foil texts, two images; CS-CLIP: eight text
columns, two images), the image tower locked as in the demo. Variants interleaved per
repeat, each on the same batches from the same weights; the median ms per step.

Part 2, the paper's model: ViT-B/32's text tower (random weights, the same shapes), forward
and backward on 64 COCO captions (SugarCrepe's positives, ../shared/data/sugarcrepe), the
full 77-token context against the trimmed one.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

HEADING = "## The training step without padding, fused AdamW (benchmarks/bench_step.py)"
SUGARCREPE = Path(__file__).resolve().parents[2] / "shared" / "data" / "sugarcrepe"
VARIANTS = {  # name: (trim_text, fused AdamW, MiB of locked image features kept)
    "before: full context, foreach AdamW (baseline)": (False, False, 0),
    "fused AdamW": (False, True, 0),
    "trimmed text": (True, False, 0),
    "trimmed text + fused AdamW": (True, True, 0),
    "+ locked image features kept (now)": (True, True, 256),
}
STAGES = {  # the demo's stages: loss, image foils
    "CLIP-FT": ("clip", False),
    "pretraining (CLIP + image foils)": ("clip", True),
    "CS-CLIP (N = 2, image foils)": ("csclip", True),
}


def stage_batches(method: str, image_foils: bool, steps: int) -> tuple[object, list[dict]]:
    """The stage's Objective and `steps` batches of 64 world samples with its columns."""
    from csclip.config.loss import LossConfig
    from csclip.config.train import SamplingConfig
    from csclip.config.world import WorldConfig
    from csclip.loss import objective_for
    from csclip.model import create_bundle, spec_of
    from csclip.train.stream import prepare_batch, preprocess_key
    from csclip.units import records_to_table
    from csclip.world import world_record

    loss = LossConfig(method=method, image_foil_weight=2.0 if image_foils else None)
    objective = objective_for(loss, 2)
    spec = spec_of(create_bundle("csclip-tiny").model, "csclip-tiny")
    preprocess = preprocess_key(spec.preprocess_cfg)
    world = WorldConfig(num_train=64 * steps)
    sampling = SamplingConfig(num_unit_slots=2, relation_prob=0.5, swap_prob=0.5,
                              inplace_prob=0.5, use_negation=False).model_dump(mode="json")
    batches = []
    for start in range(0, 64 * steps, 64):
        records = [world_record(world, "train", i) for i in range(start, start + 64)]
        columns = prepare_batch(records_to_table(records), sampling=sampling,
                                preprocess=preprocess, model_name="csclip-tiny", seed=0,
                                epoch=0, columns=list(objective.columns))
        batches.append({k: torch.as_tensor(v) for k, v in columns.items()})
    return objective, batches


def time_stage(objective, batches: list[dict], repeats: int) -> dict[str, float]:
    """Median ms per step of each variant, interleaved."""
    from csclip.config.train import OptimConfig
    from csclip.model import create_bundle
    from csclip.train.step import StepOptions, build_training, train_step

    torch.manual_seed(0)
    weights = create_bundle("csclip-tiny").model
    for param in weights.visual.parameters():  # the demo's locked image tower
        param.requires_grad_(False)
    runs = {}
    for name, (trim, fused, kept_mb) in VARIANTS.items():
        options = StepOptions(objective, trim_text=trim, locked_image_cache_mb=kept_mb)
        runs[name] = build_training(copy.deepcopy(weights), OptimConfig(lr=1e-3, fused=fused),
                                    options, torch.device("cpu"))
        for batch in batches:  # warm up; the kept features are an epoch's, as from epoch 2 on
            train_step(runs[name], batch)
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, training in runs.items():
            for batch in batches:
                started = time.perf_counter()
                train_step(training, batch)
                times[name].append(time.perf_counter() - started)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def coco_captions(count: int) -> list[str]:
    items = json.loads((SUGARCREPE / "add_obj.json").read_text())
    values = items.values() if isinstance(items, dict) else items
    return [item["caption"] for item in values][:count]


def time_vit_b32_text(repeats: int) -> tuple[float, float, float]:
    """ViT-B/32's text tower, forward + backward on 64 COCO captions: median ms of the
    full context and of the trimmed one, and the rows' mean length in tokens."""
    import open_clip

    from csclip.train.trimmed_text import encode_text_trimmed

    torch.manual_seed(0)
    model = open_clip.create_model("ViT-B-32")
    model.visual.requires_grad_(False)
    tokens = open_clip.get_tokenizer("ViT-B-32")(coco_captions(64))
    encoders = {"full": lambda t: model.encode_text(t, normalize=True),
                "trimmed": lambda t: encode_text_trimmed(model, t)}
    times: dict[str, list[float]] = {name: [] for name in encoders}
    for _ in range(repeats + 1):
        for name, encode in encoders.items():
            started = time.perf_counter()
            encode(tokens).sum().backward()
            times[name].append(time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
    full, trimmed = (1000 * statistics.median(times[n][1:]) for n in encoders)
    return full, trimmed, float((tokens.argmax(1) + 1).float().mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=12, help="batches per stage")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--skip-vit", action="store_true", help="part 1 only")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from perfdoc import publish

    lines = [HEADING, "",
             f"Command: `python benchmarks/bench_step.py --steps {args.steps} --repeats "
             f"{args.repeats} --threads {args.threads}` (x86_64, torch {torch.__version__}, "
             f"{args.threads} thread). Median ms per training step (csclip.train.step.train_step: "
             "forward, loss, backward, clipping, AdamW), csclip-tiny, batches of 64 world "
             "samples with each demo stage's columns, the image tower locked; the variants "
             "interleaved on the same batches from the same weights, after a first pass over "
             "them (so the kept features are those of every image and foil, as in a run "
             "from the epoch in which a sample's foils were all drawn once).", "",
             "| stage | " + " | ".join(VARIANTS) + " | before / now |",
             "|---|" + "---:|" * (len(VARIANTS) + 1)]
    for stage, (method, foils) in STAGES.items():
        objective, batches = stage_batches(method, foils, args.steps)
        ms = time_stage(objective, batches, args.repeats)
        before, now = ms[next(iter(VARIANTS))], ms[list(VARIANTS)[-1]]
        lines.append(f"| {stage} | " + " | ".join(f"{ms[n]:.1f}" for n in VARIANTS)
                     + f" | {before / now:.2f}x |")
        print(lines[-1], flush=True)
    if not args.skip_vit:
        full, trimmed, length = time_vit_b32_text(args.repeats)
        lines += ["", f"The paper's text tower: ViT-B/32's (random weights), forward + backward "
                  f"on 64 COCO captions (SugarCrepe's add_obj positives, {length:.1f} of the 77 "
                  f"positions on average): full context {full:.0f} ms, trimmed {trimmed:.0f} ms, "
                  f"{full / trimmed:.2f}x."]
    publish(HEADING, "\n".join(lines), args.write_docs)


if __name__ == "__main__":
    main()

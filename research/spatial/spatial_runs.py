"""In-process training runs for the spatial-relations study: the same model,
objective and sampler as csclip.train, without Ray, so many variants fit a CPU budget.

    python -m research.spatial.spatial_runs pretrain --steps 1500 --out runs/spatial/pre
    python -m research.spatial.spatial_runs finetune --init runs/spatial/pre --method csclip \
        --steps 600 --out runs/spatial/cs [--set sampling.relation_prob=1.0]

Checkpoints (csclip layout, read by load_bundle and diag_spatial.py) go to
<out>/checkpoint_<step>; <out>/log.csv has the loss curve and the diagnostics at every
--diag-every steps. Images are decoded and transformed once; sampling and tokenization
run per step, as in the pipeline.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import torch

from csclip.config import load_config
from csclip.config.train import TrainConfig
from csclip.config.world import WorldConfig
from csclip.loss import objective_for
from csclip.model import (
    apply_training_options,
    bundle_from_config,
    save_checkpoint,
    spec_of,
    unwrap,
)
from csclip.train.optim import build_optimizer, lr_at
from csclip.train.step import encode
from csclip.train.stream import prepare_batch, preprocess_key
from csclip.units import records_to_table
from csclip.world import world_record
from research.spatial.diag_spatial import diagnose
from research.spatial.layout_question import (
    LayoutHead,
    PairVocabulary,
    layout_loss,
    record_image_targets,
)

STAGES = {
    # The demo's stand-in pretraining: plain CLIP on another world seed (csclip.demo).
    "pretrain": ["loss.method=clip", "data.world.seed=1000", "data.world.num_train=4000",
                 "optim.lr=1e-3", "optim.weight_decay=0.1", "optim.warmup_steps=50"],
    # The demo's fine-tuning (configs/default.yaml). Until study C the
    # sampler kept TrainConfig's defaults (the authors': swap_prob 1.0, inplace_prob 1.0,
    # negation on); docs/training.md says which runs, and how to get that back.
    "finetune": ["data.world.num_train=2000", "optim.lr=1e-3", "optim.weight_decay=0.1",
                 "optim.warmup_steps=20", "loss.unit_loss_weight=1.0",
                 "sampling.relation_prob=0.5", "sampling.swap_prob=0.5",
                 "sampling.inplace_prob=0.5", "sampling.use_negation=false"],
}


ROWS, COLS = ("top", "middle", "bottom"), ("left", "middle", "right")


def position_caption(record, rng: np.random.Generator) -> str:
    """Where one of the scene's objects is, in absolute terms: "red circle top left".
    Other images of a batch hold the same object elsewhere (25 object kinds, ~3 objects a
    scene: a batch of 64 has ~8 red circles), so matching this caption needs the image
    embedding to encode the object's position; the text needs no word order."""
    from csclip.world.captions import mention
    from csclip.world.scene import scene_from_record

    objects = scene_from_record(record).objects
    obj = objects[int(rng.integers(len(objects)))]
    where = "center" if (obj.row, obj.col) == (1, 1) else f"{ROWS[obj.row]} {COLS[obj.col]}"
    return f"{mention(obj, with_size=False)} {where}"


def layout_batch(vocabulary: PairVocabulary, records, tokenizer, rng,
                 answers: dict) -> dict[str, torch.Tensor]:
    """The layout question's columns for a batch: each record's image answers, and one
    relation text per record (a unit, its antonym or its swap) with its answers.
    answers: sample_id -> (image answers, text examples), filled once per record (they
    do not change between steps)."""
    for r in records:
        if r.sample_id not in answers:
            answers[r.sample_id] = (record_image_targets(vocabulary, r),
                                    vocabulary.text_examples(r))
    image = [answers[r.sample_id][0] for r in records]
    texts = [examples[int(rng.integers(len(examples)))]
             for examples in (answers[r.sample_id][1] for r in records) if examples]
    return {"image_target": torch.as_tensor(np.stack([t for t, _ in image])),
            "image_mask": torch.as_tensor(np.stack([m for _, m in image])),
            "text": tokenizer([t for t, _, _ in texts]),
            "text_target": torch.as_tensor(np.stack([t for _, t, _ in texts])),
            "text_mask": torch.as_tensor(np.stack([m for _, _, m in texts]))}


def train(config: TrainConfig, steps: int, out: Path, diag_every: int, diag_records,
          position_captions: float = 0.0, layout_weight: float = 0.0,
          layout_frozen: bool = False) -> None:
    torch.manual_seed(config.run.seed)
    bundle = bundle_from_config(config.model)
    model = bundle.model.train()
    apply_training_options(model, config.model)  # model.lock_image: LiT-style runs
    spec = spec_of(model, config.model.name)
    objective = objective_for(config.loss, config.sampling.num_unit_slots)
    world = config.data.world
    records = [world_record(world, "train", i) for i in range(world.num_train)]
    batch_size = config.data.batch_size
    vocabulary = PairVocabulary(tuple(config.data.world.colors), tuple(config.data.world.shapes))
    head = LayoutHead(spec.embed_dim, vocabulary, frozen=layout_frozen) if layout_weight else None
    layout_answers: dict = {}
    optimizer = build_optimizer(model, config.optim)
    if head is not None and not layout_frozen:
        optimizer.add_param_group({"params": list(head.parameters()), "weight_decay": 0.0})
    rng = np.random.default_rng(config.run.seed)
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "log.csv").open("w", newline="")
    writer = csv.writer(log)
    writer.writerow(["step", "loss", "loss_full", "loss_unit", "seconds", "diag"])
    order = rng.permutation(len(records))
    started = time.perf_counter()
    for step in range(steps):
        start = (step * batch_size) % len(records)
        if start + batch_size > len(records):
            order = rng.permutation(len(records))
        index = order[start:start + batch_size] if start + batch_size <= len(records) \
            else order[:batch_size]
        epoch = step * batch_size // len(records)
        chosen = [records[i] for i in index]
        if position_captions:
            chosen = [dataclasses.replace(r, caption=position_caption(r, rng))
                      if rng.random() < position_captions else r for r in chosen]
        columns = prepare_batch(records_to_table(chosen),
                                sampling=config.sampling.model_dump(),
                                preprocess=preprocess_key(spec.preprocess_cfg),
                                model_name=config.model.name, seed=config.run.seed, epoch=epoch,
                                columns=list(objective.columns))
        batch = {k: torch.as_tensor(v) for k, v in columns.items()}
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config.optim, steps, len(records) // batch_size)
        optimizer.zero_grad(set_to_none=True)
        encoded = encode(model, batch, objective.columns, image_columns=objective.image_columns)
        parts = objective.loss(encoded.image, encoded.texts,
                               {name: batch[name] for name in objective.mask_columns},
                               encoded.scale, encoded.images)
        total = parts.total
        if head is not None:
            answers = layout_batch(vocabulary, chosen, bundle.tokenizer, rng, layout_answers)
            text = model.encode_text(answers["text"])
            total = total + layout_weight * (
                layout_loss(head(encoded.image), answers["image_target"], answers["image_mask"])
                + layout_loss(head(text), answers["text_target"], answers["text_mask"]))
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.optim.grad_clip or 1e9)
        optimizer.step()
        with torch.no_grad():
            unwrap(model).logit_scale.clamp_(0, float(np.log(100)))
        done = step + 1
        diag = ""
        if done % diag_every == 0 or done == steps:
            save_checkpoint(model, spec, out / f"checkpoint_{done:06d}", None,
                            config.model_dump(mode="json"))
            if diag_records:
                model.eval()
                metrics = diagnose(bundle, diag_records)
                model.train()
                diag = " ".join(f"{k}={v:.3f}" for k, v in metrics.items())
        writer.writerow([done, f"{parts.total.item():.4f}", f"{parts.full.item():.4f}",
                         f"{parts.unit.item():.4f}", f"{time.perf_counter() - started:.1f}", diag])
        log.flush()
        if done % 50 == 0 or diag:
            print(f"step {done}/{steps} loss {parts.total.item():.4f} "
                  f"({time.perf_counter() - started:.0f} s) {diag}", flush=True)
    log.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=sorted(STAGES))
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--init", help="checkpoint dir to start from (fine-tuning; or a warm "
                                       "start of pretraining, e.g. diag_spatial.py --save)")
    parser.add_argument("--method", default="csclip", choices=["clip", "negclip", "csclip"])
    parser.add_argument("--model", default="csclip-tiny")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--diag-every", type=int, default=250)
    parser.add_argument("--diag-scenes", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--position-captions", type=float, default=0.0, metavar="P",
                        help="share of captions replaced by absolute positions (pretraining)")
    parser.add_argument("--layout-weight", type=float, default=0.0, metavar="W",
                        help="add W x the layout question (research.spatial.layout_question) to the loss")
    parser.add_argument("--layout-frozen", action="store_true",
                        help="with --layout-weight: a fixed random head (nothing to train)")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    args = parser.parse_args(argv)
    overrides = [*STAGES[args.stage], f"model.name={args.model}", "model.image_size=64",
                 f"data.batch_size={args.batch_size}"]
    if args.stage == "finetune":
        overrides += [f"loss.method={args.method}"]
    if args.init:  # fine-tuning from a pretraining; pretraining from a warm start
        overrides += [f"model.pretrained={args.init}"]
    config = load_config(TrainConfig, None, overrides + args.overrides)
    diag_world = WorldConfig(seed=7, num_train=0, num_val=args.diag_scenes, num_test=0)
    diag_records = [world_record(diag_world, "val", i) for i in range(args.diag_scenes)]
    torch.set_num_threads(args.threads)
    train(config, args.steps, Path(args.out), args.diag_every, diag_records,
          args.position_captions, args.layout_weight, args.layout_frozen)
    return 0


if __name__ == "__main__":
    sys.exit(main())

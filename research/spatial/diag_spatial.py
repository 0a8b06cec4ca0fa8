"""Why are spatial relations not learned? Diagnostics of a world model's two towers.

    python -m research.spatial.diag_spatial --checkpoint runs/train/<run>/final [--checkpoint ...]
    python -m research.spatial.diag_spatial --checkpoint runs/train/<run> --all-steps   # every checkpoint_*
    python -m research.spatial.diag_spatial --model csclip-tiny                          # random weights

For each model, on scenes of the world's validation distribution (another seed):
- image probe: is each object's column / row linearly decodable from the frozen image
  embedding? (one multinomial logistic probe per object name: the embedding times a one-hot
  of the object's color+shape; test accuracy on held-out scenes; chance = majority class);
- image side: for a relation unit "A r B", is s(I, "A r B") > s(I', "A r B") where I' is the
  same scene with A and B exchanged (only the image changes);
- text side: is s(I, "A r B") > s(I, "B r A") (swap) and > s(I, "A r' B") (antonym) (only
  the text changes), and how close are the text embeddings (cosine of unit vs swap foil,
  vs antonym foil, vs an object-change foil).
A tower whose signal is at chance while the other's is not is the bottleneck. Prints a
markdown table; --out writes it as .md and .csv.
"""

from __future__ import annotations

import argparse
import csv
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from csclip.config.world import ABOVE, ANTONYMS, BELOW, LEFT, RIGHT, WorldConfig
from csclip.eval.encoder import BundleScorer, decode_image
from csclip.model import ClipBundle, create_bundle, load_bundle
from csclip.units import ChangeType, UnitsRecord
from csclip.world import scene_from_record, world_record
from csclip.world.pairs import relation_objects, swap_objects
from csclip.world.render import render_png


@dataclass(frozen=True)
class RelationCase:
    """One relation unit of a scene with its text-side and image-side counterfactuals."""

    image: bytes
    swapped_image: bytes  # the scene with subject and object exchanged
    unit: str
    swap_text: str
    antonym_text: str
    object_change_text: str | None
    subject_first: bool  # the subject is left of / above the object (reading order)


def relation_cases(records: list[UnitsRecord]) -> list[RelationCase]:
    cases = []
    for record in records:
        scene = scene_from_record(record)
        for unit in record.relations:
            found = relation_objects(scene, unit)
            if found is None:
                continue
            swapped = swap_objects(scene, *found)
            object_change = next((f.text for f in unit.foils
                                  if f.change_type == ChangeType.OBJECT_REPLACE), None)
            cases.append(RelationCase(
                record.image_bytes, render_png(swapped), unit.text,
                f"{unit.object} {unit.predicate} {unit.subject}",
                f"{unit.subject} {ANTONYMS[unit.predicate]} {unit.object}", object_change,
                unit.predicate in (LEFT, ABOVE)))
    return cases


def probe_accuracy(features: np.ndarray, names: np.ndarray, labels: np.ndarray,
                   num_names: int, seed: int = 0, steps: int = 300) -> tuple[float, float]:
    """Test accuracy of a per-name multinomial logistic probe and the majority baseline.

    features: (n, D) image embeddings; names: (n,) object-name index; labels: (n,) class.
    The input is features ⊗ one-hot(name), so each object name gets its own linear probe.
    """
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(labels))
    split = int(0.7 * len(order))
    train, test = order[:split], order[split:]
    x = torch.as_tensor(features, dtype=torch.float32)
    x = torch.cat([x, torch.ones(len(x), 1)], dim=1)                      # bias term
    onehot = torch.nn.functional.one_hot(torch.as_tensor(names), num_names).float()
    inputs = (onehot[:, :, None] * x[:, None, :]).flatten(1)              # (n, names·(D+1))
    y = torch.as_tensor(labels)
    num_classes = int(labels.max()) + 1
    weight = torch.zeros(inputs.shape[1], num_classes, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight], max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        logits = inputs[train] @ weight
        loss = torch.nn.functional.cross_entropy(logits, y[train]) + 1e-3 * weight.pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    with torch.no_grad():
        accuracy = float((inputs[test] @ weight).argmax(1).eq(y[test]).float().mean())
    majority = float(np.bincount(labels[train]).max() / len(train))
    return 100 * accuracy, 100 * majority


def image_probe(scorer: BundleScorer, records: list[UnitsRecord]) -> dict[str, float]:
    features = scorer.encode_images([r.image_bytes for r in records])     # (n, D)
    rows, names, cols, row_labels = [], [], [], []
    name_index: dict[str, int] = {}
    for k, record in enumerate(records):
        for obj in scene_from_record(record).objects:
            rows.append(k)
            names.append(name_index.setdefault(f"{obj.color} {obj.shape}", len(name_index)))
            cols.append(obj.col)
            row_labels.append(obj.row)
    per_object = features[np.array(rows)]
    names_arr = np.array(names)
    col_acc, col_chance = probe_accuracy(per_object, names_arr, np.array(cols), len(name_index))
    row_acc, row_chance = probe_accuracy(per_object, names_arr, np.array(row_labels), len(name_index))
    return {"probe_col": col_acc, "probe_col_chance": col_chance,
            "probe_row": row_acc, "probe_row_chance": row_chance}


def tower_scores(scorer: BundleScorer, cases: list[RelationCase]) -> dict[str, float]:
    images = scorer.encode_images([c.image for c in cases])
    swapped = scorer.encode_images([c.swapped_image for c in cases])
    units = scorer.encode_texts([c.unit for c in cases])
    swaps = scorer.encode_texts([c.swap_text for c in cases])
    antonyms = scorer.encode_texts([c.antonym_text for c in cases])
    with_change = [i for i, c in enumerate(cases) if c.object_change_text]
    changes = scorer.encode_texts([cases[i].object_change_text for i in with_change])

    def rowdot(a, b):
        return (a * b).sum(1)

    true_score = rowdot(images, units)
    image_side = true_score > rowdot(swapped, units)
    first = np.array([c.subject_first for c in cases])
    metrics = {
        "image_side_swap": 100 * float(np.mean(image_side)),
        # Split by predicate direction: near 50 both ways means the image ignores layout;
        # far from 50 in opposite directions means layout is encoded but the text does not
        # tell "left" from "right" (it picks the image by which object is named first).
        "image_side_swap_subject_first": 100 * float(np.mean(image_side[first])),
        "image_side_swap_subject_second": 100 * float(np.mean(image_side[~first])),
        "text_side_swap": 100 * float(np.mean(true_score > rowdot(images, swaps))),
        "text_side_antonym": 100 * float(np.mean(true_score > rowdot(images, antonyms))),
        "text_cos_swap": float(np.mean(rowdot(units, swaps))),
        "text_cos_antonym": float(np.mean(rowdot(units, antonyms))),
        "image_cos_swapped": float(np.mean(rowdot(images, swapped))),
        "num_relations": float(len(cases)),
    }
    if with_change:
        metrics["text_side_object_change"] = 100 * float(np.mean(
            true_score[with_change] > rowdot(images[with_change], changes)))
        metrics["text_cos_object_change"] = float(np.mean(rowdot(units[with_change], changes)))
    return metrics


def diagnose(bundle: ClipBundle, records: list[UnitsRecord]) -> dict[str, float]:
    """Every diagnostic of one model on `records` (world records with scenes)."""
    torch.manual_seed(0)
    scorer = BundleScorer(bundle, batch_size=128)
    return {**image_probe(scorer, records), **tower_scores(scorer, relation_cases(records))}


def supervised_layout(model_name: str, steps: int, scenes: int = 4000, batch_size: int = 64,
                      image_size: int = 64, seed: int = 0, save: str | None = None,
                      presence_only: bool = False) -> dict[str, float]:
    """Can this image tower encode layout at all, when asked directly? Train it from
    random weights on the layout question (research.spatial.layout_question.supervised_layout_training:
    a linear head predicts every object kind's grid cell or "absent"); report the cell
    accuracy of the objects present in held-out scenes (chance: ~1/9). A tower that
    learns this here but not from captions has the capacity; what is missing is a
    training signal. presence_only: the control (is each kind present)."""
    from csclip.model import save_checkpoint, spec_of
    from csclip.train.warm_start import image_cell_targets
    from research.spatial.layout_question import presence_targets, supervised_layout_training

    torch.manual_seed(seed)
    bundle = create_bundle(model_name, image_size=image_size)
    world = WorldConfig(seed=seed + 1, image_size=image_size, num_train=scenes, num_val=300,
                        num_test=0)
    result = supervised_layout_training(bundle.model, bundle.preprocess, world, steps,
                                     batch_size=batch_size, seed=seed, log_every=0,
                                     cell_targets=presence_targets if presence_only
                                     else image_cell_targets)
    if save:  # the whole CLIP model: this image tower, the text tower at random weights
        save_checkpoint(bundle.model, spec_of(bundle.model, model_name), save)
    return {"supervised_cell_accuracy": result.cell_accuracy,
            "supervised_presence_accuracy": result.presence_accuracy,
            "supervised_steps": float(steps)}


def _text_layout_examples(world: WorldConfig, split: str, count: int, kinds: dict):
    """Relation texts of `count` world scenes with their antonym and swap texts, and for
    each text the per-kind target: the subject's direction from the predicate, the
    object's the opposite one, every other kind "absent" (the last class)."""
    from csclip.units import render_relation
    from csclip.world.truth import parse_entity
    from research.spatial.layout_question import relation_variants

    directions = {LEFT: 0, RIGHT: 1, ABOVE: 2, BELOW: 3}
    texts, targets = [], []
    for index in range(count):
        for unit in world_record(world, split, index).relations:
            for s, p, o in relation_variants(unit):
                target = torch.full((len(kinds),), len(directions), dtype=torch.long)
                first, second = (parse_entity(part.split(), unit.text) for part in (s, o))
                target[kinds[(first.color, first.shape)]] = directions[p]
                target[kinds[(second.color, second.shape)]] = directions[ANTONYMS[p]]
                texts.append(render_relation(s, p, o))
                targets.append(target)
    return texts, torch.stack(targets)


def supervised_text_layout(init: str, steps: int, scenes: int = 4000, batch_size: int = 64,
                           seed: int = 0, save: str | None = None) -> dict[str, float]:
    """The text tower's layout question: from the text embedding of "A r B" (and of its
    antonym and swap texts), a linear head predicts for every object kind its side
    (left / right / above / below of the other one) or "absent". Passing it needs the
    predicate *and* the word order, what the antonym and swap foils test. Starts from the
    checkpoint `init` (e.g. the image tower's layout question, --save) and trains the text
    tower only; the saved model keeps init's image tower."""
    from csclip.model import save_checkpoint, spec_of

    torch.manual_seed(seed)
    bundle = load_bundle(init)
    model = bundle.model.train()
    world = WorldConfig(seed=seed + 1, num_train=scenes, num_val=300, num_test=0)
    kinds = {(c, s): i for i, (c, s) in enumerate((c, s) for c in world.colors for s in world.shapes)}
    train_texts, train_y = _text_layout_examples(world, "train", scenes, kinds)
    test_texts, test_y = _text_layout_examples(world, "val", 300, kinds)
    train_x, test_x = bundle.tokenizer(train_texts), bundle.tokenizer(test_texts)
    classes = 5
    head = torch.nn.Linear(model.text_projection.shape[1], len(kinds) * classes)
    text_params = [p for name, p in model.named_parameters()
                   if not name.startswith("visual.") and name != "logit_scale"]
    optimizer = torch.optim.AdamW([*text_params, *head.parameters()], lr=1e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(len(train_x), (batch_size,), generator=generator)
        logits = head(model.encode_text(train_x[index])).view(batch_size, len(kinds), classes)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), train_y[index].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        logits = head(model.encode_text(test_x)).view(len(test_x), len(kinds), classes)
    if save:
        save_checkpoint(model, spec_of(model, bundle.name), save)
    named = test_y < classes - 1
    right = logits.argmax(-1).eq(test_y)
    return {"text_side_accuracy": 100 * float(right[named].float().mean()),
            "text_relation_accuracy": 100 * float(right.all(-1).float().mean()),
            "supervised_steps": float(steps)}


def supervised_joint_layout(model_name: str, steps: int, scenes: int = 4000,
                            batch_size: int = 64, image_size: int = 64, seed: int = 0,
                            init: str | None = None, save: str | None = None) -> dict[str, float]:
    """Both towers answer the pairwise layout question's ("is A left of / right
    of / above / below B") through ONE shared head on the normalized embedding: an image
    for every pair of its objects, a relation text (with its antonym and swap texts) for
    the pair it names. Sharing the head puts both towers' layout in the same directions
    of the joint space, which cosine scoring then sees."""
    from csclip.model import save_checkpoint, spec_of
    from research.spatial.layout_question import (
        LayoutHead,
        PairVocabulary,
        layout_accuracy,
        layout_loss,
        record_image_targets,
    )

    torch.manual_seed(seed)
    bundle = load_bundle(init) if init else create_bundle(model_name, image_size=image_size)
    model = bundle.model.train()
    world = WorldConfig(seed=seed + 1, image_size=image_size, num_train=scenes, num_val=300,
                        num_test=0)
    vocabulary = PairVocabulary(tuple(world.colors), tuple(world.shapes))

    def examples(split: str, count: int):
        records = [world_record(world, split, i) for i in range(count)]
        images = torch.stack([bundle.preprocess(decode_image(r.image_bytes)) for r in records])
        answers = [record_image_targets(vocabulary, r) for r in records]
        texts = [e for r in records for e in vocabulary.text_examples(r)]
        return (images, torch.as_tensor(np.stack([t for t, _ in answers])),
                torch.as_tensor(np.stack([m for _, m in answers])),
                bundle.tokenizer([t for t, _, _ in texts]),
                torch.as_tensor(np.stack([t for _, t, _ in texts])),
                torch.as_tensor(np.stack([m for _, _, m in texts])))

    train = examples("train", scenes)
    test = examples("val", 300)
    head = LayoutHead(model.text_projection.shape[1], vocabulary)
    params = [p for n, p in model.named_parameters() if n != "logit_scale"]
    optimizer = torch.optim.AdamW([*params, *head.parameters()], lr=1e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = torch.randint(len(train[0]), (batch_size,), generator=generator)
        t = torch.randint(len(train[3]), (batch_size,), generator=generator)
        loss = (layout_loss(head(model.encode_image(train[0][i])), train[1][i], train[2][i])
                + layout_loss(head(model.encode_text(train[3][t])), train[4][t], train[5][t]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        image_logits, text_logits = head(model.encode_image(test[0])), head(model.encode_text(test[3]))
    if save:
        save_checkpoint(model, spec_of(model, bundle.name), save)
    return {"joint_image_accuracy": layout_accuracy(image_logits, test[1], test[2]),
            "joint_text_accuracy": layout_accuracy(text_logits, test[4], test[5]),
            "supervised_steps": float(steps)}


def pairwise_text(init: str, steps: int, scenes: int = 2000, batch_size: int = 64,
                  seed: int = 0, lock_image: bool = True) -> dict[str, float]:
    """The text side of Ant and Swap as a learning problem on its own: from checkpoint
    `init`, train with nothing but s(I, unit) > s(I, foil) (cross entropy over the two,
    the model's temperature) for a relation unit against its antonym and its swap text;
    report held-out accuracy. The image tower is locked by default, so only the text tower
    can learn: if this stays at chance, reading layout through a dot product is what the
    text tower cannot learn here; if it does not, CS-CLIP's other terms hold it back."""
    torch.manual_seed(seed)
    bundle = load_bundle(init)
    model = bundle.model.train()
    if lock_image:
        model.visual.requires_grad_(False)
    world = WorldConfig(seed=seed + 2, num_train=scenes, num_val=300, num_test=0)

    def triples(split: str, count: int):
        cases = relation_cases([world_record(world, split, i) for i in range(count)])
        images = torch.stack([bundle.preprocess(decode_image(c.image)) for c in cases])
        return (images, bundle.tokenizer([c.unit for c in cases]),
                bundle.tokenizer([c.antonym_text for c in cases]),
                bundle.tokenizer([c.swap_text for c in cases]))

    train, test = triples("train", scenes), triples("val", 300)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1)
    generator = torch.Generator().manual_seed(seed)

    def logits(images, units, foils):
        image = torch.nn.functional.normalize(model.encode_image(images), dim=-1)
        u, f = (torch.nn.functional.normalize(model.encode_text(t), dim=-1) for t in (units, foils))
        return model.logit_scale.exp() * torch.stack([(image * u).sum(-1), (image * f).sum(-1)], 1)

    for _ in range(steps):
        i = torch.randint(len(train[0]), (batch_size,), generator=generator)
        loss = sum(torch.nn.functional.cross_entropy(logits(train[0][i], train[1][i], foils[i]),
                                                     torch.zeros(batch_size, dtype=torch.long))
                   for foils in (train[2], train[3]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        antonym = logits(test[0], test[1], test[2])
        swap = logits(test[0], test[1], test[3])
    return {"pairwise_antonym": 100 * float((antonym[:, 0] > antonym[:, 1]).float().mean()),
            "pairwise_swap": 100 * float((swap[:, 0] > swap[:, 1]).float().mean()),
            "pairwise_steps": float(steps)}


COLUMNS = (
    ("probe col", "probe_col", "{:.1f}"), ("(chance)", "probe_col_chance", "{:.1f}"),
    ("probe row", "probe_row", "{:.1f}"), ("(chance)", "probe_row_chance", "{:.1f}"),
    ("img-side swap", "image_side_swap", "{:.1f}"),
    ("img-side, left/above", "image_side_swap_subject_first", "{:.1f}"),
    ("img-side, right/below", "image_side_swap_subject_second", "{:.1f}"),
    ("txt-side swap", "text_side_swap", "{:.1f}"),
    ("txt-side ant", "text_side_antonym", "{:.1f}"),
    ("txt-side obj", "text_side_object_change", "{:.1f}"),
    ("cos(u,swap)", "text_cos_swap", "{:.4f}"), ("cos(u,ant)", "text_cos_antonym", "{:.4f}"),
    ("cos(u,obj)", "text_cos_object_change", "{:.4f}"),
    ("cos(I,I')", "image_cos_swapped", "{:.4f}"),
)


def table(results: dict[str, dict[str, float]]) -> str:
    header = ["model", *(name for name, _, _ in COLUMNS)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for label, metrics in results.items():
        cells = [fmt.format(metrics[key]) if key in metrics else "—" for _, key, fmt in COLUMNS]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join(lines) + "\n"


def checkpoints_of(path: str, all_steps: bool) -> list[tuple[str, str]]:
    """(label, directory) of the checkpoint(s) under `path`."""
    root = Path(path)
    if not all_steps:
        return [(root.parent.name + "/" + root.name, str(root))]
    found = sorted(p for p in root.glob("checkpoint_*") if (p / "model_spec.json").is_file())
    return [(f"{root.name}/{p.name}", str(p)) for p in found]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", action="append", default=[],
                        help="a csclip checkpoint dir (repeatable); with --all-steps a run dir")
    parser.add_argument("--all-steps", action="store_true",
                        help="diagnose every checkpoint_* of each run dir (training curve)")
    parser.add_argument("--model", action="append", default=[],
                        help="an open_clip model name with random weights (a floor)")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--scenes", type=int, default=600, help="scenes to diagnose on")
    parser.add_argument("--seed", type=int, default=7, help="world seed of the scenes")
    parser.add_argument("--out", help="directory for diag_spatial.md / .csv")
    parser.add_argument("--supervised", type=int, default=0, metavar="STEPS",
                        help="instead: train each --model's image tower from random weights to "
                             "predict every object's cell (supervised_layout) for STEPS steps")
    parser.add_argument("--presence-only", action="store_true",
                        help="with --supervised: the control task (is each kind present)")
    parser.add_argument("--supervised-text", type=int, default=0, metavar="STEPS",
                        help="instead: train the text tower of --init to tell each object's "
                             "side in relation texts (supervised_text_layout) for STEPS steps")
    parser.add_argument("--supervised-joint", type=int, default=0, metavar="STEPS",
                        help="instead: both towers of --model (or --init) answer one layout "
                             "question through a shared head (supervised_joint_layout)")
    parser.add_argument("--pairwise", type=int, default=0, metavar="STEPS",
                        help="instead: train --init's text tower on unit vs antonym / swap "
                             "only (pairwise_text), the image tower locked")
    parser.add_argument("--unlock-image", action="store_true", help="with --pairwise")
    parser.add_argument("--init", metavar="DIR", help="with --supervised-text: the checkpoint")
    parser.add_argument("--save", metavar="DIR",
                        help="with --supervised: save the model (a csclip checkpoint; one --model)")
    args = parser.parse_args(argv)
    if args.supervised_text:
        if not args.init:
            parser.error("--supervised-text needs --init")
        metrics = supervised_text_layout(args.init, args.supervised_text, save=args.save)
        print(" ".join(f"{k}={v:.1f}" for k, v in metrics.items()), flush=True)
        return 0
    if args.pairwise:
        metrics = pairwise_text(args.init, args.pairwise, lock_image=not args.unlock_image)
        print(" ".join(f"{k}={v:.1f}" for k, v in metrics.items()), flush=True)
        return 0
    if args.supervised_joint:
        metrics = supervised_joint_layout((args.model or ["csclip-tiny"])[0],
                                          args.supervised_joint, init=args.init, save=args.save)
        print(" ".join(f"{k}={v:.1f}" for k, v in metrics.items()), flush=True)
        return 0
    if args.supervised:
        for name in args.model:
            metrics = supervised_layout(name, args.supervised, image_size=args.image_size,
                                        save=args.save, presence_only=args.presence_only)
            print(name, " ".join(f"{k}={v:.1f}" for k, v in metrics.items()), flush=True)
        return 0
    world = WorldConfig(seed=args.seed, image_size=args.image_size, num_train=0,
                        num_val=args.scenes, num_test=0)
    records = [world_record(world, "val", i) for i in range(args.scenes)]
    models: list[tuple[str, ClipBundle]] = [
        (f"{name} (random)", create_bundle(name, image_size=args.image_size)) for name in args.model]
    for path in args.checkpoint:
        models += [(label, load_bundle(directory))
                   for label, directory in checkpoints_of(path, args.all_steps)]
    if not models:
        parser.error("give --checkpoint or --model")
    results = {}
    for label, bundle in models:
        print(f"diagnosing {label} ...", file=sys.stderr, flush=True)
        results[label] = diagnose(bundle, records)
    markdown = table(results)
    print(markdown)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "diag_spatial.md").write_text(markdown)
        with (out / "diag_spatial.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            keys = [key for _, key, _ in COLUMNS]
            writer.writerow(["model", *keys])
            for label, metrics in results.items():
                writer.writerow([label, *(metrics.get(k, "") for k in keys)])
    return 0


if __name__ == "__main__":
    random.seed(0)
    sys.exit(main())

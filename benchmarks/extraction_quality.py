"""Quality numbers of the rules backend, as in docs/extraction.md:

- entity / relation precision, recall and F1, predicate exact rate and negation errors on
  the hand-annotated gold set of real SugarCrepe captions (tests/gold/), per split;
- entity / relation precision, recall and F1 against the synthetic world's gold units;
- coverage on the SugarCrepe captions (share with >= 1 entity, relation, foil) and the
  rejection reasons;
- a fixed-seed sample of captions with their units, as a markdown table to hand-check.

    .venv/bin/python benchmarks/extraction_quality.py --world 1000 --sample 50 --seed 0
    .venv/bin/python benchmarks/extraction_quality.py --gold-only --errors   # gold set only
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import sys
from pathlib import Path

from csclip.config.world import WorldConfig
from csclip.extract.quality import (
    load_gold,
    markdown_table,
    rules_prediction,
    score_against_gold,
    score_gold,
)
from csclip.extract.rules import extract_record, extract_units
from csclip.world import WorldLanguageError, iter_world, scene_from_record

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "sugarcrepe"
DEFAULT_GOLD = Path(__file__).resolve().parents[1] / "tests" / "gold" / "sugarcrepe_gold.jsonl"


def load_sugarcrepe(directory: Path) -> list[str]:
    """The positive captions of every SugarCrepe file, in file then key order."""
    captions: list[str] = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        captions += [data[key]["caption"] for key in sorted(data, key=int)]
    return captions


def world_scores(num_records: int, seed: int) -> dict[str, float]:
    """P/R/F1 against gold, plus the truth oracle's verdict on every rules foil: false (as
    a foil must be), true (a bad foil), or outside the world's small vocabulary."""
    config = WorldConfig(seed=seed, num_train=0, num_val=num_records, num_test=0)
    gold = list(iter_world(config, splits=("val",)))
    predicted = [extract_record(record)[0] for record in gold]
    scores = score_against_gold(predicted, gold).as_dict()
    verdicts = collections.Counter()
    for record, reference in zip(predicted, gold, strict=True):
        scene = scene_from_record(reference)
        for foil in (f for unit in record.units for f in unit.foils):
            try:
                verdicts["foils_true" if scene.holds(foil.text) else "foils_false"] += 1
            except WorldLanguageError:
                verdicts["foils_outside_world_language"] += 1
    return {**scores, **{k: float(verdicts[k]) for k in (
        "foils_false", "foils_true", "foils_outside_world_language")}}


def coverage(captions: list[str]) -> tuple[dict[str, float], collections.Counter]:
    counts = collections.Counter()
    reasons: collections.Counter = collections.Counter()
    for done, caption in enumerate(captions, 1):
        if done % 2000 == 0:  # progress on stderr; stdout is the report
            print(f"  coverage: {done}/{len(captions)} captions", file=sys.stderr, flush=True)
        result = extract_units(caption)
        counts["entity"] += bool(result.entities)
        counts["relation"] += bool(result.relations)
        counts["foil"] += any(u.foils for u in result.entities + result.relations)
        counts["entities"] += len(result.entities)
        counts["relations"] += len(result.relations)
        reasons.update(r.reason.value for r in result.rejections)
    n = len(captions)
    shares = {"captions": n, "with_entity": counts["entity"] / n,
              "with_relation": counts["relation"] / n, "with_foil": counts["foil"] / n,
              "entities_per_caption": counts["entities"] / n,
              "relations_per_caption": counts["relations"] / n}
    return shares, reasons


def sample_table(captions: list[str], size: int, seed: int) -> str:
    """Markdown rows: caption, entities, relations (one foil each, as a taste)."""
    rows = ["| # | caption | entities | relations |", "|---|---|---|---|"]
    picked = random.Random(seed).sample(sorted(set(captions)), size)
    for number, caption in enumerate(picked, 1):
        result = extract_units(caption)
        entities = "; ".join(u.text for u in result.entities) or "—"
        relations = "; ".join(u.text for u in result.relations) or "—"
        rows.append(f"| {number} | {caption.strip()} | {entities} | {relations} |")
    return "\n".join(rows)


def gold_report(path: Path, show_errors: bool) -> None:
    """The gold-set table; with `show_errors`, every missed and spurious unit per caption."""
    gold = load_gold(path)
    scores = score_gold(gold, rules_prediction)
    print(f"## Gold set ({path.name}, {len(gold)} captions)\n")
    print(markdown_table(scores))
    errors = scores["all"].negation_errors
    print(f"\nNegation errors: {errors if errors else 'none'}")
    if not show_errors:
        return
    from csclip.extract.quality import entity_head, relation_pairs

    for item in gold:
        predicted = rules_prediction(item.caption)
        found = {entity_head(u.text) for u in predicted.entities}
        wanted = {entity_head(t) for t in item.entities}
        pairs = relation_pairs((u.subject, u.predicate, u.object) for u in predicted.relations)
        gold_pairs = relation_pairs(item.relations)
        lines = [f"entity missed {sorted(wanted - found)}" if wanted - found else "",
                 f"entity spurious {sorted(found - wanted)}" if found - wanted else "",
                 f"relation missed {sorted(set(gold_pairs) - set(pairs))}"
                 if set(gold_pairs) - set(pairs) else "",
                 f"relation spurious {sorted(set(pairs) - set(gold_pairs))}"
                 if set(pairs) - set(gold_pairs) else ""]
        if any(lines):
            print(f"\n[{item.split}] {item.sample_id}: {item.caption}")
            print("\n".join("    " + line for line in lines if line))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--gold", type=Path, default=DEFAULT_GOLD)
    parser.add_argument("--gold-only", action="store_true", help="only the gold-set scores")
    parser.add_argument("--errors", action="store_true", help="list the gold set's errors")
    parser.add_argument("--world", type=int, default=1000, help="world val records to score")
    parser.add_argument("--sample", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    gold_report(args.gold, args.errors)
    if args.gold_only:
        return 0
    print(f"\n## World ({args.world} val records, seed {args.seed})")
    for key, value in world_scores(args.world, args.seed).items():
        print(f"- {key}: {value:.4f}")
    captions = load_sugarcrepe(args.data)
    shares, reasons = coverage(captions)
    print(f"\n## SugarCrepe coverage ({len(captions)} captions)")
    for key, value in shares.items():
        print(f"- {key}: {value:.4f}" if isinstance(value, float) else f"- {key}: {value}")
    print("\nRejections by reason: " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
    print(f"\n## Sample of {args.sample} unique captions (seed {args.seed})\n")
    print(sample_table(captions, args.sample, args.seed))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

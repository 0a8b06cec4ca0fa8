"""What the SPEC §3 sampler actually draws: the share of relation slots at
N = 1..4 for several relation_prob, the share of each relation-foil type, and the share of
each caption-negative kind, on synthetic-world records and on SugarCrepe captions run
through the rules extractor.

    PYTHONPATH=. .venv/bin/python benchmarks/sampler_shares.py            # print the tables
    PYTHONPATH=. .venv/bin/python benchmarks/sampler_shares.py --write    # and put them in docs/research/sampler_shares.md

Shares are counted over records x epochs with the sampler's own seeding. "eligible" counts
only records that have both an entity and a relation with a foil: there `relation_prob`
should be the share of relation slots. Relation-foil types are read off the drawn text (a
stored antonym / negation / swap foil, or a subject / object replaced by one of its
entity's foils), so the script measures any version of csclip.train.sampling alike.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from extraction_quality import DEFAULT_DATA, load_sugarcrepe  # noqa: E402
from perfdoc import write_section  # noqa: E402

from csclip.config.train import SamplingConfig
from csclip.train.sampling import (
    draw_caption_negative,
    draw_unit_slots,
    entity_foil_candidates,
    relation_foil_candidates,
    sample_rng,
)
from csclip.units import UnitsRecord, normalize_text, render_relation  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "research" / "sampler_shares.md"
HEADING = "## Sampler shares (benchmarks/sampler_shares.py)"
RELATION_PROBS = (0.0, 0.25, 0.5, 0.75, 1.0)
FOIL_TYPES = ("antonym", "negation", "subject_object_swap", "subject_replace", "object_replace", "other")


def world_records(num: int, seed: int) -> list[UnitsRecord]:
    from csclip.config.world import WorldConfig
    from csclip.world import iter_world

    config = WorldConfig(seed=seed, num_train=num, num_val=1, num_test=1)
    return list(iter_world(config, splits=("train",)))


def sugarcrepe_records(directory: Path, limit: int) -> list[UnitsRecord]:
    """Unique SugarCrepe positive captions with the rules backend's validated units."""
    from csclip.extract.backends import rules_outcome

    captions = list(dict.fromkeys(load_sugarcrepe(directory)))[:limit]
    records = []
    for number, caption in enumerate(captions):
        row = {"sample_id": f"sc-{number:06d}", "image_id": f"sc-{number:06d}",
               "caption": caption, "split": "train"}
        outcome = rules_outcome(row)
        if outcome.record is not None:
            records.append(outcome.record)
    return records


def _has_both(record: UnitsRecord, config: SamplingConfig) -> bool:
    return (any(entity_foil_candidates(e) for e in record.entities)
            and any(relation_foil_candidates(r, record, config.use_negation) for r in record.relations))


def relation_slot_shares(records: Sequence[UnitsRecord], epochs: int, seed: int,
                         ) -> dict[tuple[float, int], tuple[float, float]]:
    """(relation_prob, N) -> (share of relation slots over all filled slots, the same over
    eligible records)."""
    shares = {}
    for relation_prob in RELATION_PROBS:
        for n in range(1, 5):
            config = SamplingConfig(num_unit_slots=n, relation_prob=relation_prob)
            eligible = [_has_both(r, config) for r in records]
            counts, eligible_counts = Counter(), Counter()
            for epoch in range(epochs):
                for record, is_eligible in zip(records, eligible, strict=True):
                    slots = draw_unit_slots(record, config, sample_rng(seed, record.sample_id, epoch))
                    kinds = Counter(s.kind for s in slots)
                    counts.update(kinds)
                    if is_eligible:
                        eligible_counts.update(kinds)
            shares[relation_prob, n] = (_share(counts, "relation"), _share(eligible_counts, "relation"))
    return shares


def _share(counts: Counter, key: str) -> float:
    total = sum(counts.values())
    return counts[key] / total if total else float("nan")


def _foil_type(record: UnitsRecord, unit_text: str, foil_text: str) -> str:
    relation = next(r for r in record.relations if r.text == unit_text)
    foil = normalize_text(foil_text)
    for stored in relation.foils:
        if normalize_text(stored.text) == foil:
            return stored.change_type.value
    entities = {normalize_text(e.text): e for e in record.entities}
    subject = entities.get(normalize_text(relation.subject or ""))
    obj = entities.get(normalize_text(relation.object or ""))
    for f in subject.foils if subject else ():
        if normalize_text(render_relation(f.text, relation.predicate or "", relation.object or "")) == foil:
            return "subject_replace"
    for f in obj.foils if obj else ():
        if normalize_text(render_relation(relation.subject or "", relation.predicate or "", f.text)) == foil:
            return "object_replace"
    return "other"


def relation_foil_shares(records: Sequence[UnitsRecord], epochs: int, seed: int,
                         config: SamplingConfig) -> tuple[dict[str, float], int]:
    """Share of each relation-foil type among relation slots, and the number of slots."""
    counts: Counter[str] = Counter()
    for epoch in range(epochs):
        for record in records:
            for slot in draw_unit_slots(record, config, sample_rng(seed, record.sample_id, epoch)):
                if slot.kind == "relation":
                    counts[_foil_type(record, slot.unit, slot.foil)] += 1
    total = sum(counts.values())
    return {t: counts[t] / total if total else float("nan") for t in FOIL_TYPES}, total


def negative_kind_shares(records: Sequence[UnitsRecord], epochs: int, seed: int,
                         config: SamplingConfig) -> dict[str, float]:
    counts: Counter[str] = Counter()
    for epoch in range(epochs):
        for record in records:
            negative = draw_caption_negative(record, config, sample_rng(seed, record.sample_id, epoch))
            counts[str(negative.kind)] += 1
    total = sum(counts.values())
    return {kind: n / total for kind, n in sorted(counts.items())}


def _pct(value: float) -> str:
    return "-" if value != value else f"{100 * value:.1f}"


def _table(header: Iterable[str], rows: Iterable[Iterable[str]]) -> list[str]:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def section(datasets: dict[str, Sequence[UnitsRecord]], epochs: int, seed: int,
            command: str) -> str:
    defaults = SamplingConfig()
    lines = [HEADING, "", f"Command: `{command}`. Records x {epochs} epochs, seed {seed}; "
             f"sampler defaults: {defaults.model_dump()}.", ""]
    for name, records in datasets.items():
        eligible = sum(_has_both(r, defaults) for r in records)
        lines += [f"### {name}: {len(records)} records ({eligible} with both an entity and a "
                  "relation that have foils)", "",
                  "Relation-slot share, % (all records / records with both kinds; a sample that "
                  "lacks one kind fills every slot with the other):", ""]
        shares = relation_slot_shares(records, epochs, seed)
        lines += _table(["relation_prob", *(f"N={n}" for n in range(1, 5))],
                        [[f"{p:g}", *(f"{_pct(shares[p, n][0])} / {_pct(shares[p, n][1])}"
                                      for n in range(1, 5))] for p in RELATION_PROBS])
        foil_config = SamplingConfig(num_unit_slots=2, relation_prob=1.0)
        foils, num_slots = relation_foil_shares(records, epochs, seed, foil_config)
        lines += ["", f"Relation-foil types, % of {num_slots} relation slots (N=2, relation_prob 1.0, "
                  "other sampler fields at their defaults):", ""]
        lines += _table(FOIL_TYPES, [[_pct(foils[t]) for t in FOIL_TYPES]])
        for label, config in (("sampler defaults", defaults),
                              ("swap_prob 0.5, inplace_prob 0.5",
                               SamplingConfig(swap_prob=0.5, inplace_prob=0.5)),
                              ("swap_prob 0, inplace_prob 0",
                               SamplingConfig(swap_prob=0.0, inplace_prob=0.0))):
            kinds = negative_kind_shares(records, epochs, seed, config)
            lines += ["", f"Caption-negative kinds, % ({label}):", ""]
            lines += _table(kinds, [[_pct(v) for v in kinds.values()]])
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=400, help="world train records")
    parser.add_argument("--sugarcrepe", type=int, default=1500, help="unique SugarCrepe captions")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write", action="store_true", help="replace the section in docs/research/sampler_shares.md")
    args = parser.parse_args(argv)
    datasets = {"World (seed 0, train)": world_records(args.world, args.seed),
                "SugarCrepe, rules backend": sugarcrepe_records(args.data, args.sugarcrepe)}
    command = "PYTHONPATH=. .venv/bin/python benchmarks/sampler_shares.py" + (
        f" --world {args.world}" if args.world != 400 else "") + (
        f" --sugarcrepe {args.sugarcrepe}" if args.sugarcrepe != 1500 else "")
    text = section(datasets, args.epochs, args.seed, command)
    print(text)
    if args.write:
        write_section(HEADING, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())

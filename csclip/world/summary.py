"""Counts over world records (per split, per change_type, per caption template) and a
markdown-ish rendering of them, for `make demo` and the writer's report."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from csclip.units import ChangeType, UnitsRecord


@dataclass(frozen=True)
class WorldSummary:
    """What a set of world records contains. `files` lists what `write_world` wrote."""

    num_records: int
    split_counts: dict[str, int]
    change_type_counts: dict[str, int]
    template_counts: dict[str, int]
    num_entities: int
    num_relations: int
    examples: tuple[UnitsRecord, ...] = ()
    files: tuple[str, ...] = ()
    uri: str | None = None


@dataclass
class SummaryBuilder:
    """Accumulates a WorldSummary one record at a time (constant memory)."""

    num_examples: int = 3
    splits: Counter = field(default_factory=Counter)
    change_types: Counter = field(default_factory=Counter)
    templates: Counter = field(default_factory=Counter)
    num_entities: int = 0
    num_relations: int = 0
    examples: list[UnitsRecord] = field(default_factory=list)

    def add(self, record: UnitsRecord) -> None:
        self.splits[record.split] += 1
        self.templates[record.meta.get("template", "unknown")] += 1
        self.num_entities += len(record.entities)
        self.num_relations += len(record.relations)
        for unit in record.units:
            self.change_types.update(f.change_type.value for f in unit.foils)
        if len(self.examples) < self.num_examples:
            self.examples.append(record)

    def build(self, files: Iterable[str] = (), uri: str | None = None) -> WorldSummary:
        return WorldSummary(
            num_records=sum(self.splits.values()), split_counts=dict(self.splits),
            # Every change_type is listed, zeros included, so a missing kind shows up.
            change_type_counts={c.value: self.change_types[c.value] for c in ChangeType},
            template_counts=dict(sorted(self.templates.items())),
            num_entities=self.num_entities, num_relations=self.num_relations,
            examples=tuple(self.examples), files=tuple(files), uri=uri)


def summarize(records: Iterable[UnitsRecord], num_examples: int = 3) -> WorldSummary:
    """Count records per split, foils per change_type and captions per template; keep the
    first `num_examples` records as examples. Streams: `records` may be a generator."""
    builder = SummaryBuilder(num_examples=num_examples)
    for record in records:
        builder.add(record)
    return builder.build()


def _table(header: tuple[str, str], rows: Iterable[tuple[str, object]]) -> list[str]:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---:|"]
    return lines + [f"| {name} | {value} |" for name, value in rows]


def format_summary(summary: WorldSummary) -> str:
    """The summary as markdown tables plus a few example captions with their units."""
    per_record = max(summary.num_records, 1)
    lines = [f"World: {summary.num_records} samples, "
             f"{summary.num_entities / per_record:.2f} entities and "
             f"{summary.num_relations / per_record:.2f} relations per caption"]
    if summary.uri:
        lines.append(f"written to {summary.uri} ({len(summary.files)} files)")
    lines += [""] + _table(("split", "samples"), summary.split_counts.items())
    lines += [""] + _table(("change_type", "foils"), summary.change_type_counts.items())
    lines += [""] + _table(("template", "captions"), summary.template_counts.items())
    if summary.examples:
        lines += ["", "Examples:"]
    for record in summary.examples:
        lines.append(f"- {record.sample_id}: {record.caption}")
        for unit in record.units:
            foils = "; ".join(f"{f.text} ({f.change_type.value})" for f in unit.foils)
            lines.append(f"    {unit.kind} '{unit.text}' -> {foils or 'no foils'}")
    return "\n".join(lines)

"""Scoring a unit extractor against a hand-annotated gold set of real captions.

The gold set (tests/gold/, see its README) holds, per caption, the entities it says are
there, its relations as (subject, predicate, object), and the nouns it says are *absent*
("no passengers", "without a kite", "shirtless"). Units are compared by their head nouns,
so that an extractor is not punished for keeping or dropping one adjective:

- entity precision / recall / F1 on the set of entity heads of each caption;
- relation precision / recall / F1 on the set of (subject head, object head) pairs;
- predicate exact rate: of the matched relations, the share whose predicate is the gold one;
- attribute exact rate: of the matched entities, the share whose whole text is the gold one;
- negation errors: captions where an absent noun comes out as a present entity or as a
  relation argument (the half-truth a training unit must never teach).

Counts are micro-averaged over captions, and reported for the whole set and per split
("tune", what the rules were developed on, and "heldout", never looked at while tuning).

`score_against_gold` scores units against gold `UnitsRecord`s instead (the synthetic
world's, matched on normalized text); both count with the one `PRF`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from csclip.errors import DataError
from csclip.extract import lexicon as lx
from csclip.extract.rules import RulesResult, extract_units
from csclip.units import Unit, UnitsRecord, normalize_text

# "X of Y" phrases whose object is the thing ("a group of people", "a slice of pizza",
# "different types of couches"); other "X of Y" are the X ("a box of pizza", "a plate of food").
_OF_HEADS_AFTER = frozenset(
    "group groups bunch bunches herd herds flock flocks couple pair pairs few pile piles "
    "stack stacks row rows line lines set sets crowd crowds team teams variety assortment "
    "collection lot lots number plenty slice slices piece pieces type types kind kinds "
    "rest top side half variety sort sorts".split()
)


def entity_head(text: str) -> str:
    """The head noun of an entity text, singular: "three boxes of pizza" -> "box",
    "group of small children" -> "child", "woman's head" -> "head"."""
    words = normalize_text(text).split()
    while "of" in words[:-1]:
        at = words.index("of")
        if at > 0 and words[at - 1] in _OF_HEADS_AFTER:
            words = words[at + 1 :]
        else:
            words = words[:at]
            break
    if not words:
        return ""
    word = words[-1]
    if word.endswith("'s"):
        word = word[:-2]
    return singular(word)


def singular(word: str) -> str:
    """The singular of a noun: the lexicon's when it knows the word, else by suffix."""
    noun = lx.NOUNS.get(word)
    if noun is not None and " " not in noun.singular:
        return noun.singular
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("ches", "shes", "sses", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) > 3:
        return word[:-1]
    return word


@dataclass(frozen=True)
class GoldCaption:
    """One hand-annotated caption."""

    sample_id: str
    split: str  # "tune" | "heldout"
    caption: str
    entities: tuple[str, ...]
    relations: tuple[tuple[str, str, str], ...]
    absent: tuple[str, ...] = ()


def load_gold(path: Path) -> list[GoldCaption]:
    """Read a gold JSONL file (one caption per line).

    Raises:
        DataError: a line is not JSON, lacks a field, or has a relation argument that is
            not one of its entities.
    """
    gold: list[GoldCaption] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            relations = tuple((r["subject"], r["predicate"], r["object"])
                              for r in row["relations"])
            item = GoldCaption(row["sample_id"], row["split"], row["caption"],
                               tuple(row["entities"]), relations, tuple(row.get("absent", ())))
        except (json.JSONDecodeError, KeyError, TypeError) as error:
            raise DataError(f"{path}:{number}: not a gold caption ({error})") from None
        for subject, _, obj in relations:
            if subject not in item.entities or obj not in item.entities:
                raise DataError(f"{path}:{number}: relation argument not among its entities")
        gold.append(item)
    return gold


@dataclass(frozen=True)
class Prediction:
    """What an extractor said about one caption."""

    entities: tuple[Unit, ...]
    relations: tuple[Unit, ...]
    absent: tuple[str, ...] = ()


@dataclass
class PRF:
    """Precision, recall and F1 with the counts behind them, counted set by set."""

    true_positives: int = 0
    false_positives: int = 0
    false_negatives: int = 0

    def add(self, found: set, wanted: set) -> None:
        """Count one caption's (or record's) predicted set against its gold set."""
        self.true_positives += len(found & wanted)
        self.false_positives += len(found - wanted)
        self.false_negatives += len(wanted - found)

    @property
    def precision(self) -> float:
        found = self.true_positives + self.false_positives
        return self.true_positives / found if found else 0.0

    @property
    def recall(self) -> float:
        wanted = self.true_positives + self.false_negatives
        return self.true_positives / wanted if wanted else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


@dataclass
class GoldScores:
    """Scores of one split (or all) of the gold set, with the errors behind them."""

    captions: int = 0
    entity: PRF = field(default_factory=PRF)
    relation: PRF = field(default_factory=PRF)
    absent: PRF = field(default_factory=PRF)
    predicates_matched: int = 0
    predicates_exact: int = 0
    attributes_matched: int = 0
    attributes_exact: int = 0
    negation_errors: list[tuple[str, str]] = field(default_factory=list)  # (id, noun)
    captions_with_absent: int = 0

    def as_dict(self) -> dict[str, float]:
        """Flat metrics for tables and tests."""
        out: dict[str, float] = {"captions": float(self.captions)}
        for name, counts in (("entity", self.entity), ("relation", self.relation),
                             ("absent", self.absent)):
            out.update({f"{name}_precision": counts.precision, f"{name}_recall": counts.recall,
                        f"{name}_f1": counts.f1})
        out["predicate_exact"] = (self.predicates_exact / self.predicates_matched
                                  if self.predicates_matched else 0.0)
        out["attribute_exact"] = (self.attributes_exact / self.attributes_matched
                                  if self.attributes_matched else 0.0)
        out["negation_error_captions"] = float(len({i for i, _ in self.negation_errors}))
        out["captions_with_absent"] = float(self.captions_with_absent)
        return out


def relation_pairs(relations: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], set]:
    """(subject head, object head) -> the normalized predicates between them."""
    pairs: dict[tuple[str, str], set] = {}
    for subject, predicate, obj in relations:
        key = (entity_head(subject), entity_head(obj))
        pairs.setdefault(key, set()).add(normalize_text(predicate))
    return pairs


def score_caption(gold: GoldCaption, predicted: Prediction, into: GoldScores) -> None:
    """Add one caption's counts to `into`."""
    into.captions += 1
    found_entities = {entity_head(u.text): normalize_text(u.text) for u in predicted.entities}
    wanted_entities = {entity_head(t): normalize_text(t) for t in gold.entities}
    into.entity.add(set(found_entities), set(wanted_entities))
    for head in set(found_entities) & set(wanted_entities):
        into.attributes_matched += 1
        into.attributes_exact += found_entities[head] == wanted_entities[head]
    found = relation_pairs((u.subject or "", u.predicate or "", u.object or "")
                            for u in predicted.relations)
    wanted = relation_pairs(gold.relations)
    into.relation.add(set(found), set(wanted))
    for key in set(found) & set(wanted):
        into.predicates_matched += 1
        into.predicates_exact += bool(found[key] & wanted[key])
    absent = {entity_head(t) for t in gold.absent}
    into.captions_with_absent += bool(absent)
    into.absent.add({entity_head(t) for t in predicted.absent}, absent)
    present = set(found_entities) | {h for pair in found for h in pair}
    for noun in sorted(absent & present):
        into.negation_errors.append((gold.sample_id, noun))


def score_gold(gold: Sequence[GoldCaption],
               extract: Callable[[str], Prediction]) -> dict[str, GoldScores]:
    """Scores of `extract` on the gold set: keys "all", "tune" and "heldout"."""
    scores = {"all": GoldScores(), "tune": GoldScores(), "heldout": GoldScores()}
    for item in gold:
        predicted = extract(item.caption)
        for key in ("all", item.split):
            score_caption(item, predicted, scores.setdefault(key, GoldScores()))
    return scores


@dataclass(frozen=True)
class ExtractionScores:
    """Entity and relation P/R/F1 of predicted units against gold, micro-averaged over
    records, units matched on normalized text."""

    entity: PRF
    relation: PRF
    num_records: int

    def as_dict(self) -> dict[str, float]:
        """Flat metrics (`entity_precision`, ..., `relation_f1`) for tables and MLflow."""
        out: dict[str, float] = {"num_records": float(self.num_records)}
        for name, prf in (("entity", self.entity), ("relation", self.relation)):
            out[f"{name}_precision"] = prf.precision
            out[f"{name}_recall"] = prf.recall
            out[f"{name}_f1"] = prf.f1
        return out


def score_against_gold(predicted: Sequence[UnitsRecord] | Sequence[RulesResult],
                       gold: Sequence[UnitsRecord]) -> ExtractionScores:
    """Score predicted units against gold units, record by record (same order).

    Raises:
        DataError: the two sequences differ in length, or records' sample_ids differ.
    """
    if len(predicted) != len(gold):
        raise DataError(f"{len(predicted)} predicted records but {len(gold)} gold records; "
                        "score the same captions in the same order")
    entity, relation = PRF(), PRF()
    for pred, ref in zip(predicted, gold, strict=True):
        if isinstance(pred, UnitsRecord) and pred.sample_id != ref.sample_id:
            raise DataError(f"predicted record {pred.sample_id!r} is paired with gold "
                            f"{ref.sample_id!r}; sort both by sample_id")
        for counts, mine, theirs in ((entity, pred.entities, ref.entities),
                                     (relation, pred.relations, ref.relations)):
            counts.add({normalize_text(u.text) for u in mine},
                       {normalize_text(u.text) for u in theirs})
    return ExtractionScores(entity, relation, len(gold))


def rules_prediction(caption: str) -> Prediction:
    """The rules backend's reading of a caption, as a `Prediction`."""
    result = extract_units(caption)
    return Prediction(result.entities, result.relations, result.absent)


def markdown_table(scores: dict[str, GoldScores]) -> str:
    """The gold-set table of docs/extraction.md."""
    rows = ["| split | captions | entity P / R / F1 | relation P / R / F1 | predicate exact "
            "| attribute exact | negation errors |", "|---|---|---|---|---|---|---|"]
    for key in ("tune", "heldout", "all"):
        s = scores[key].as_dict()
        rows.append(
            f"| {key} | {int(s['captions'])} | {s['entity_precision']:.3f} / "
            f"{s['entity_recall']:.3f} / {s['entity_f1']:.3f} | {s['relation_precision']:.3f} / "
            f"{s['relation_recall']:.3f} / {s['relation_f1']:.3f} | {s['predicate_exact']:.3f} "
            f"| {s['attribute_exact']:.3f} | {int(s['negation_error_captions'])} of "
            f"{int(s['captions_with_absent'])} |")
    return "\n".join(rows)

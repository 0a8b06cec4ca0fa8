"""entity_change foils under the two half-truth protocols. The authors' generator keeps
`entity_change` ("woman -> man") as its own type and their builder takes only
`object_change` for +Obj, Rel:Obj and Subj: the paper protocol does the same from a units
table (their files read by csclip.authors, or `--prompts authors` units), checked item for
item against their builder's output (tests/fixtures/halftruth_paper/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from csclip.authors import (
    ENTITY_CHANGE_NAMES_META,
    entity_foil_names,
    parse_record,
    read_authors_units,
    read_verbatim_records,
)
from csclip.eval.halftruth import (
    build_half_truth_benchmark,
    build_paper_benchmark,
    verbatim_from_units,
)
from csclip.units import ChangeType, records_to_table, table_to_records

FIXTURES = Path(__file__).parent / "fixtures" / "halftruth_paper"
UNITS = FIXTURES / "units_entity_change.json"
THEIR_CONDITIONS = {
    "component_easy": "obj", "component_hard": "attr", "component_random": "rand",
    "relation_swap": "swap", "relation_antonym": "ant", "relation_negation": "neg",
    "object_wrong": "rel_obj", "subject_wrong": "subj", "attribute_wrong": "rel_attr",
}


def _theirs() -> list[tuple[str, str, str, str, str]]:
    items = json.loads((FIXTURES / "theirs_entity_change_n1000.json").read_text())["items"]
    return [(i["sample_id"], THEIR_CONDITIONS[i["condition"]], i["anchor"], i["completion"],
             i["half_truth"]) for i in items]


def _paper_items(records) -> list[tuple[str, str, str, str, str]]:
    bench = build_paper_benchmark([verbatim_from_units(r) for r in records], 1000, 42)
    return [(i.sample_id, i.condition, i.anchor, i.completion, i.half_truth) for i in bench.items]


def _training_entry(older: dict) -> dict:
    """The record in the training schema, as `--prompts authors` writes it (entities,
    negative_entities, each relation with its own negatives)."""
    relations = [{**r, "negatives": [n for n in older["negative_relations"]
                                     if (n["subject"], n["object"]) == (r["subject"], r["object"])]}
                 for r in older["relations"]]
    return {"sample_id": older["sample_id"], "original_caption": older["original_caption"],
            "entities": older["positive_components"],
            "negative_entities": older["negative_components"], "relations": relations,
            "image_path": older["image_path"]}


def test_units_table_paper_items_equal_their_builders_on_entity_change_foils():
    read = read_authors_units(UNITS)
    records = table_to_records(records_to_table(read.records))  # through the units table
    assert _paper_items(records) == _theirs()


def test_prompts_authors_units_paper_items_equal_their_builders():
    # derived_outcome (csclip.extract.answers) reads a `--prompts authors` entry with
    # parse_record, as here.
    raw = json.loads(UNITS.read_text())
    records = [parse_record(_training_entry(r), r["sample_id"], sample_id=r["sample_id"]).record
               for r in raw]
    assert _paper_items(records) == _theirs()


def test_their_unit_file_read_verbatim_gives_the_same_items():
    bench = build_paper_benchmark(read_verbatim_records(str(UNITS)), 1000, 42)
    assert [(i.sample_id, i.condition, i.anchor, i.completion, i.half_truth)
            for i in bench.items] == _theirs()


def test_entity_change_is_an_object_change_that_keeps_its_written_name():
    record = read_authors_units(UNITS).records[0]
    horse = next(e for e in record.entities if e.text == "brown horse")
    assert [(f.text, f.change_type) for f in horse.foils] == [
        ("brown cow", ChangeType.OBJECT_CHANGE), ("white horse", ChangeType.ATTRIBUTE_CHANGE)]
    assert json.loads(record.meta[ENTITY_CHANGE_NAMES_META]) == [
        ["man", "woman", "entity_change"], ["brown horse", "brown cow", "entity_change"]]
    assert entity_foil_names(record)["brown horse"] == (
        ("brown cow", "entity_change"), ("white horse", "attribute_change"))


def test_csclip_protocol_counts_entity_change_as_object_change():
    # Ours decides for itself (docs/evaluation.md): "woman -> man" changes the head noun to
    # another of its category, SPEC's object_change, so +Obj, Rel:Obj and Subj use it.
    record = read_authors_units(UNITS).records[0]  # man's and horse's object foils: entity_change
    items = build_half_truth_benchmark([record]).items
    half_truths = {i.condition: i.half_truth for i in items}
    assert half_truths["obj"] in ("man and brown cow", "brown horse and woman")
    assert half_truths["subj"] == "woman is riding horse"

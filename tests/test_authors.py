"""The authors' unit formats read into UnitsRecords; malformed records are counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csclip.errors import DataError
from csclip.extract.authors import read_authors_units
from csclip.units import ChangeType, RejectReason, records_to_table, table_to_records

FIXTURES = Path(__file__).parent / "fixtures"


def test_training_format_reads_entities_relations_and_foils():
    result = read_authors_units(FIXTURES / "authors_train.json")
    by_id = {r.sample_id: r for r in result.records}
    record = by_id["coco_391895_0"]
    assert record.caption == "A man with a red helmet on a small moped on a dirt road."
    assert record.image_path == "val2014/COCO_val2014_000000391895.jpg"
    assert record.image_id == "COCO_val2014_000000391895"
    assert [e.text for e in record.entities] == ["man", "red helmet", "small moped", "dirt road"]
    helmet = record.entities[1]
    assert [(f.text, f.change_type) for f in helmet.foils] == [
        ("blue helmet", ChangeType.ATTRIBUTE_CHANGE), ("red cap", ChangeType.OBJECT_CHANGE)]
    riding = record.relations[0]
    assert riding.text == "man is on small moped"
    foils = {f.change_type: f for f in riding.foils}
    assert foils[ChangeType.ANTONYM].text == "man is under small moped"
    assert foils[ChangeType.NEGATION].predicate == "is not on"
    swap = foils[ChangeType.SUBJECT_OBJECT_SWAP]
    assert (swap.subject, swap.predicate, swap.object) == ("small moped", "is on", "man")
    assert record.source == "authors_json"


def test_training_format_counts_each_malformed_record_with_its_reason():
    result = read_authors_units(FIXTURES / "authors_train.json")
    assert result.num_read == 7
    assert len(result.records) == 2
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert reasons == {
        "bad_missing_caption": RejectReason.MISSING_FIELD,
        "bad_entities_type": RejectReason.WRONG_TYPE,
        "bad_empty_caption": RejectReason.EMPTY_CAPTION,
        "bad_change_type": RejectReason.UNKNOWN_CHANGE_TYPE,
        None: RejectReason.WRONG_TYPE,
    }
    located = {r.sample_id: r for r in result.rejections}
    assert located["bad_missing_caption"].position == "authors_train.json[2]"
    assert "original_caption" in located["bad_missing_caption"].detail
    assert "colour_swap" in located["bad_change_type"].detail
    assert result.counts_by_reason()["wrong_type"] == 2


def test_eval_format_reads_components_keyed_by_id():
    result = read_authors_units(FIXTURES / "authors_eval.json", split="val")
    by_id = {r.sample_id: r for r in result.records}
    record = by_id["397133"]
    assert record.split == "val"
    assert [e.text for e in record.entities] == ["man", "kitchen", "pizzas"]
    assert record.entities[0].foils[0].text == "woman"
    (relation,) = record.relations
    assert relation.text == "man is in kitchen"
    assert {f.text for f in relation.foils} == {"man is outside kitchen", "kitchen is in man"}
    rejected = {r.sample_id: r.reason for r in result.rejections}
    # bare-string negatives carry no change_type; a record without a caption is located
    assert rejected == {"37777": RejectReason.UNKNOWN_CHANGE_TYPE, "87038": RejectReason.MISSING_FIELD}


def test_both_formats_round_trip_through_the_units_table(tmp_path):
    records = read_authors_units([FIXTURES / "authors_train.json", FIXTURES / "authors_eval.json"]).records
    assert len(records) == 3
    assert table_to_records(records_to_table(records)) == records


def test_json_lines_with_a_broken_line(tmp_path):
    good = json.loads((FIXTURES / "authors_train.json").read_text())[1]
    path = tmp_path / "units.jsonl"
    path.write_text(json.dumps(good) + "\n{not json\n\n" + json.dumps({**good, "sample_id": "b"}) + "\n")
    result = read_authors_units(path)
    assert [r.sample_id for r in result.records] == ["coco_522418_0", "b"]
    (rejection,) = result.rejections
    assert rejection.reason == RejectReason.MALFORMED_JSON and rejection.position == "units.jsonl:2"


def test_missing_file_and_non_json_file_raise_clear_errors(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_authors_units(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("[{]")
    with pytest.raises(DataError, match="bad.json: not valid JSON"):
        read_authors_units(bad)

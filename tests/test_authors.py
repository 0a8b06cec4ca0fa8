"""The authors' unit files, in the formats their released code writes (hand-written
fixtures), read into UnitsRecords without loss: both key schemas, every change-type name,
foil-level rejections, all problems of a rejected record, and the extraction entry point
(`--backend authors`) writing the units and rejects tables with read = loaded + rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csclip.authors import (
    CHANGE_TYPE_NAMES,
    RELATION_OPPOSITE,
    expand_uri,
    read_authors_units,
)
from csclip.errors import DataError
from csclip.units import ChangeType, RejectReason, read_units, records_to_table, table_to_records

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
    assert len(result.records) + len(result.rejections) == 7  # every record read
    assert len(result.records) == 3
    reasons = {r.sample_id: r.reason for r in result.rejections}
    assert reasons == {
        "bad_missing_caption": RejectReason.MISSING_FIELD,
        "bad_entities_type": RejectReason.WRONG_TYPE,
        "bad_empty_caption": RejectReason.EMPTY_CAPTION,
        "authors_train-00000006": RejectReason.WRONG_TYPE,  # "not an object": id from its position
    }
    located = {r.sample_id: r for r in result.rejections}
    assert located["bad_missing_caption"].position == "authors_train.json[2]"
    assert "original_caption" in located["bad_missing_caption"].detail
    assert result.counts_by_reason()["wrong_type"] == 2


def test_unknown_change_type_drops_that_foil_not_the_record():
    result = read_authors_units(FIXTURES / "authors_train.json")
    record = {r.sample_id: r for r in result.records}["bad_change_type"]
    assert [e.text for e in record.entities] == ["black cat", "bed"]
    assert record.entities[0].foils == ()
    (dropped,) = [r for r in result.item_rejections if r.sample_id == "bad_change_type"]
    assert dropped.reason == RejectReason.UNKNOWN_CHANGE_TYPE and "colour_swap" in dropped.detail
    assert [r.reason for r in result.item_rejections] == [RejectReason.UNKNOWN_CHANGE_TYPE]


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
    assert rejected == {"87038": RejectReason.MISSING_FIELD}
    # A bare-string negative carries no change_type: that foil is dropped, counted.
    fruit = by_id["37777"]
    assert [e.text for e in fruit.entities] == ["dining table", "kitchen", "bowl of fruit"]
    assert all(not e.foils for e in fruit.entities)
    assert [(r.sample_id, r.reason) for r in result.item_rejections] == [
        ("37777", RejectReason.UNKNOWN_CHANGE_TYPE)]


def test_both_formats_round_trip_through_the_units_table(tmp_path):
    records = read_authors_units([FIXTURES / "authors_train.json", FIXTURES / "authors_eval.json"]).records
    assert len(records) == 5
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


# ---------------------------------------------------------------------------------------
# The older key schema (their neg_pipeline/unified_generation.py)
# ---------------------------------------------------------------------------------------

def _foils(unit) -> dict[str, ChangeType]:
    return {f.text: f.change_type for f in unit.foils}


def test_older_schema_loads_top_level_relations_and_their_foils():
    result = read_authors_units(FIXTURES / "authors_older.json")
    by_id = {r.sample_id: r for r in result.records}
    record = by_id["coco_12_60"]
    assert record.caption == "A child holding a red umbrella next to a wooden bench."
    assert record.split == "train"  # Karpathy's restval trains, as everywhere
    assert record.source == "authors_older_json"
    assert [e.text for e in record.entities] == ["child", "red umbrella", "wooden bench"]
    assert _foils(record.entities[0]) == {"adult": ChangeType.OBJECT_CHANGE}   # entity_change
    assert _foils(record.entities[2]) == {"metal bench": ChangeType.ATTRIBUTE_CHANGE}  # material
    holding, next_to = record.relations
    assert holding.text == "child is holding red umbrella"
    # Top-level negative_relations matched as the authors' sampler does: the same
    # (subject, object) for a predicate edit, the reversed pair for a swap.
    assert _foils(holding) == {
        "child is dropping red umbrella": ChangeType.ANTONYM,       # relation_opposite
        "child is not holding red umbrella": ChangeType.NEGATION,   # relation_opposite + "not"
        "red umbrella is holding child": ChangeType.SUBJECT_OBJECT_SWAP,
    }
    assert _foils(next_to) == {"red umbrella is far from wooden bench": ChangeType.ANTONYM}
    assert by_id["coco_30_151"].split == "val" and len(by_id["coco_30_151"].relations) == 1


def test_older_schema_counts_every_foil_it_cannot_use():
    result = read_authors_units(FIXTURES / "authors_older.json")
    dropped = [(r.sample_id, r.reason, r.detail) for r in result.item_rejections]
    reasons = [reason for _, reason, _ in dropped]
    assert reasons.count(RejectReason.UNKNOWN_CHANGE_TYPE) == 2  # bare "stone bench", furniture_swap
    assert reasons.count(RejectReason.UNMATCHED_NEGATIVE) == 2   # "dog" foil, "child is under bench"
    assert any("'dog'" in detail for *_, detail in dropped)
    assert any("negative_relations[4]" in detail for *_, detail in dropped)


def test_rejected_record_lists_all_its_problems():
    for fixture, sample_id, expected in (
            ("authors_older.json", "coco_31_152", ["'original_caption'", "'positive_components'",
                                                   "'negative_components'", "'relations'", "'image_path'"]),
            ("authors_change_types.json", "many_problems", ["'original_caption'", "'entities'",
                                                            "'negative_entities'", "'image_path'"])):
        result = read_authors_units(FIXTURES / fixture)
        (rejection,) = [r for r in result.rejections if r.sample_id == sample_id]
        assert rejection.reason == RejectReason.MISSING_FIELD  # the first problem's reason
        for name in expected:
            assert name in rejection.detail, (name, rejection.detail)
        assert rejection.detail.count(";") == len(expected) - 1


# ---------------------------------------------------------------------------------------
# Change-type names
# ---------------------------------------------------------------------------------------

EXPECTED_ENTITY_TYPES = {
    "old man": "attribute_change", "young woman": "object_change", "young boy": "object_change",
    "young chef": "object_change", "young girl": "object_change", "red cap": "object_change",
    "blue helmet": "attribute_change", "large helmet": "attribute_change",
    "leather helmet": "attribute_change", "square helmet": "attribute_change",
    "broken helmet": "attribute_change", "small bicycle": "object_change",
    "parked moped": "object_change", "small moped overhead": "object_change",
    "snowy road": "object_change", "forest": "object_change",
}
EXPECTED_RELATION_TYPES = {
    "cat is under table": "antonym", "cat is not sitting on table": "negation",
    "table is sitting on cat": "subject_object_swap",
    "person is standing next to horse": "antonym", "person is feeding horse": "antonym",
    "person is leading horse": "antonym", "person is falling off horse": "antonym",
    "person is not riding horse": "negation", "horse is riding person": "subject_object_swap",
    "lamp is above tree": "subject_replace", "bird is above lamp": "object_replace",
}


def test_every_change_type_name_of_the_authors_maps_to_ours():
    raw = json.loads((FIXTURES / "authors_change_types.json").read_text())
    written = {n["change_type"].lower() for r in raw[:2]
               for n in [*(x for v in r["negative_entities"].values() for x in v),
                         *(x for rel in r["relations"] for x in rel["negatives"])]}
    # The fixture uses every name the mapping knows (and two it does not).
    assert set(CHANGE_TYPE_NAMES) | {RELATION_OPPOSITE} <= written
    result = read_authors_units(FIXTURES / "authors_change_types.json")
    by_id = {r.sample_id: r for r in result.records}
    entity_types = {f.text: f.change_type.value for e in by_id["names_entities"].entities for f in e.foils}
    relation_types = {f.text: f.change_type.value for r in by_id["names_relations"].relations for f in r.foils}
    assert entity_types == EXPECTED_ENTITY_TYPES
    assert relation_types == EXPECTED_RELATION_TYPES
    unknown = sorted(r.detail.split("unknown change_type ")[1].split(" ")[0]
                     for r in result.item_rejections if r.reason == RejectReason.UNKNOWN_CHANGE_TYPE)
    assert unknown == ["'colour_swap'", "'opposite_ish'"]


# ---------------------------------------------------------------------------------------
# Files: globs, local and s3://
# ---------------------------------------------------------------------------------------

def test_glob_directory_and_file_uris_expand_sorted(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("a/x.json", "a/y.jsonl", "a/z.txt", "b.json"):
        (tmp_path / name).write_text("[]")
    assert expand_uri(str(tmp_path / "a")) == [str(tmp_path / "a/x.json"), str(tmp_path / "a/y.jsonl")]
    assert expand_uri(str(tmp_path / "*.json")) == [str(tmp_path / "b.json")]
    assert expand_uri(str(tmp_path / "**" / "*.json")) == [str(tmp_path / "a/x.json")]
    assert expand_uri(str(tmp_path / "a" / "[xy].*")) == [str(tmp_path / "a/x.json"), str(tmp_path / "a/y.jsonl")]
    with pytest.raises(DataError, match="no unit files match"):
        expand_uri(str(tmp_path / "*.parquet"))


# ---------------------------------------------------------------------------------------
# The entry point: python pipelines/extract_units.py --backend authors --input ... --out ...
# ---------------------------------------------------------------------------------------

def _unit_files(tmp_path: Path) -> Path:
    directory = tmp_path / "authors"
    directory.mkdir()
    for name in ("authors_train.json", "authors_older.json", "authors_change_types.json"):
        (directory / name).write_bytes((FIXTURES / name).read_bytes())
    (directory / "notes.txt").write_text("not a unit file")
    return directory


def _tables(out: Path):
    import pyarrow.parquet as pq

    units = read_units(str(out / "units"))
    rejects = pq.read_table(out / "rejects").to_pylist()
    return units, rejects


def test_entry_point_with_authors_backend_writes_units_and_rejects(ray_session, tmp_path, capsys):
    from pipelines.extract_units import main

    directory = _unit_files(tmp_path)
    out = tmp_path / "out"
    code = main(["--set", "backend.name=authors", "--set", f"input.uri={directory}/authors_*.json",
                 "--set", f"output.uri={out}", "--set", "tracking.enabled=false",
                 "--set", "output.shard_size=4"])
    assert code == 0
    units, rejects = _tables(out)
    printed = capsys.readouterr().out
    # 7 + 3 + 3 records: 4 + 1 + 1 cannot be read; of the 7 loaded, validation (SPEC §2)
    # rejects none whole, so read 13 = with units 7 + rejected 6.
    assert "read 13 = with units 7 + rejected 6" in printed
    records = {r.sample_id: r for r in units}
    assert len(records["coco_12_60"].relations) == 2
    record_rejects = {r["sample_id"]: r["reason"] for r in rejects if r["level"] == "record"}
    assert record_rejects == {"bad_missing_caption": "missing_field", "bad_entities_type": "wrong_type",
                              "bad_empty_caption": "empty_caption", "authors_train-00000006": "wrong_type",
                              "coco_31_152": "missing_field", "many_problems": "missing_field"}
    items = [(r["sample_id"], r["reason"]) for r in rejects if r["level"] == "item"]
    assert ("bad_change_type", "unknown_change_type") in items
    assert items.count(("coco_12_60", "unmatched_negative")) == 2
    many = next(r for r in rejects if r["sample_id"] == "many_problems")
    assert "'entities'" in many["detail"] and "'image_path'" in many["detail"]


def test_entry_point_shortcut_flags_and_a_config_error(ray_session, tmp_path, capsys):
    from pipelines.extract_units import main

    directory = _unit_files(tmp_path)
    out = tmp_path / "flags"
    assert main(["--backend", "authors", "--input", str(directory / "authors_older.json"),
                 "--out", str(out), "--set", "tracking.enabled=false"]) == 0
    assert "read 3 = with units 2 + rejected 1" in capsys.readouterr().out
    assert main(["--backend", "authors", "--out", str(tmp_path / "none"),
                 "--set", "tracking.enabled=false"]) == 2
    assert "needs input.uri" in capsys.readouterr().err

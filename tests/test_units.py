"""The units data model: rendering, foil rejection rules, schemas, Parquet round-trips."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.errors import DataError
from csclip.units import (
    UNITS_SCHEMA,
    ChangeType,
    Foil,
    RejectReason,
    Unit,
    UnitsRecord,
    foil_rejection,
    read_units,
    records_to_table,
    render_relation,
    table_to_records,
    validate_record,
    write_units,
)

CAPTION = "A man riding a brown horse next to a red barn."
ENTITIES = ["man", "brown horse", "red barn"]
HORSE = Unit.entity("brown horse")
RIDING = Unit.relation("man", "is riding", "brown horse")


def test_relation_text_keeps_the_auxiliary():
    assert render_relation("man", "is riding", "horse") == "man is riding horse"
    assert RIDING.text == "man is riding brown horse"
    assert Foil.relation("man", "is not riding", "brown horse", "negation").text == "man is not riding brown horse"


@pytest.mark.parametrize(("unit", "foil", "reason"), [
    (HORSE, Foil("white horse", ChangeType.ATTRIBUTE_CHANGE), None),
    (HORSE, Foil("brown cow", ChangeType.OBJECT_CHANGE), None),
    (HORSE, Foil("Brown  Horse.", ChangeType.ATTRIBUTE_CHANGE), RejectReason.FOIL_EQUALS_UNIT),
    (Unit.entity("small dog"), Foil("little dog", ChangeType.ATTRIBUTE_CHANGE), RejectReason.FOIL_IS_SYNONYM),
    (HORSE, Foil("brown horses", ChangeType.OBJECT_CHANGE), RejectReason.FOIL_ONLY_INFLECTION),
    (HORSE, Foil("brown thing", ChangeType.OBJECT_CHANGE), RejectReason.FOIL_GENERIC_WORD),
    (HORSE, Foil("red barn", ChangeType.OBJECT_CHANGE), RejectReason.FOIL_IN_CAPTION),
    (HORSE, Foil("  ", ChangeType.OBJECT_CHANGE), RejectReason.EMPTY_FOIL),
    (HORSE, Foil("N/A", ChangeType.OBJECT_CHANGE), RejectReason.PLACEHOLDER),
    (HORSE, Foil("<foil>", ChangeType.OBJECT_CHANGE), RejectReason.PLACEHOLDER),
    (HORSE, Foil("brown horse is under man", ChangeType.ANTONYM), RejectReason.CHANGE_TYPE_MISMATCH),
    (RIDING, Foil("black horse", ChangeType.ATTRIBUTE_CHANGE), RejectReason.CHANGE_TYPE_MISMATCH),
    (RIDING, Foil.relation("man", "is walking", "brown horse", ChangeType.ANTONYM), None),
    (RIDING, Foil.relation("man", "rides", "brown horse", ChangeType.ANTONYM), RejectReason.FOIL_ONLY_INFLECTION),
    (RIDING, Foil.relation("brown horse", "is riding", "man", ChangeType.SUBJECT_OBJECT_SWAP), None),
    (Unit.relation("man", "is riding", "horse"),
     Foil.relation("horse", "is riding", "man", ChangeType.SUBJECT_OBJECT_SWAP), None),
    (Unit.relation("man", "is near", "fence"),
     Foil.relation("fence", "is near", "man", ChangeType.SUBJECT_OBJECT_SWAP),
     RejectReason.SWAP_ARGUMENT_NOT_ENTITY),
])
def test_each_rejection_rule(unit, foil, reason):
    assert foil_rejection(unit, foil, CAPTION, ENTITIES) == reason


def test_unknown_change_type_fails_at_construction():
    with pytest.raises(ValueError, match="colour_swap"):
        Foil("white horse", "colour_swap")


def test_validate_record_keeps_valid_units_and_reports_every_rejection():
    record = UnitsRecord(
        "s1", "img1", CAPTION, "train",
        entities=(
            Unit.entity("brown horse", [Foil("white horse", "attribute_change"), Foil("brown horses", "object_change")]),
            Unit.entity("man"), Unit.entity("man"), Unit.entity("red barn"), Unit.entity("N/A"),
        ),
        relations=(
            Unit.relation("man", "is riding", "brown horse",
                          [Foil.relation("brown horse", "is riding", "man", "subject_object_swap")]),
            Unit.relation("woman", "is next to", "red barn"),
        ),
    )
    cleaned, rejections = validate_record(record)
    assert [e.text for e in cleaned.entities] == ["brown horse", "man", "red barn"]
    assert [f.text for f in cleaned.entities[0].foils] == ["white horse"]
    assert [r.text for r in cleaned.relations] == ["man is riding brown horse"]
    assert sorted(r.reason for r in rejections) == sorted([
        RejectReason.FOIL_ONLY_INFLECTION, RejectReason.DUPLICATE_UNIT, RejectReason.PLACEHOLDER,
        RejectReason.RELATION_ARGUMENT_NOT_ENTITY])


_words = st.text(alphabet="abcdefgh xyz", min_size=1, max_size=12).map(str.strip).filter(bool)
_foils = st.builds(Foil, _words, st.sampled_from(sorted(ChangeType)))
_entity = st.builds(Unit.entity, _words, st.lists(_foils, max_size=3))
_relation = st.builds(Unit.relation, _words, _words, _words, st.lists(
    st.builds(Foil.relation, _words, _words, _words, st.sampled_from(sorted(ChangeType))), max_size=3))
_records = st.builds(
    UnitsRecord, sample_id=_words, image_id=_words, caption=st.text(min_size=1, max_size=40),
    split=st.sampled_from(["train", "val", "test"]),
    entities=st.lists(_entity, max_size=4).map(tuple), relations=st.lists(_relation, max_size=3).map(tuple),
    image_path=st.none() | _words, image_bytes=st.none() | st.binary(max_size=64),
    source=st.sampled_from(["gold", "rules", ""]),
    meta=st.dictionaries(_words, st.text(max_size=8), max_size=2),
)


@settings(max_examples=60, deadline=None)
@given(records=st.lists(_records, min_size=1, max_size=5))
def test_units_table_round_trips_losslessly_in_memory(records):
    table = records_to_table(records)
    assert table.schema.equals(UNITS_SCHEMA)
    assert table_to_records(table) == records


def test_units_table_round_trips_through_local_parquet(tmp_path):
    records = [
        UnitsRecord("a", "i", CAPTION, "train", (HORSE,), (RIDING,), image_bytes=b"\x89PNG\x00\x01",
                    meta={"scene": '{"objects": []}'}),
        UnitsRecord("b", "j", "an empty one", "val", image_path="s3://bucket/j.jpg", source="rules"),
    ]
    path = tmp_path / "units.parquet"
    write_units(records, str(path))
    assert pq.read_schema(path).equals(UNITS_SCHEMA)
    assert read_units(str(path)) == records


def test_reading_a_missing_units_table_names_it(tmp_path):
    with pytest.raises(DataError, match="units table not found"):
        read_units(str(tmp_path / "missing.parquet"))


def test_pure_modules_do_not_import_ray():
    code = "import sys, csclip.units, csclip.config, csclip.authors, csclip.extract.authors; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)

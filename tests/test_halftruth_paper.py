"""Protocol `paper`: the authors' half-truth builder reproduced item for item, checked
against the output their own code produced (tests/fixtures/halftruth_paper/README.md)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from csclip.authors import read_verbatim_records
from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.halftruth import (
    ALL_CONDITIONS,
    BenchmarkConfig,
    HalfTruthItem,
    ItemScores,
    build_for_protocol,
    build_paper_benchmark,
    half_truth_metrics,
    is_valid_caption,
    resolve_protocol,
    verbatim_from_units,
)
from csclip.units import ChangeType, Foil, Unit, UnitsRecord
from csclip.world import iter_world

FIXTURES = Path(__file__).parent / "fixtures" / "halftruth_paper"
# Their condition names (HalfTruthEvaluator) -> ours.
THEIR_CONDITIONS = {
    "component_easy": "obj", "component_hard": "attr", "component_random": "rand",
    "relation_swap": "swap", "relation_antonym": "ant", "relation_negation": "neg",
    "object_wrong": "rel_obj", "subject_wrong": "subj", "attribute_wrong": "rel_attr",
}
RUNS = [
    ("units_older.json", "theirs_older_n1000.json", 1000),
    ("units_older.json", "theirs_older_n3.json", 3),
    ("units_training.json", "theirs_training_n1000.json", 1000),
]


def _theirs(name: str) -> list[tuple[str, str, str, str, str]]:
    items = json.loads((FIXTURES / name).read_text())["items"]
    return [(i["sample_id"], THEIR_CONDITIONS[i["condition"]], i["anchor"], i["completion"],
             i["half_truth"]) for i in items]


def _ours(units: str, num_samples: int | None) -> list[tuple[str, str, str, str, str]]:
    bench = build_paper_benchmark(read_verbatim_records(str(FIXTURES / units)), num_samples, 42)
    return [(i.sample_id, i.condition, i.anchor, i.completion, i.half_truth) for i in bench.items]


@pytest.mark.parametrize("units,theirs,num_samples", RUNS)
def test_deterministic_items_equal_their_builders(units, theirs, num_samples):
    ours = [i for i in _ours(units, num_samples) if i[1] != "rand"]
    assert ours == [i for i in _theirs(theirs) if i[1] != "rand"]


@pytest.mark.parametrize("units,theirs,num_samples", RUNS)
def test_random_items_equal_their_draws(units, theirs, num_samples):
    # Their +Rand is random.seed(42) then random.choice per sample: the same Mersenne
    # Twister draws give the same X, so even these match exactly.
    ours = [i for i in _ours(units, num_samples) if i[1] == "rand"]
    assert ours == [i for i in _theirs(theirs) if i[1] == "rand"]


@pytest.mark.parametrize("units,theirs,num_samples", RUNS)
def test_random_items_have_their_structure(units, theirs, num_samples):
    # What holds whatever the RNG: one +Rand per entity sample, same anchor and A+ as its
    # +Obj/+Attr, X the B of another sample.
    items = _theirs(theirs)
    entity = {i[0]: i for i in items if i[1] in ("obj", "attr")}
    seconds = {sid: completion.removeprefix(anchor + " and ")
               for sid, _, anchor, completion, _ in entity.values()}
    rand = [i for i in _ours(units, num_samples) if i[1] == "rand"]
    assert {i[0] for i in rand} == set(entity)
    for sample_id, _, anchor, completion, half_truth in rand:
        assert (anchor, completion) == entity[sample_id][2:4]
        x = half_truth.removeprefix(anchor + " and ")
        assert x in [b for sid, b in seconds.items() if sid != sample_id]


def test_what_the_fixtures_exercise_shows_in_their_items():
    items = _theirs("theirs_older_n1000.json")
    by = Counter((sid, cond) for sid, cond, *_ in items)
    texts = {(sid, cond): ht for sid, cond, _, _, ht in items}
    # Image 101's first caption has one component: the entity side takes the second
    # caption, the relation side the first (each side picks its own caption).
    assert by[("coco_101_1", "obj")] == 1 and not by[("coco_101_0", "obj")]
    assert texts[("coco_101_0", "subj")] == "woman is riding horse"
    assert not any(sid == "coco_101_1" and cond == "swap" for sid, cond in by)
    # Substring lookup: relation object "bag" takes the foils of "Leather Bag".
    assert texts[("coco_112_0", "rel_obj")] == "book is in leather box"
    # Top-level negative_relations: relation_opposite with "not" is a negation, without it
    # an antonym; the stored swap is never used; a relation's own list wins (110).
    assert texts[("coco_105_0", "neg")] == "child is not holding red umbrella"
    assert texts[("coco_105_0", "ant")] == "child is dropping red umbrella"
    assert texts[("coco_110_0", "ant")] == "woman is catching frisbee"
    assert not by[("coco_110_0", "neg")]
    # A symmetric predicate still gets a Swap item (true of the image), and "zebra is
    # next to zebra" swaps into itself: their quirks, kept.
    assert texts[("coco_103_0", "swap")] == "dog is next to cat"
    assert texts[("coco_108_0", "swap")] == "zebra is next to zebra"
    # "in" / "is on" / "is in" fail is_valid_caption: no Ant from them.
    assert texts[("coco_104_0", "ant")] == "laptop is under desk"
    assert not by[("coco_112_0", "ant")] and not by[("coco_113_0", "ant")]
    # A subject "it" is sampled (it uses up the image) and then dropped by their scorer.
    assert not any(sid.startswith("coco_106") and cond == "swap" for sid, cond in by)
    # No image path, no item.
    assert not any(sid == "coco_109_0" for sid, _ in by)


def test_items_plus_skips_equal_images_for_every_condition():
    records = read_verbatim_records(str(FIXTURES / "units_older.json"))
    for num_samples in (None, 3):
        bench = build_paper_benchmark(records, num_samples)
        for condition in ALL_CONDITIONS:
            made = sum(1 for i in bench.items if i.condition == condition.slug)
            assert made + bench.num_skipped(condition.slug) == bench.num_images == 13
    capped = build_paper_benchmark(records, 3)
    assert capped.skipped[("obj", "over_num_samples")] == 10
    full = build_paper_benchmark(records, None)
    assert full.skipped[("swap", "anchor_not_valid")] == 1
    assert full.skipped[("obj", "missing_image")] == 1
    assert full.protocol == "paper"


def test_is_valid_caption_as_theirs():
    assert not is_valid_caption("is on") and not is_valid_caption("in")
    assert not is_valid_caption(" and ") and not is_valid_caption("") and not is_valid_caption("it")
    assert is_valid_caption("is not on") and is_valid_caption("man")


def _units_record(index: int, image_id: str) -> UnitsRecord:
    horse = Unit.entity("brown horse", [Foil("white horse", ChangeType.ATTRIBUTE_CHANGE),
                                        Foil("brown cow", ChangeType.OBJECT_CHANGE)])
    man = Unit.entity("man", [Foil("woman", ChangeType.OBJECT_CHANGE)])
    riding = Unit.relation("man", "is riding", "horse", [
        Foil.relation("man", "is leading", "horse", ChangeType.ANTONYM),
        Foil.relation("man", "is not riding", "horse", ChangeType.NEGATION)])
    return UnitsRecord(f"s{index}", image_id, "a man riding a brown horse", "val",
                       (man, horse), (riding,), image_path=f"/img/{image_id}.jpg")


def test_units_table_records_build_the_paper_items():
    records = [_units_record(0, "a"), _units_record(1, "a"), _units_record(2, "b")]
    bench = build_paper_benchmark([verbatim_from_units(r) for r in records])
    assert bench.num_images == 2
    assert {i.sample_id for i in bench.items} == {"s0", "s2"}  # first caption per image
    first = {i.condition: i for i in bench.items if i.sample_id == "s0"}
    assert first["obj"] == HalfTruthItem("a", "s0", "obj", "entity", "man", "man and brown horse",
                                         "man and brown cow", "brown horse", "brown cow")
    assert first["ant"].half_truth == "man is leading horse"
    assert first["rel_attr"].half_truth == "man is riding white horse"
    assert first["neg"].group == "negation"


def test_auto_protocol_is_paper_for_real_data_and_csclip_for_the_world():
    world = list(iter_world(WorldConfig(num_train=0, num_val=5, num_test=0), splits=("val",)))
    assert resolve_protocol("auto", world) == "csclip"
    assert resolve_protocol("auto", [_units_record(0, "a")]) == "paper"
    assert resolve_protocol("csclip", [_units_record(0, "a")]) == "csclip"
    assert build_for_protocol([_units_record(0, "a")], BenchmarkConfig()).protocol == "paper"
    assert build_for_protocol(world, BenchmarkConfig()).protocol == "csclip"


def test_neg_is_reported_apart_from_every_average():
    items = [HalfTruthItem("a", "s", "obj", "entity", "x", "x and y", "x and z"),
             HalfTruthItem("a", "s", "neg", "negation", "x", "x r y", "x not r y")]
    scores = ItemScores(np.array([1.0, 1.0]), np.array([0.0, 0.0]), np.array([0.0, 2.0]))
    metrics = half_truth_metrics(items, scores, num_bootstrap=0)
    assert metrics["num_items_all"] == 1 and metrics["ht_all"] == 100.0
    assert metrics["ht_neg"] == 0.0 and metrics["num_items_neg"] == 1


def test_no_records_is_a_data_error():
    with pytest.raises(DataError, match="no records"):
        build_paper_benchmark([])


def test_a_folder_is_read_sorted_or_as_its_combined_file(tmp_path):
    records = json.loads((FIXTURES / "units_older.json").read_text())
    (tmp_path / "b.json").write_text(json.dumps(records[8:]))
    (tmp_path / "a.json").write_text(json.dumps(records[:8]))
    whole = build_paper_benchmark(read_verbatim_records(str(FIXTURES / "units_older.json")))
    assert build_paper_benchmark(read_verbatim_records(str(tmp_path))).items == whole.items
    (tmp_path / "combined_data.json").write_text(json.dumps(records[:2]))
    assert {r.sample_id for r in read_verbatim_records(str(tmp_path))} == {"coco_101_0",
                                                                            "coco_101_1"}

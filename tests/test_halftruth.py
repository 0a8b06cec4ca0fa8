"""Half-truth benchmark construction, the benchmark table and the metric arithmetic."""

from __future__ import annotations

import random
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.errors import DataError
from csclip.eval.halftruth import (
    CONDITIONS,
    HalfTruthItem,
    ItemScores,
    bootstrap_ci,
    build_benchmark,
    build_half_truth_benchmark,
    build_image_side_benchmark,
    entity_may_hold,
    half_truth_metrics,
    image_side_metrics,
    load_benchmark,
    save_benchmark,
)
from csclip.units import ChangeType, Foil, Unit, UnitsRecord

COLORS = ("red", "blue", "green", "yellow")
SHAPES = ("circle", "square", "triangle")


def entity(color: str, shape: str) -> Unit:
    other_shape = SHAPES[(SHAPES.index(shape) + 1) % len(SHAPES)]
    other_color = COLORS[(COLORS.index(color) + 1) % len(COLORS)]
    return Unit.entity(
        f"{color} {shape}",
        [
            Foil(f"{color} {other_shape}", ChangeType.OBJECT_CHANGE),
            Foil(f"{other_color} {shape}", ChangeType.ATTRIBUTE_CHANGE),
        ],
    )


def relation(subject: str, predicate: str, obj: str, antonym: str) -> Unit:
    return Unit.relation(
        subject,
        predicate,
        obj,
        [
            Foil.relation(subject, antonym, obj, ChangeType.ANTONYM),
            Foil.relation(obj, predicate, subject, ChangeType.SUBJECT_OBJECT_SWAP),
        ],
    )


def record(
    index: int,
    colors=("red", "blue"),
    shapes=("circle", "square"),
    with_relation=True,
    image: bytes | None = b"png",
    caption_index: int = 0,
) -> UnitsRecord:
    entities = tuple(entity(c, s) for c, s in zip(colors, shapes, strict=True))
    relations = ()
    if with_relation and len(entities) >= 2:
        relations = (relation(entities[0].text, "is left of", entities[1].text, "is right of"),)
    caption = " and ".join(e.text for e in entities)
    return UnitsRecord(
        f"val-{index:03d}-{caption_index}",
        f"img-{index:03d}",
        caption,
        "val",
        entities,
        relations,
        image_bytes=image,
    )


def varied_records(count: int = 6) -> list[UnitsRecord]:
    return [
        record(
            i,
            colors=(COLORS[i % 4], COLORS[(i + 1) % 4]),
            shapes=(SHAPES[i % 3], SHAPES[(i + 1) % 3]),
        )
        for i in range(count)
    ]


def test_every_condition_has_an_item_for_a_full_record():
    bench = build_half_truth_benchmark(varied_records(), seed=0)
    assert {item.condition for item in bench.items} == {c.slug for c in CONDITIONS}
    assert all(
        item.group == next(c.group for c in CONDITIONS if c.slug == item.condition)
        for item in bench.items
    )


def test_items_follow_the_spec_templates():
    for item in build_benchmark(varied_records(), seed=3):
        assert item.half_truth != item.completion and item.half_truth != item.anchor
        if item.group == "entity":
            assert item.completion.startswith(item.anchor + " and ")
            assert item.half_truth.startswith(item.anchor + " and ")
        else:
            assert item.completion.startswith(item.anchor + " ") or item.condition == "swap"
    relation_items = [i for i in build_benchmark(varied_records(), seed=3) if i.condition == "swap"]
    for item in relation_items:
        subject, obj = item.completion.split(" is left of ")
        assert item.half_truth == f"{obj} is left of {subject}"


def test_accounting_items_plus_skips_equal_images_per_condition():
    records = varied_records(4) + [
        record(10, image=None),
        record(11, with_relation=False),
        record(12, colors=("red",), shapes=("circle",)),
    ]
    bench = build_half_truth_benchmark(records, seed=1)
    for condition in CONDITIONS:
        produced = sum(1 for i in bench.items if i.condition == condition.slug)
        assert produced + bench.num_skipped(condition.slug) == bench.num_images == 7
    assert bench.skipped[("obj", "missing_image")] == 1
    assert bench.skipped[("ant", "no_relation")] == 2
    assert bench.skipped[("obj", "no_entity_pair")] == 1


def test_units_without_foils_are_counted_skips():
    bare = UnitsRecord(
        "s",
        "img",
        "a red circle left of a blue square",
        "val",
        (Unit.entity("red circle"), Unit.entity("blue square")),
        (Unit.relation("red circle", "is left of", "blue square"),),
        image_bytes=b"x",
    )
    bench = build_half_truth_benchmark([bare], seed=0)
    assert bench.items == ()
    assert bench.skipped[("obj", "no_entity_foil")] == 1
    assert bench.skipped[("swap", "no_relation_with_two_foils")] == 1


def test_empty_table_raises_data_error():
    with pytest.raises(DataError, match="no records"):
        build_benchmark([], seed=0)


def test_same_input_in_any_order_gives_the_same_benchmark():
    records = varied_records(8) + [record(3, caption_index=1, colors=("green", "yellow"))]
    first = build_benchmark(records, seed=5)
    shuffled = records[:]
    random.Random(0).shuffle(shuffled)
    assert build_benchmark(shuffled, seed=5) == first
    assert build_benchmark(records, seed=6) != first


def test_saved_benchmark_is_byte_for_byte_reproducible(tmp_path):
    records = varied_records(8)
    first = save_benchmark(build_benchmark(records, seed=5), tmp_path / "a.csv").read_bytes()
    again = save_benchmark(build_benchmark(records[::-1], seed=5), tmp_path / "b.csv").read_bytes()
    assert first == again


def test_one_caption_per_image():
    records = [record(0, caption_index=k, colors=(COLORS[k], COLORS[k + 1])) for k in range(3)]
    items = build_benchmark(records, seed=0)
    assert len({item.sample_id for item in items}) == 1


def test_random_entity_comes_from_another_image_and_may_not_hold():
    records = varied_records(6)
    entities = {r.image_id: [e.text for e in r.entities] for r in records}
    rand = [i for i in build_benchmark(records, seed=2) if i.condition == "rand"]
    assert rand
    for item in rand:
        extra = item.half_truth.removeprefix(item.anchor + " and ")
        assert not entity_may_hold(extra, entities[item.image_id])


def test_random_entity_that_may_hold_is_drawn_again():
    # Most of the pool names what the image shows already: four images with a red circle
    # and a blue square, two with a green triangle and a yellow square. An X drawn from an
    # image like this one may be true of it, so only the other pair's entities serve.
    records = [record(i) for i in range(4)] + [
        record(i, colors=("green", "yellow"), shapes=("triangle", "square")) for i in (4, 5)]
    rand = [i for i in build_benchmark(records, seed=0) if i.condition == "rand"]
    assert len(rand) == 6
    for item in rand:
        extra = item.half_truth.removeprefix(item.anchor + " and ")
        mine = {"red circle", "blue square"} if item.image_id < "img-004" else \
            {"green triangle", "yellow square"}
        others = {"red circle", "blue square", "green triangle", "yellow square"} - mine
        assert extra in others, (item.image_id, extra)


def test_entity_may_hold_rule():
    assert entity_may_hold("circle", ["red circle"])
    assert entity_may_hold("large red circle", ["red circle"])
    assert not entity_may_hold("blue circle", ["red circle"])
    assert not entity_may_hold("red square", ["red circle"])


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_benchmark_table_round_trips(tmp_path, suffix):
    items = build_benchmark(varied_records(), seed=0)
    path = save_benchmark(items, tmp_path / f"bench{suffix}")
    assert load_benchmark(path) == items


def test_benchmark_table_rejects_unknown_condition(tmp_path):
    bad = [HalfTruthItem("1", "1", "bogus", "entity", "a", "a and b", "a and c")]
    path = save_benchmark(bad, tmp_path / "bad.csv")
    with pytest.raises(DataError, match="bogus"):
        load_benchmark(path)
    with pytest.raises(DataError, match="not found"):
        load_benchmark(tmp_path / "missing.parquet")


# ----------------------------------------------------------------------------- metrics


def _items(conditions: list[str]) -> list[HalfTruthItem]:
    groups = {c.slug: c.group for c in CONDITIONS}
    return [
        HalfTruthItem(str(k), str(k), c, groups[c], "a", "a+", "a-")
        for k, c in enumerate(conditions)
    ]


def test_tie_counts_as_failure():
    items = _items(["obj", "obj", "ant"])
    scores = ItemScores(
        anchor=np.array([0.5, 0.3, 0.2]),
        completion=np.array([0.6, 0.3, 0.1]),
        half_truth=np.array([0.4, 0.3, 0.2]),
    )
    metrics = half_truth_metrics(items, scores, num_bootstrap=50)
    assert metrics["ht_all"] == pytest.approx(100 / 3)
    assert metrics["ht_entity"] == pytest.approx(50.0)
    assert metrics["ht_relation"] == 0.0
    assert metrics["ht_obj"] == pytest.approx(50.0)
    assert metrics["ht_gap"] == pytest.approx(0.1 / 3)
    assert metrics["winrate_all"] == pytest.approx(100 / 3)
    assert metrics["consistency_all"] == pytest.approx(100 / 3)
    assert metrics["num_items_relation"] == 1 and metrics["num_items_rand"] == 0
    assert "ht_rand" not in metrics


def test_micro_average_weights_items_not_conditions():
    items = _items(["obj"] * 3 + ["attr"])
    scores = ItemScores(np.ones(4), np.ones(4), np.array([0.0, 0.0, 0.0, 2.0]))
    metrics = half_truth_metrics(items, scores, num_bootstrap=10)
    assert metrics["ht_entity"] == 75.0  # a macro average would give 50


def test_bootstrap_ci_brackets_the_mean():
    values = np.array([100.0] * 70 + [0.0] * 30)
    low, high = bootstrap_ci(values, 1000, seed=0)
    assert low < 70 < high and 55 < low and high < 85
    assert bootstrap_ci(np.full(5, 100.0), 100) == (100.0, 100.0)


def test_bootstrap_ci_is_a_95_percent_interval():
    # 400 items, half right: the mean's standard error is 2.5 points, so a 95% interval
    # is +-1.96 * 2.5 = +-4.9 (a 90% one +-4.1, an 80% one +-3.2), whatever the seed.
    values = np.array([100.0, 0.0] * 200)
    for seed in range(3):
        low, high = bootstrap_ci(values, 4000, seed=seed)
        assert 4.5 < (high - low) / 2 < 5.3 and low < 50 < high, (seed, low, high)
    # And exactly the 2.5th and 97.5th percentiles of the resampled means.
    rng = np.random.default_rng(0)
    means = values[rng.integers(0, values.size, (4000, values.size))].mean(1)
    assert bootstrap_ci(values, 4000, seed=0) == pytest.approx(np.percentile(means, [2.5, 97.5]))


def test_image_side_metrics_known_answer():
    target = np.array([0.9, 0.5, 0.3])
    distractors = [np.array([0.1, 0.2]), np.array([0.5, 0.1, 0.0]), np.array([0.4, 0.6])]
    metrics = image_side_metrics(target, distractors)
    assert metrics["image_side_top1"] == pytest.approx(100 / 3)  # the tie at 0.5 fails
    assert metrics["image_side_mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert metrics["image_side_margin"] == pytest.approx((0.7 + 0.0 - 0.3) / 3)


def test_image_side_distractors_share_one_unit_and_lack_the_other():
    # Every image shows a red circle plus one other entity out of four.
    others = [("blue", "square"), ("green", "triangle"), ("yellow", "square"), ("blue", "triangle")]
    records = [
        record(i, colors=("red", others[i % 4][0]), shapes=("circle", others[i % 4][1]))
        for i in range(8)
    ]
    entities = {r.image_id: {e.text for e in r.entities} for r in records}
    items = build_image_side_benchmark(records, seed=0)
    assert items
    for item in items:
        assert 2 <= len(item.distractors) <= 5 and item.image_id not in item.distractors
        assert {item.shared, item.distinct} <= entities[item.image_id]
        for other in item.distractors:
            assert item.shared in entities[other] and item.distinct not in entities[other]
    assert build_image_side_benchmark(list(reversed(records)), seed=0) == items


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 8), seed=st.integers(0, 99))
def test_benchmark_is_deterministic_and_accounted(count, seed):
    records = varied_records(count)
    first = build_half_truth_benchmark(records, seed)
    assert build_half_truth_benchmark(list(reversed(records)), seed) == first
    for condition in CONDITIONS:
        produced = sum(1 for i in first.items if i.condition == condition.slug)
        assert produced + first.num_skipped(condition.slug) == count


def test_halftruth_does_not_import_ray():
    code = "import sys, csclip.eval.halftruth; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(max_examples=30, deadline=None)
@given(
    values=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=30
    ),
)
def test_accuracy_of_a_and_its_mirror_plus_ties_is_100(values):
    # Scores on a coarse grid so ties are common: a tie fails in both directions.
    anchor, completion, half_truth = (
        np.array(column, dtype=float) for column in zip(*values, strict=True)
    )
    items = _items(["obj"] * len(values))
    forward = half_truth_metrics(
        items, ItemScores(anchor, completion, half_truth), num_bootstrap=20
    )
    mirror = half_truth_metrics(items, ItemScores(half_truth, completion, anchor), num_bootstrap=20)
    ties = 100 * np.mean(anchor == half_truth)
    assert forward["ht_all"] + mirror["ht_all"] + ties == pytest.approx(100.0)
    assert forward["ht_gap"] == pytest.approx(-mirror["ht_gap"])

"""Tests of the SPEC §3 text-slot sampler on hand-made records (and world records)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.config import validate_config
from csclip.config.train import SamplingConfig
from csclip.errors import ConfigError
from csclip.train.sampling import (
    FoilCandidate,
    NegativeKind,
    draw_caption_negative,
    draw_unit_slots,
    entity_foil_candidates,
    relation_foil_candidates,
    sample_rng,
    sample_text_columns,
    sample_texts,
    shuffle_caption,
)
from csclip.units import ChangeType, Foil, Unit, UnitsRecord, normalize_text, records_to_table

ATTR, OBJ = ChangeType.ATTRIBUTE_CHANGE, ChangeType.OBJECT_CHANGE


def horse_record(sample_id: str = "s0") -> UnitsRecord:
    """"a man is riding a brown horse next to a red car": 3 entities, 2 relations."""
    man = Unit.entity("man", [Foil("woman", OBJ)])
    horse = Unit.entity("brown horse", [Foil("white horse", ATTR), Foil("brown cow", OBJ)])
    car = Unit.entity("red car", [Foil("blue car", ATTR)])
    riding = Unit.relation("man", "is riding", "brown horse", [
        Foil.relation("man", "is not riding", "brown horse", ChangeType.NEGATION),
        Foil.relation("man", "is walking", "brown horse", ChangeType.ANTONYM),
    ])
    next_to = Unit.relation("brown horse", "is next to", "red car", [
        Foil.relation("brown horse", "is far from", "red car", ChangeType.ANTONYM),
    ])
    return UnitsRecord(sample_id, sample_id, "a man is riding a brown horse next to a red car.",
                       "train", (man, horse, car), (riding, next_to))


def _fraction_ci(p: float, n: int) -> float:
    # 4.5 standard deviations of a binomial proportion: a false alarm about once in 10^5 runs.
    return 4.5 * math.sqrt(p * (1 - p) / n)


# --- hypothesis strategy: small records, some without units or foils --------------------

COLORS, SHAPES = ["red", "blue", "green", "pink"], ["circle", "square", "cross", "star"]


@st.composite
def records(draw) -> UnitsRecord:
    names = draw(st.lists(st.sampled_from([f"{c} {s}" for c in COLORS for s in SHAPES]),
                          max_size=4, unique=True))
    entities = []
    for name in names:
        color, shape = name.split()
        foils = draw(st.lists(st.sampled_from([f"{c} {shape}" for c in COLORS] +
                                              [f"{color} {s}" for s in SHAPES]), max_size=2))
        entities.append(Unit.entity(name, [Foil(f, ATTR) for f in foils]))
    relations = []
    if len(names) >= 2 and draw(st.booleans()):
        s, o = names[0], names[1]
        relations.append(Unit.relation(s, "is above", o, [
            Foil.relation(s, "is below", o, ChangeType.ANTONYM)] if draw(st.booleans()) else []))
    caption = " and ".join(f"a {n}" for n in names) or draw(st.sampled_from(["a scene", "empty"]))
    sample_id = f"h-{draw(st.integers(0, 10**6))}"
    return UnitsRecord(sample_id, sample_id, caption, "train", tuple(entities), tuple(relations))


configs = st.builds(SamplingConfig, num_unit_slots=st.integers(1, 4),
                    relation_prob=st.floats(0, 1), swap_prob=st.floats(0, 1),
                    inplace_prob=st.floats(0, 1), use_negation=st.booleans())


@settings(max_examples=150, deadline=None)
@given(record=records(), config=configs, seed=st.integers(0, 99), epoch=st.integers(0, 5))
def test_every_sample_fills_all_slots_and_no_foil_equals_its_unit(record, config, seed, epoch):
    texts = sample_texts(record, config, seed, epoch)
    assert len(texts.units) == len(texts.foils) == config.num_unit_slots
    assert all(t.strip() for t in (*texts.units, *texts.foils, texts.caption_negative))
    entity_ok = any(entity_foil_candidates(e) for e in record.entities)
    relation_ok = any(relation_foil_candidates(r, record, config.use_negation)
                      for r in record.relations)
    # Each kind falls back to the other: a sample has units iff some unit has a foil.
    assert texts.has_units == (entity_ok or relation_ok)
    if texts.has_units:
        for unit, foil in zip(texts.units, texts.foils, strict=True):
            assert normalize_text(unit) != normalize_text(foil)


def test_texts_are_the_same_in_another_process_and_under_another_hash_seed():
    # Determinism across processes: Ray Data runs the sampler in its own worker processes,
    # and Python's hash() (and set order of str) is salted per process; the draws must
    # depend on (seed, sample, epoch) only. Each process draws its texts fresh, with
    # several configs, so state carried inside one process cannot make them agree.
    code = ("import json, sys; sys.path.insert(0, 'tests'); "
            "from test_sampling import horse_record; "
            "from csclip.train.sampling import SamplingConfig, sample_texts; "
            "configs = [SamplingConfig(), SamplingConfig(num_unit_slots=4, swap_prob=0.3)]; "
            "print(json.dumps([[list(t.units), list(t.foils), t.caption_negative] for t in "
            "(sample_texts(horse_record(f's{i}'), c, 7, e) for c in configs for e in (0, 3) "
            "for i in range(20))]))")
    outputs = []
    for hash_seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        done = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                              capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
        outputs.append(json.loads(done.stdout))
    assert outputs[0] == outputs[1] == outputs[2]
    assert len({json.dumps(row) for row in outputs[0]}) > 20  # the draws do vary


def test_epochs_and_seeds_change_the_draws():
    config = SamplingConfig()
    draws = {sample_texts(horse_record(), config, seed, epoch)
             for seed in range(3) for epoch in range(5)}
    assert len(draws) > 5


# --- statistics over many draws -----------------------------------------------------------

@pytest.mark.parametrize("relation_prob", [0.0, 0.3, 0.75, 1.0])
def test_fraction_of_relation_slots_matches_relation_prob(relation_prob):
    config = SamplingConfig(num_unit_slots=1, relation_prob=relation_prob)
    num = 2000
    kinds = Counter(draw_unit_slots(horse_record(), config, sample_rng(0, f"s{i}", 0))[0].kind
                    for i in range(num))
    assert abs(kinds["relation"] / num - relation_prob) <= _fraction_ci(relation_prob, num)


@pytest.mark.parametrize("swap_prob,inplace_prob", [(0.0, 1.0), (0.25, 0.5), (0.5, 0.5), (1.0, 0.0)])
def test_caption_negative_rules_follow_swap_and_inplace_prob(swap_prob, inplace_prob):
    config = SamplingConfig(swap_prob=swap_prob, inplace_prob=inplace_prob)
    num = 2000
    kinds = Counter(draw_caption_negative(horse_record(), config, sample_rng(1, f"s{i}", 0)).kind
                    for i in range(num))
    # "First that applies": the in-place rule only sees what the shuffle left over, and the
    # composite splits the rest by relation_negative_prob (0.5; the record has relation foils).
    rest = (1 - swap_prob) * (1 - inplace_prob)
    expected = {NegativeKind.SHUFFLE: swap_prob,
                NegativeKind.INPLACE: (1 - swap_prob) * inplace_prob,
                NegativeKind.RELATION_COMPOSITE: rest / 2,
                NegativeKind.ENTITY_COMPOSITE: rest / 2}
    for kind, p in expected.items():
        assert abs(kinds[kind] / num - p) <= _fraction_ci(p, num), (kind, kinds)


@pytest.mark.parametrize("num_unit_slots", [2, 3, 4])
@pytest.mark.parametrize("relation_prob", [0.5, 1.0])
def test_relation_prob_is_the_share_of_relation_slots_at_every_n(num_unit_slots, relation_prob):
    # Slots are drawn independently, with replacement (the authors' sampler): the horse has
    # 2 relations, yet at relation_prob 1.0 every slot of N = 3, 4 is a relation. Drawing
    # without replacement gave 64.5% relation slots at N = 2 on the world.
    config = SamplingConfig(num_unit_slots=num_unit_slots, relation_prob=relation_prob)
    kinds = Counter(slot.kind for i in range(1000)
                    for slot in draw_unit_slots(horse_record(), config, sample_rng(0, f"s{i}", 0)))
    share = kinds["relation"] / sum(kinds.values())
    assert abs(share - relation_prob) <= 0.02, (share, kinds)


def test_slots_are_drawn_with_replacement():
    config = SamplingConfig(num_unit_slots=4, relation_prob=1.0)
    draws = [sample_texts(horse_record(f"s{i}"), config, 0, 0).units for i in range(50)]
    assert all(set(units) <= {r.text for r in horse_record().relations} for units in draws)
    # Both orders and repeats occur: each slot is its own uniform draw over the relations.
    assert any(len(set(units)) == 1 for units in draws) and any(len(set(units)) == 2 for units in draws)


def test_entity_context_prob_adds_one_other_entity_half_the_time():
    config = SamplingConfig(num_unit_slots=1, relation_prob=0.0)
    num = 2000
    with_context = context_first = 0
    for i in range(num):
        texts = sample_texts(horse_record(f"s{i}"), config, 0, 0)
        unit, foil = texts.units[0], texts.foils[0]
        if " and " in unit:
            with_context += 1
            # "A and C" vs "A' and C": the same context C, the edited entity A -> A'.
            unit_parts, foil_parts = set(unit.split(" and ")), set(foil.split(" and "))
            (context,) = unit_parts & foil_parts
            assert len(unit_parts) == len(foil_parts) == 2
            context_first += unit.startswith(context + " and ")
    assert abs(with_context / num - 0.5) <= _fraction_ci(0.5, num)
    # The order of the two parts is shuffled, as the authors do.
    assert abs(context_first / with_context - 0.5) <= _fraction_ci(0.5, with_context)


def _rules_records(sugarcrepe_dir, limit: int) -> list[UnitsRecord]:
    from csclip.extract.backends import rules_outcome

    data = json.loads((sugarcrepe_dir / "replace_rel.json").read_text())
    records = []
    for key in sorted(data, key=int)[:limit]:
        row = {"sample_id": f"sc-{key}", "image_id": key, "caption": data[key]["caption"],
               "split": "train"}
        if (record := rules_outcome(row).record) is not None:
            records.append(record)
    return records


def _has_both_kinds(record: UnitsRecord, config: SamplingConfig) -> bool:
    return (any(entity_foil_candidates(e) for e in record.entities)
            and any(relation_foil_candidates(r, record, config.use_negation) for r in record.relations))


@pytest.mark.parametrize("source", ["world", "sugarcrepe"])
def test_relation_slot_share_is_within_two_points_of_relation_prob_on_real_units(source, request):
    # on the world and on SugarCrepe units (rules extractor), among
    # samples that have both kinds, the share of relation slots is relation_prob +- 2 points
    # at N = 1..4.
    if source == "world":
        world = pytest.importorskip("csclip.world")
        config = world.WorldConfig(seed=0, num_train=60, num_val=1, num_test=1)
        records = list(world.iter_world(config, splits=("train",)))
    else:
        records = _rules_records(request.getfixturevalue("sugarcrepe_dir"), 300)
    for relation_prob in (0.5, 1.0):
        for n in range(1, 5):
            config = SamplingConfig(num_unit_slots=n, relation_prob=relation_prob)
            eligible = [r for r in records if _has_both_kinds(r, config)]
            assert len(eligible) >= 40
            kinds = Counter(slot.kind for epoch in range(6000 // (n * len(eligible)) + 1)
                            for r in eligible
                            for slot in draw_unit_slots(r, config, sample_rng(0, r.sample_id, epoch)))
            share = kinds["relation"] / sum(kinds.values())
            assert abs(share - relation_prob) <= 0.02, (source, relation_prob, n, share)


# --- slot filling, masking and foil candidates -------------------------------------------

def test_sample_without_usable_units_is_masked_not_a_crash():
    config = SamplingConfig(num_unit_slots=3)
    bare = UnitsRecord("b", "b", "a photo of nothing", "train")
    no_foils = UnitsRecord("n", "n", "a dog on a sofa", "train",
                           (Unit.entity("dog"), Unit.entity("sofa")),
                           (Unit.relation("dog", "is on", "sofa"),))
    for record in (bare, no_foils):
        texts = sample_texts(record, config, 0, 0)
        assert texts.has_units is False
        assert len(texts.units) == len(texts.foils) == 3
        assert texts.caption == record.caption


def test_slot_that_cannot_be_filled_copies_a_filled_slot():
    record = UnitsRecord("o", "o", "a red circle", "train",
                         (Unit.entity("red circle", [Foil("blue circle", ATTR)]),))
    texts = sample_texts(record, SamplingConfig(num_unit_slots=3), 0, 0)
    assert texts.has_units
    assert texts.units == ("red circle",) * 3 and texts.foils == ("blue circle",) * 3


def test_each_kind_falls_back_to_the_other_only_when_the_sample_has_none():
    horse = horse_record()
    # A relation with no stored foil whose arguments are no entity with foils: no candidate.
    no_relation_foils = UnitsRecord("e", "e", horse.caption, "train", horse.entities,
                                    (Unit.relation("rider", "is on", "animal"),))
    no_entity_foils = UnitsRecord("r", "r", horse.caption, "train",
                                  tuple(Unit.entity(e.text) for e in horse.entities),
                                  horse.relations[:1])
    for i in range(20):
        rng = sample_rng(0, f"s{i}", 0)
        relations_wanted = SamplingConfig(num_unit_slots=3, relation_prob=1.0)
        entities_wanted = SamplingConfig(num_unit_slots=3, relation_prob=0.0)
        assert {s.kind for s in draw_unit_slots(horse, relations_wanted, rng)} == {"relation"}
        assert {s.kind for s in draw_unit_slots(horse, entities_wanted, rng)} == {"entity"}
        assert {s.kind for s in draw_unit_slots(no_relation_foils, relations_wanted, rng)} == {"entity"}
        assert {s.kind for s in draw_unit_slots(no_entity_foils, entities_wanted, rng)} == {"relation"}


def _texts(candidates: list[FoilCandidate]) -> list[str]:
    return [t for c in candidates for t in c.texts]


def test_relation_foil_candidates_are_one_per_stored_foil_and_one_per_replaced_argument():
    record = horse_record()
    riding = record.relations[0]
    assert relation_foil_candidates(riding, record) == [
        FoilCandidate(ChangeType.NEGATION, ("man is not riding brown horse",)),
        FoilCandidate(ChangeType.ANTONYM, ("man is walking brown horse",)),
        # ONE subject and ONE object replacement, however many foils the entity has.
        FoilCandidate(ChangeType.SUBJECT_REPLACE, ("woman is riding brown horse",)),
        FoilCandidate(ChangeType.OBJECT_REPLACE, ("man is riding white horse", "man is riding brown cow")),
    ]
    without_negation = relation_foil_candidates(riding, record, use_negation=False)
    assert [c.change_type for c in without_negation] == [
        ChangeType.ANTONYM, ChangeType.SUBJECT_REPLACE, ChangeType.OBJECT_REPLACE]


def test_relation_foil_types_are_drawn_uniformly_over_candidates():
    # 4 candidates for "man is riding brown horse": 25% each, not 2/5 for object_replace
    # (two entity foils of the object) as when every replacement was its own candidate.
    record = horse_record()
    riding = record.relations[0]
    only_riding = UnitsRecord("x", "x", record.caption, "train", record.entities, (riding,))
    config = SamplingConfig(num_unit_slots=1, relation_prob=1.0)
    num = 4000
    types = Counter(draw_unit_slots(only_riding, config, sample_rng(0, f"s{i}", 0))[0].change_type
                    for i in range(num))
    assert set(types) == {"negation", "antonym", "subject_replace", "object_replace"}
    for n in types.values():
        assert abs(n / num - 0.25) <= _fraction_ci(0.25, num)


def test_relation_foil_weights_shift_the_draw_by_change_type():
    # Ours: antonym 3, negation 0, the others 1 -> 3/5, 0, 1/5, 1/5.
    record = horse_record()
    riding = record.relations[0]
    only_riding = UnitsRecord("x", "x", record.caption, "train", record.entities, (riding,))
    config = validate_config(SamplingConfig, {
        "num_unit_slots": 1, "relation_prob": 1.0,
        "relation_foil_weights": {"antonym": 3, "negation": 0}})
    assert config.relation_foil_weights == {ChangeType.ANTONYM: 3.0, ChangeType.NEGATION: 0.0}
    num = 4000
    types = Counter(draw_unit_slots(only_riding, config, sample_rng(0, f"s{i}", 0))[0].change_type
                    for i in range(num))
    assert "negation" not in types
    for name, share in (("antonym", 0.6), ("subject_replace", 0.2), ("object_replace", 0.2)):
        assert abs(types[name] / num - share) <= _fraction_ci(share, num)
    # All candidates at weight 0: the uniform draw, never a crash.
    zero = config.model_copy(update={"relation_foil_weights": {
        t: 0.0 for t in ChangeType}})
    assert draw_unit_slots(only_riding, zero, sample_rng(0, "z", 0))[0].kind == "relation"
    # Empty weights draw exactly what the authors' sampler draws (the same rng calls).
    plain = SamplingConfig(num_unit_slots=1, relation_prob=1.0)
    ones = plain.model_copy(update={"relation_foil_weights": {}})
    assert all(draw_unit_slots(only_riding, plain, sample_rng(1, f"s{i}", 0))
               == draw_unit_slots(only_riding, ones, sample_rng(1, f"s{i}", 0)) for i in range(50))
    with pytest.raises(ConfigError, match="relation_foil_weights"):
        validate_config(SamplingConfig, {"relation_foil_weights": {"antonyms": 2}})
    with pytest.raises(ConfigError, match="relation_foil_weights"):
        validate_config(SamplingConfig, {"relation_foil_weights": {"antonym": -1}})


def test_stored_swap_is_a_candidate_but_none_is_built():
    record = horse_record()
    next_to = record.relations[1]   # symmetric: a built swap would be true
    assert "red car is next to brown horse" not in _texts(relation_foil_candidates(next_to, record))
    swapped = Unit.relation("man", "is riding", "brown horse", [Foil.relation(
        "brown horse", "is riding", "man", ChangeType.SUBJECT_OBJECT_SWAP)])
    assert FoilCandidate(ChangeType.SUBJECT_OBJECT_SWAP, ("brown horse is riding man",)) in \
        relation_foil_candidates(swapped, record)


def test_relation_foil_that_is_another_true_relation_is_dropped():
    # "man is riding brown horse" has a stored antonym "man is feeding brown horse" and a
    # subject replacement "woman is riding brown horse" (man's foil): both are candidates
    # until the sample also states them as relations, which makes them true of the image.
    man = Unit.entity("man", [Foil("woman", OBJ)])
    entities = (man, Unit.entity("woman"), Unit.entity("brown horse"))
    riding = Unit.relation("man", "is riding", "brown horse", [
        Foil.relation("man", "is feeding", "brown horse", ChangeType.ANTONYM)])
    feeding = Unit.relation("man", "is feeding", "brown horse")
    woman_riding = Unit.relation("woman", "is riding", "brown horse")
    caption = "a man and a woman riding and feeding a brown horse"
    alone = UnitsRecord("t", "t", caption, "train", entities, (riding,))
    both_true = UnitsRecord("t", "t", caption, "train", entities, (riding, feeding, woman_riding))
    true_texts = {"man is feeding brown horse", "woman is riding brown horse"}
    assert true_texts <= set(_texts(relation_foil_candidates(riding, alone)))
    kept = relation_foil_candidates(riding, both_true)
    assert not true_texts & set(_texts(kept))
    # Both were its only foils (the horse has none): no candidate is left, none empty.
    assert kept == []


# --- caption-level negative ---------------------------------------------------------------

def test_shuffle_keeps_the_words_and_changes_their_order():
    caption = "a man is riding a brown horse next to a red car"
    rng = sample_rng(0, "x", 0)
    for _ in range(50):
        text = shuffle_caption(caption, frozenset({"man", "brown", "horse", "red", "car"}), rng)
        assert sorted(text.split()) == sorted(caption.split()) and text != caption
    assert shuffle_caption("dog", frozenset({"dog"}), rng) is None


def test_inplace_negative_replaces_one_whole_word_entity():
    config = SamplingConfig(swap_prob=0.0, inplace_prob=1.0)
    record = UnitsRecord("c", "c", "a cat tries to catch a cat toy", "train",
                         (Unit.entity("cat", [Foil("dog", OBJ)]),))
    negative = draw_caption_negative(record, config, sample_rng(0, "c", 0))
    assert negative.kind == NegativeKind.INPLACE
    assert negative.text == "a dog tries to catch a cat toy"


def test_entity_composite_is_a_random_subset_of_other_entities_and_one_foil():
    config = SamplingConfig(swap_prob=0.0, inplace_prob=0.0, relation_negative_prob=0.0)
    record = horse_record()
    foils = {f.text: e.text for e in record.entities for f in e.foils}
    sizes = Counter()
    for i in range(300):
        negative = draw_caption_negative(record, config, sample_rng(0, f"s{i}", 0))
        parts = negative.text.split(" and ")
        assert negative.kind == NegativeKind.ENTITY_COMPOSITE
        (foil,) = [p for p in parts if p in foils]
        assert set(parts) - {foil} <= {e.text for e in record.entities} - {foils[foil]}
        sizes[len(parts)] += 1
    assert set(sizes) == {1, 2, 3}  # 0, 1 or 2 of the other entities ride along


def test_relation_composite_is_entities_where_a_stored_relation_foil():
    config = SamplingConfig(swap_prob=0.0, inplace_prob=0.0, relation_negative_prob=1.0)
    record = horse_record()
    stored = {f.text for r in record.relations for f in r.foils}
    entity_texts = {e.text for e in record.entities}
    for i in range(100):
        negative = draw_caption_negative(record, config, sample_rng(0, f"s{i}", 0))
        assert negative.kind == NegativeKind.RELATION_COMPOSITE
        entities, foil = negative.text.split(" where ")
        # A stored antonym / negation / swap foil, never a built replacement.
        assert foil in stored
        parts = entities.split(" and ")
        assert parts and set(parts) <= entity_texts and len(set(parts)) == len(parts)
    without = UnitsRecord("n", "n", record.caption, "train", record.entities)
    assert draw_caption_negative(without, config, sample_rng(0, "n", 0)).kind == \
        NegativeKind.ENTITY_COMPOSITE


def test_caption_with_no_possible_negative_is_marked_not_paired_with_itself():
    record = UnitsRecord("one", "one", "dog", "train", (Unit.entity("dog"),))
    negative = draw_caption_negative(record, SamplingConfig(), sample_rng(0, "one", 0))
    assert negative.kind == NegativeKind.NONE
    texts = sample_texts(record, SamplingConfig(), 0, 0)
    assert texts.has_negative is False and texts.has_units is False
    # A shuffle is only drawn with swap_prob (no forced shuffle when the coin says no).
    bare = UnitsRecord("b", "b", "a dog on a sofa", "train", (Unit.entity("dog"),))
    no_swap = SamplingConfig(swap_prob=0.0)
    assert draw_caption_negative(bare, no_swap, sample_rng(0, "b", 0)).kind == NegativeKind.NONE
    columns = sample_text_columns([record, horse_record()], SamplingConfig(), 0, 0)
    assert columns["negative_mask"] == [False, True]


# --- batches and configs ------------------------------------------------------------------

def test_text_columns_from_a_ray_style_numpy_batch():
    config = SamplingConfig(num_unit_slots=2)
    recs = [horse_record("a"), UnitsRecord("b", "b", "nothing here", "train")]
    table = records_to_table(recs)
    # Ray Data's "numpy" batches hold nested list<struct> columns as numpy object arrays;
    # sample_text_columns takes their rows as they are.
    batch = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
    rows = [{name: values[i] for name, values in batch.items()} for i in range(len(recs))]
    columns = sample_text_columns(rows, config, seed=3, epoch=2)
    assert set(columns) == {"caption", "caption_negative", "unit_0", "foil_0", "unit_1", "foil_1",
                            "unit_mask", "negative_mask"}
    assert columns["unit_mask"] == [True, False]
    expected = sample_texts(recs[0], config, 3, 2)
    assert (columns["unit_0"][0], columns["foil_1"][0]) == (expected.units[0], expected.foils[1])
    assert all(len(values) == 2 for values in columns.values())
    # Plain row dicts (Ray's iter_rows / pyarrow to_pylist) work too.
    assert sample_text_columns(pa.Table.to_pylist(table), config, 3, 2) == columns


def test_bad_sampling_config_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match="relation_prob"):
        validate_config(SamplingConfig, {"relation_prob": 1.5})
    with pytest.raises(ConfigError, match="num_unit_slots"):
        validate_config(SamplingConfig, {"num_unit_slots": 0})
    # The authors' defaults: negation foils are candidates, swap and in-place always tried.
    defaults = SamplingConfig()
    assert defaults.use_negation is True and defaults.swap_prob == defaults.inplace_prob == 1.0


# --- world records: the truth oracle judges every sampled text -----------------------------

def test_world_units_are_true_and_foils_false_under_the_oracle():
    world = pytest.importorskip("csclip.world")
    config = world.WorldConfig(seed=5, num_train=40, num_val=1, num_test=1)
    sampling = SamplingConfig(num_unit_slots=3, relation_prob=0.5, use_negation=True)
    checked = 0
    for index in range(40):
        record = world.world_record(config, "train", index)
        scene = world.scene_from_record(record)
        texts = sample_texts(record, sampling, seed=0, epoch=index % 3)
        assert texts.has_units
        for unit, foil in zip(texts.units, texts.foils, strict=True):
            assert scene.holds(unit), unit
            assert not scene.holds(foil), (unit, foil)
            checked += 1
        negative = draw_caption_negative(record, SamplingConfig(swap_prob=0, inplace_prob=0),
                                         sample_rng(0, record.sample_id, 0))
        if negative.kind == NegativeKind.RELATION_COMPOSITE:
            # "A and B where s r' o": true entities, a false relation.
            entities, relation = negative.text.split(" where ")
            assert scene.holds(entities) and not scene.holds(relation), negative.text
        else:
            assert negative.kind == NegativeKind.ENTITY_COMPOSITE and not scene.holds(negative.text)
    assert checked == 120

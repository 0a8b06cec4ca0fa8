"""The rules backend: hand-checked units on real captions, honest rejections, valid and
deterministic foils, and F1 against the synthetic world's gold units."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.errors import DataError
from csclip.extract import lexicon as lx
from csclip.extract.quality import (
    GoldCaption,
    GoldScores,
    Prediction,
    entity_head,
    load_gold,
    rules_prediction,
    score_against_gold,
    score_caption,
    score_gold,
)
from csclip.extract.rules import (
    RulesResult,
    extract_record,
    extract_units,
    foil_category,
)
from csclip.units import (
    ChangeType,
    Foil,
    RejectReason,
    Unit,
    UnitsRecord,
    foil_rejection,
    render_relation,
    validate_record,
)


def texts(units) -> list[str]:
    return [u.text for u in units]


def load_captions(sugarcrepe_dir, limit: int | None = None) -> list[str]:
    captions: list[str] = []
    for path in sorted(sugarcrepe_dir.glob("*.json")):
        data = json.loads(path.read_text())
        captions += [data[k]["caption"] for k in sorted(data, key=int)]
    return captions[:limit] if limit else captions


# --- hand-checked captions ---------------------------------------------------------------

def test_world_style_caption_gives_entities_and_spatial_relation():
    result = extract_units("There is a small green triangle to the left of a large red circle.")
    assert texts(result.entities) == ["small green triangle", "large red circle"]
    assert texts(result.relations) == ["small green triangle is left of large red circle"]
    foils = {f.change_type: f.text for f in result.relations[0].foils}
    assert foils[ChangeType.ANTONYM] == "small green triangle is right of large red circle"
    assert foils[ChangeType.NEGATION] == "small green triangle is not left of large red circle"
    assert foils[ChangeType.SUBJECT_OBJECT_SWAP] == (
        "large red circle is left of small green triangle")


def test_pronoun_relation_points_back_at_the_first_object():
    result = extract_units("A blue square, with a red circle to its left.")
    # No "blue square has red circle": the "with" only introduces the second object.
    assert texts(result.relations) == ["red circle is left of blue square"]


def test_sugarcrepe_verb_and_preposition_relations():
    result = extract_units("A young man on a wooden bench using a laptop.")
    assert texts(result.entities) == ["young man", "wooden bench", "laptop"]
    assert texts(result.relations) == ["young man is on wooden bench",
                                       "young man is using laptop"]


def test_coordinated_subjects_share_the_predicate():
    result = extract_units("A cat and dog napping together on the couch.")
    assert texts(result.relations) == ["cat is napping on couch", "dog is napping on couch"]


def test_third_person_verb_is_normalised_with_its_auxiliary():
    result = extract_units("Two zebras graze on grass inside of an enclosure.")
    assert texts(result.relations) == ["two zebras are grazing on grass",
                                       "two zebras are inside enclosure"]


def test_with_object_takes_the_following_participle():
    result = extract_units("Blue bathroom with two white towels hanging by the shower.")
    assert "blue bathroom has two white towels" in texts(result.relations)
    assert "two white towels are hanging by shower" in texts(result.relations)
    assert "blue bathroom is hanging by shower" not in texts(result.relations)


def test_pronoun_refers_to_the_phrase_before_its_subject():
    result = extract_units(
        "Small bedroom with a bed and dresser with a small monitor on top of it.")
    assert "small monitor is on top of dresser" in texts(result.relations)
    assert "small bedroom has small monitor" not in texts(result.relations)
    # "it" is singular: the desktop, not the two computers just before the fruit.
    result = extract_units("A desktop with two computers and fruit on it.")
    assert "fruit is on desktop" in texts(result.relations)


def test_place_after_a_with_object_goes_to_the_object_in_a_room_else_to_the_holder():
    # A room does not stand on a table: what is placed is the thing the room has.
    result = extract_units("a bright kitchen with tulips on the table and plants by the window")
    assert texts(result.relations) == ["bright kitchen has tulips", "tulips are on table",
                                       "bright kitchen has plants", "plants are by window"]
    # A toilet is next to the shower, not its seat.
    result = extract_units("A toilet with a black seat next to a shower.")
    assert texts(result.relations) == ["toilet has black seat", "toilet is next to shower"]
    # "A with B on it": both.
    result = extract_units("A table with several dishes on it.")
    assert texts(result.relations) == ["table has several dishes", "several dishes are on table"]


def test_infinitives_paths_and_verbs_after_an_object_keep_the_subject():
    result = extract_units("A tennis player trying to hit a tennis ball.")
    assert texts(result.relations) == ["tennis player is trying to hit tennis ball"]
    result = extract_units("A man in uniform rides a horse down the street.")
    assert "man is riding down street" in texts(result.relations)
    result = extract_units("A man is drinking water from a red bottle.")
    assert texts(result.relations) == ["man is drinking water", "man is drinking from red bottle"]
    result = extract_units("A male tennis player stands on court and prepares to hit the ball.")
    assert "male tennis player is preparing to hit ball" in texts(result.relations)


def test_agentive_passive_is_read_as_active_and_stative_one_is_kept():
    result = extract_units("A trolley that is being pulled by a white horse.")
    assert texts(result.relations) == ["white horse is pulling trolley"]
    result = extract_units("Men on bikes are getting pulled by a group of dogs.")
    assert "group of dogs is pulling men" in texts(result.relations)
    result = extract_units("A lush green valley surrounded by tall mountains.")
    assert texts(result.relations) == ["lush green valley is surrounded by tall mountains"]


def test_clothing_goes_to_the_nearest_person_and_surfaces_are_not_guessed():
    result = extract_units("A girl in a floral dress sitting next to a boy in a blue shirt.")
    assert "boy is in blue shirt" in texts(result.relations)
    assert "girl is in blue shirt" not in texts(result.relations)
    # The keyboard is on the desk, not the person; which one the caption means is not read.
    result = extract_units("A person uses a black computer keyboard on a wooden desk.")
    assert texts(result.relations) == ["person is using black computer keyboard"]


def test_person_after_and_starts_a_new_subject():
    result = extract_units("a little girl in a blue apron and a girl in a red apron")
    assert texts(result.relations) == ["little girl is in blue apron", "girl is in red apron"]


def test_worn_things_never_act():
    result = extract_units("A man in a white shirt and a red hat catches a white frisbee.")
    assert "man is catching white frisbee" in texts(result.relations)
    result = extract_units("A sheep with short hair stands under a fence.")
    assert "sheep is standing under fence" in texts(result.relations)


def test_body_parts_and_participles_are_not_misread():
    result = extract_units("A woman holding hands over their heads.")
    assert "hands are over heads" in texts(result.relations)
    assert "woman is over heads" not in texts(result.relations)
    result = extract_units("A man with a shirt and a tie posing near a car.")
    assert "man is posing near car" in texts(result.relations)
    # "posing for a picture": the picture is being taken, it is not a thing in view.
    result = extract_units("A man with a shirt and a tie posing for a picture.")
    assert "picture" not in texts(result.entities)
    assert not any(r.subject == "tie" for r in result.relations)
    # "snow covered" is an adjective here, not "woman is covered forest".
    result = extract_units("A young woman skiing through a snow covered forest.")
    assert texts(result.relations) == ["young woman is skiing through snow"]


def test_shared_auxiliary_does_not_change_each_subjects_number():
    result = extract_units("A zebra and two elephants are on a grassy field.")
    assert texts(result.relations) == ["zebra is on grassy field",
                                       "two elephants are on grassy field"]


def test_function_words_are_not_dropped_as_modifiers():
    # "about" is not an unknown adjective of "piece of pizza": no "talking piece of pizza".
    result = extract_units("A young man and a small boy are talking about a piece of pizza.")
    assert result.relations == ()


def test_second_coordinated_subject_keeps_its_base_verb():
    result = extract_units("A man and woman sit on benches.")
    assert texts(result.relations) == ["man is sitting on benches", "woman is sitting on benches"]


def test_unreadable_subject_gives_no_relations():
    # The subject ("woman model") is unknown: nothing may be pinned on the chair.
    result = extract_units("a young Asian woman model sitting on a folding chair in a "
                           "sleeveless dress, high heels and holding an umbrella")
    assert "folding chair" in texts(result.entities)
    assert result.relations == ()


def test_counts_and_attributes_get_attribute_foils():
    result = extract_units("A brown cow and two black cows eating grass in a field.")
    cows = next(u for u in result.entities if u.text == "two black cows")
    attribute_foils = [f.text for f in cows.foils_of(ChangeType.ATTRIBUTE_CHANGE)]
    assert "three black cows" in attribute_foils
    object_foils = cows.foils_of(ChangeType.OBJECT_CHANGE)
    assert object_foils and all(f.text.startswith("two black ") for f in object_foils)


def test_object_foil_stays_in_category_and_out_of_the_caption():
    result = extract_units("A man riding a horse on the beach.")
    man = result.entities[0]
    foils = [f.text for f in man.foils_of(ChangeType.OBJECT_CHANGE)]
    # Two, as the entity has no attribute to change; never a synonym or hypernym (guy,
    # person) and never a noun the caption names.
    assert len(foils) == 2
    assert set(foils) <= {"woman", "boy", "girl", "lady"}


def test_symmetric_predicate_gets_no_swap_foil():
    result = extract_units("A vase filled with flowers next to a smaller vase.")
    next_to = next(u for u in result.relations if "next to" in u.text)
    assert not next_to.foils_of(ChangeType.SUBJECT_OBJECT_SWAP)


# --- honesty -------------------------------------------------------------------------------

def test_caption_without_known_noun_is_rejected_with_reason():
    result = extract_units("Something glimmers beyond the horizon.")
    assert result.is_empty and not result.relations
    assert result.rejections[-1].reason == RejectReason.UNPARSED
    assert "no known object noun" in result.rejections[-1].detail


def test_empty_caption_is_rejected():
    result = extract_units("   ")
    assert result.is_empty
    assert [r.reason for r in result.rejections] == [RejectReason.EMPTY_CAPTION]


def test_unknown_verb_gives_no_relation_but_says_why():
    result = extract_units("A cat swats at the plant.")
    assert texts(result.entities) == ["cat", "plant"]
    assert not result.relations
    assert any("verb 'swats' not in lexicon" in r.detail for r in result.rejections)


def test_unknown_compound_head_is_not_guessed():
    # "toilet brush" is not a toilet: the head noun is unknown, so no entity is claimed.
    result = extract_units("A cat is on a toilet brush.")
    assert texts(result.entities) == ["cat"]
    assert any("head noun of 'toilet brush'" in r.detail for r in result.rejections)
    # Once the lexicon knows the head, the compound is an entity with that head.
    assert "toilet seat" in texts(extract_units("A cat is on a toilet seat.").entities)


def test_negated_caption_relation_is_not_claimed():
    result = extract_units("A man is not riding a horse.")
    assert not result.relations
    assert any("negated" in r.detail for r in result.rejections)


# --- properties on real captions ---------------------------------------------------------

@pytest.fixture(scope="module")
def sample_captions(sugarcrepe_dir) -> list[str]:
    return load_captions(sugarcrepe_dir)[::25]  # ~300 captions across all seven files


@pytest.fixture(scope="module")
def sample_results(sample_captions) -> list[tuple[str, RulesResult]]:
    return [(caption, extract_units(caption)) for caption in sample_captions]


def test_every_foil_passes_foil_rejection(sample_results):
    for caption, result in sample_results:
        entity_texts = texts(result.entities)
        for unit in result.entities + result.relations:
            for foil in unit.foils:
                assert foil_rejection(unit, foil, caption, entity_texts) is None, (caption, foil)


def test_relations_use_caption_entities_and_survive_validate_record(sample_results):
    for caption, result in sample_results:
        names = set(texts(result.entities))
        for relation in result.relations:
            assert relation.subject in names and relation.object in names
        record = UnitsRecord("s", "i", caption, "test", result.entities, result.relations)
        cleaned, rejected = validate_record(record)
        assert cleaned.entities == record.entities and cleaned.relations == record.relations
        assert rejected == []


def test_entity_texts_appear_verbatim_in_the_caption(sample_results):
    for caption, result in sample_results:
        normalized = " ".join(caption.lower().replace(",", " , ").split())
        for unit in result.entities:
            assert unit.text in normalized, (unit.text, caption)


def test_extraction_is_deterministic_across_processes(sample_captions):
    captions = sample_captions[:40]
    here = [extract_units(c) for c in captions]
    code = ("import json, sys; from csclip.extract.rules import extract_units; "
            "caps = json.load(sys.stdin); "
            "print(json.dumps([[[u.text, [f.text for f in u.foils]] for u in "
            "r.entities + r.relations] for r in map(extract_units, caps)]))")
    # A fresh interpreter has a different str-hash salt: foil choice must not depend on it.
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(captions),
                         capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "12345", "PATH": ""})
    there = json.loads(out.stdout)
    assert there == [[[u.text, [f.text for f in u.foils]] for u in r.entities + r.relations]
                     for r in here]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="abcdefghijklmnopqrstuvwxyz ,.'-", max_size=80))
def test_any_text_gives_units_or_a_reason(text):
    result = extract_units(text)
    assert isinstance(result, RulesResult)
    assert result.entities or result.rejections
    for relation in result.relations:
        assert relation.subject in texts(result.entities)


_VOCABULARY = sorted(
    {"a", "the", "two", "red", "small", "wooden", "man", "dogs", "horse", "table", "sheep",
     "group", "of", "with", "and", ",", ".", "is", "are", "riding", "sits", "on", "next",
     "to", "it", "its", "left", "that", "while", "not", "in", "front", "filled", "there",
     "has", "toilet", "seat", "brush", "close", "up", "picture", "the background"}
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(_VOCABULARY), min_size=1, max_size=14))
def test_lexicon_word_salad_keeps_the_invariants(words):
    # Sequences of known words reach every parsing branch; whatever comes out must still
    # be well-formed: relations over caption entities, every foil valid.
    caption = " ".join(words)
    result = extract_units(caption)
    names = texts(result.entities)
    assert len(set(names)) == len(names)
    for relation in result.relations:
        assert relation.subject in names and relation.object in names
        assert relation.subject != relation.object
    for unit in result.entities + result.relations:
        for foil in unit.foils:
            assert foil_rejection(unit, foil, caption, names) is None


# --- scoring -------------------------------------------------------------------------------

def _record(sample_id: str, entities: list[str], relations: list[tuple[str, str, str]]):
    return UnitsRecord(sample_id, sample_id, "c", "val",
                       tuple(Unit.entity(e) for e in entities),
                       tuple(Unit.relation(*r) for r in relations))


def test_score_counts_matches_on_normalized_text():
    above = ("red circle", "is above", "blue square")
    gold = [_record("a", ["red circle", "blue square"], [above]), _record("b", ["cat"], [])]
    predicted = [_record("a", ["Red circle", "green cross"], [above]),
                 _record("b", ["cat", "mat"], [])]
    scores = score_against_gold(predicted, gold)
    assert (scores.entity.true_positives, scores.entity.false_positives,
            scores.entity.false_negatives) == (2, 2, 1)
    assert scores.entity.precision == pytest.approx(0.5)
    assert scores.entity.recall == pytest.approx(2 / 3)
    assert scores.relation.f1 == pytest.approx(1.0)
    assert scores.as_dict()["entity_f1"] == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))


def test_score_rejects_misaligned_records():
    gold = [_record("a", ["cat"], [])]
    with pytest.raises(DataError, match="sort both by sample_id"):
        score_against_gold([_record("b", ["cat"], [])], gold)
    with pytest.raises(DataError, match="1 gold records"):
        score_against_gold([], gold)


def test_world_f1_is_at_least_095():
    from csclip.config.world import WorldConfig
    from csclip.world import iter_world

    config = WorldConfig(seed=7, num_train=0, num_val=300, num_test=0)
    gold = list(iter_world(config, splits=("val",)))
    predicted = [extract_record(record)[0] for record in gold]
    assert all(p.source == "rules" and p.image_bytes == g.image_bytes
               for p, g in zip(predicted, gold, strict=True))
    scores = score_against_gold(predicted, gold)
    assert scores.entity.f1 >= 0.95, scores.as_dict()
    assert scores.relation.f1 >= 0.95, scores.as_dict()
    # Results as RulesResult (no ids) score the same way.
    results = [extract_units(record.caption) for record in gold[:50]]
    assert score_against_gold(results, gold[:50]) == score_against_gold(predicted[:50], gold[:50])


def test_world_foils_are_never_true_of_the_scene():
    from csclip.config.world import WorldConfig
    from csclip.world import WorldLanguageError, iter_world, scene_from_record

    config = WorldConfig(seed=3, num_train=0, num_val=80, num_test=0)
    judged = 0
    for record in iter_world(config, splits=("val",)):
        scene = scene_from_record(record)
        result = extract_units(record.caption)
        for unit in result.entities + result.relations:
            assert scene.holds(unit.text), unit.text  # units are true...
            for foil in unit.foils:
                try:
                    assert not scene.holds(foil.text), (record.caption, foil.text)  # ...foils not
                    judged += 1
                except WorldLanguageError:
                    pass  # "pink circle": outside the oracle's vocabulary
    assert judged > 300


def test_rules_module_does_not_import_ray():
    code = "import sys, csclip.extract.rules; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


# --- absence -------------------------------------------------------------------------------

@pytest.mark.parametrize(("caption", "present", "absent"), [
    ("A rowboat with paddles and no passengers is on the beach.", ["paddles", "beach"],
     ["passengers"]),
    ("A young girl without a green jacket eating a piece of pepperoni pizza.", ["young girl"],
     ["green jacket"]),
    ("A bathroom with no toilets and a red and green bucket.", ["bathroom"], ["toilets"]),
    ("A pizza with a slice missing is sitting on a pizza stand.", ["pizza"], ["slice"]),
    ("A messy bedroom doesn't have any red brick walls.", ["messy bedroom"],
     ["red brick walls"]),
    ("A plate without a banana and slices of cheese.", ["plate"], ["banana", "slices of cheese"]),
    ("A No bicycles, skates or skateboards sign on a pole.", ["sign", "pole"],
     ["bicycles", "skates", "skateboards"]),
    ("The shirtless men are riding horses through the lake.", ["shirtless men", "horses"],
     ["shirt"]),
])
def test_what_the_caption_says_is_absent_is_never_a_unit(caption, present, absent):
    result = extract_units(caption)
    names = texts(result.entities)
    assert set(present) <= set(names), names
    assert list(result.absent) == absent
    absent_heads = {a.split()[-1] for a in absent}
    for unit in result.entities:
        assert unit.text.split()[-1] not in absent_heads, unit.text
    for relation in result.relations:
        assert relation.subject not in absent and relation.object not in absent


def test_absence_reads_the_rest_as_if_it_were_not_written():
    result = extract_units("A person without a rainbow umbrella looking at the ocean.")
    assert texts(result.relations) == ["person is looking at ocean"]
    # "No" before one conjunct does not reach a later one with its own determiner.
    result = extract_units("A bathroom with no toilets and a red bucket.")
    assert "bathroom has red bucket" in texts(result.relations)
    # "with and without food": there is food.
    assert "food" in texts(extract_units("plates, with and without food").entities)


def test_absence_is_kept_in_the_record_meta():
    record = UnitsRecord("s", "i", "A train at the station with no passengers around.", "val")
    extracted, _ = extract_record(record)
    assert json.loads(extracted.meta["absent"]) == ["passengers"]
    assert "passengers" not in texts(extracted.entities)


# --- foils a person would write: the property over every caption of the shared data -------

def _shared_captions(sugarcrepe_dir) -> list[str]:
    """Every distinct caption of the SugarCrepe files: the human captions and their
    edited negatives (15,022 strings, 8,554 distinct)."""
    captions: dict[str, None] = {}
    for path in sorted(sugarcrepe_dir.glob("*.json")):
        data = json.loads(path.read_text())
        for key in sorted(data, key=int):
            captions[data[key]["caption"]] = None
            captions[data[key]["negative_caption"]] = None
    return list(captions)


def _head_noun(text: str):
    words = text.split()
    for n in range(min(lx.MAX_NOUN_WORDS, len(words)), 0, -1):
        noun = lx.NOUNS.get(" ".join(words[-n:]))
        if noun is not None:
            return noun
    return None


def _slots(text: str) -> tuple[list[tuple[str, str]], list[str]]:
    """An entity text's attribute slots (word, kind) and the rest (its noun group, the head
    noun's words last)."""
    words = text.split()
    noun = _head_noun(text)
    size = len((noun.plural if text.endswith(noun.plural) else noun.singular).split()) if (
        noun) else 1
    modifiers, head = words[:-size], words[-size:]
    attributes = [(w, lx.ATTRIBUTE_KIND[w]) for w in modifiers if w in lx.ATTRIBUTE_KIND]
    rest = [w for w in modifiers if w not in lx.ATTRIBUTE_KIND] + [" ".join(head)]
    return attributes, rest


def _is_plural(text: str) -> bool | None:
    """The number of an entity text: its collective's ("boxes of pizza", "bunch of items"),
    else its head noun's; None when the form says nothing ("sheep")."""
    words = text.split()
    if "of" in words[1:-1]:
        collective = words[words.index("of") - 1]
        if collective in lx.COLLECTIVES:
            return collective in lx.PLURAL_COLLECTIVES or collective not in lx.COLLECTIVE_BASES
    noun = _head_noun(text)
    if noun is None or noun.singular == noun.plural:
        return None
    return text.endswith(noun.plural)


def _agrees(predicate: str, subject: str) -> bool:
    first = predicate.split()[0]
    plural = _is_plural(subject)
    if first not in ("is", "are", "has", "have", "does", "do") or plural is None:
        return True
    return (first in ("are", "have", "do")) == plural


def _foil_problem(unit, foil, entities) -> str | None:
    """Why `foil` is not a foil a person would write for `unit`, or None."""
    kind = foil.change_type
    if unit.kind == "entity":
        unit_attributes, unit_rest = _slots(unit.text)
        foil_attributes, foil_rest = _slots(foil.text)
        if kind == ChangeType.ATTRIBUTE_CHANGE:
            changed = [(a, b) for a, b in zip(unit_attributes, foil_attributes, strict=False)
                       if a != b]
            if foil_rest != unit_rest or len(unit_attributes) != len(foil_attributes):
                return "an attribute change touched more than one attribute"
            if len(changed) != 1 or changed[0][0][1] != changed[0][1][1]:
                return "an attribute change must change one attribute within its kind"
            return None
        head, new_head = _head_noun(unit.text), _head_noun(foil.text)
        if foil_attributes != unit_attributes:
            return "an object change must keep the attributes"
        if new_head is None or head is None or new_head.category != foil_category(head):
            return "an object change must stay in the noun's category"
        portable = lx.COLLECTIVES | lx.OTHER_ADJECTIVES | lx.QUANTITIES | lx.INTENSIFIERS
        if any(w in lx.HEAD_BOUND_ADJECTIVES or w.endswith("'s") or (
                w in lx.NOUNS and w not in portable) for w in foil_rest[:-1]):
            return "an object change kept a word bound to the old noun"
        return None
    if kind in (ChangeType.ANTONYM, ChangeType.NEGATION):
        ok = (foil.subject, foil.object) == (unit.subject, unit.object)
        return None if ok and foil.predicate != unit.predicate else "predicate change moved args"
    if kind == ChangeType.SUBJECT_OBJECT_SWAP:
        if (foil.subject, foil.object) != (unit.object, unit.subject):
            return "a swap must exchange subject and object"
        return None if _agrees(foil.predicate, foil.subject) else "swap disagrees in number"
    replaced, kept = ((foil.subject, unit.subject), (foil.object, unit.object)) if (
        kind == ChangeType.SUBJECT_REPLACE) else ((foil.object, unit.object),
                                                  (foil.subject, unit.subject))
    if kept[0] != kept[1] or foil.predicate.split()[1:] != unit.predicate.split()[1:]:
        return "a replacement changed more than its argument"
    if replaced[0] not in {f.text for f in entities[replaced[1]].foils}:
        return "a replacement must be one of the argument's entity foils"
    if kind == ChangeType.OBJECT_REPLACE:
        return None if foil.predicate == unit.predicate else "object replace changed the verb"
    return None if _agrees(foil.predicate, foil.subject) else "replacement disagrees in number"


@pytest.mark.slow  # all 8,554 distinct captions: ~20 s on an idle core
def test_every_foil_changes_one_slot_within_its_category_on_every_shared_caption(
        sugarcrepe_dir):
    problems, foils = [], 0
    for caption in _shared_captions(sugarcrepe_dir):
        result = extract_units(caption)
        entities = {u.text: u for u in result.entities}
        for unit in result.entities + result.relations:
            for foil in unit.foils:
                foils += 1
                problem = _foil_problem(unit, foil, entities)
                if problem:
                    problems.append((caption, unit.text, foil.text, problem))
    assert foils > 40_000
    assert not problems, problems[:20]


def test_foils_keep_kind_and_sense():
    result = extract_units("A tennis player trying to hit a tennis ball.")
    player = result.entities[0]
    # The compound goes with its head: never "tennis groom".
    assert all(not f.text.startswith("tennis ") for f in player.foils_of(ChangeType.OBJECT_CHANGE))
    result = extract_units("An elderly man and a young man on a bench.")
    for unit in result.entities[:2]:
        for foil in unit.foils_of(ChangeType.OBJECT_CHANGE):
            assert _head_noun(foil.text).singular not in lx.AGE_BOUND_NOUNS, foil.text
    cart = extract_units("A donkey is pulling a blue cart.").entities[1]
    assert all(_head_noun(f.text).category == "vehicle_small"
               for f in cart.foils_of(ChangeType.OBJECT_CHANGE))
    swap = extract_units("Two people wearing skis.").relations[0].foils_of(
        ChangeType.SUBJECT_OBJECT_SWAP)
    assert [f.text for f in swap] == ["skis are wearing two people"]


# --- the hand-annotated gold set of real captions ---------------------------------------

GOLD = Path(__file__).parent / "gold" / "sugarcrepe_gold.jsonl"


def test_gold_scores_do_not_fall():
    # docs/extraction.md reports these numbers; the floors sit just under them. The
    # held-out third was never looked at while the rules were tuned.
    scores = {k: v.as_dict() for k, v in score_gold(load_gold(GOLD), rules_prediction).items()}
    assert scores["all"]["captions"] == 230
    assert scores["all"]["entity_f1"] >= 0.97, scores["all"]
    assert scores["all"]["relation_f1"] >= 0.82, scores["all"]
    assert scores["heldout"]["entity_f1"] >= 0.95, scores["heldout"]
    assert scores["heldout"]["relation_f1"] >= 0.77, scores["heldout"]
    assert scores["all"]["predicate_exact"] >= 0.95, scores["all"]
    assert scores["all"]["negation_error_captions"] == 0, scores["all"]
    assert scores["all"]["captions_with_absent"] == 39


def test_gold_scorer_compares_head_nouns():
    assert entity_head("three boxes of pizza") == "box"
    assert entity_head("group of small children") == "child"
    assert entity_head("woman's head") == "head"
    assert entity_head("different types of couches") == "couch"
    gold = GoldCaption("x", "tune", "A man riding a brown horse without a saddle.",
                       ("man", "brown horse"), (("man", "is riding", "brown horse"),),
                       ("saddle",))
    scores = GoldScores()
    predicted = Prediction((Unit.entity("man"), Unit.entity("horse"), Unit.entity("saddle")),
                           (Unit.relation("man", "is on", "horse"),))
    score_caption(gold, predicted, scores)
    flat = scores.as_dict()
    assert (flat["entity_precision"], flat["entity_recall"]) == (pytest.approx(2 / 3), 1.0)
    assert flat["relation_f1"] == 1.0 and flat["predicate_exact"] == 0.0
    assert flat["attribute_exact"] == 0.5
    assert scores.negation_errors == [("x", "saddle")]


def test_gold_file_errors_are_one_clear_line(tmp_path):
    bad = tmp_path / "gold.jsonl"
    bad.write_text('{"sample_id": "a", "split": "tune", "caption": "c", "entities": ["cat"], '
                   '"relations": [{"subject": "dog", "predicate": "is on", "object": "cat"}]}\n')
    with pytest.raises(DataError, match="gold.jsonl:1: relation argument"):
        load_gold(bad)
    bad.write_text("not json\n")
    with pytest.raises(DataError, match="not a gold caption"):
        load_gold(bad)


# --- the extractor's own foil check against the generic one -------------------------------

def _foil_verdicts_disagree(captions, monkeypatch) -> tuple[int, list]:
    """Extract every caption with the extractor's per-caption foil check wrapped so that
    each candidate it judges is judged by `foil_rejection` too; the disagreements. Also
    checks the extractor's claim about each candidate: reading its text piece by piece
    gives what reading the whole text gives."""
    from csclip.extract.rules import foils

    judged, disagreements = [0], []
    fast = foils.FoilCheck.candidate_rejection
    seen: dict[int, tuple] = {}
    original_init = foils.FoilCheck.__init__

    def init(self, caption, entity_texts):
        original_init(self, caption, entity_texts)
        seen[id(self)] = (caption, list(entity_texts))

    def candidate_rejection(self, kind, unit_text, unit_reading, unit_arguments, candidate,
                            reading):
        caption, entity_texts = seen[id(self)]
        unit = Unit(kind, unit_text, (), unit_arguments[0], None, unit_arguments[1])
        foil = Foil(*candidate)
        mine = fast(self, kind, unit_text, unit_reading, unit_arguments, candidate, reading)
        reference = foil_rejection(unit, foil, caption, entity_texts)
        judged[0] += 1
        is_rendered = foil.subject is None or foil.text == render_relation(
            foil.subject, foil.predicate, foil.object)
        if mine != reference or unit_reading != foils._read_piece(unit_text) or (
                reading != foils._read_piece(foil.text)) or not is_rendered:
            disagreements.append((caption, unit.text, foil.text, mine, reference))
        return mine

    monkeypatch.setattr(foils.FoilCheck, "__init__", init)
    monkeypatch.setattr(foils.FoilCheck, "candidate_rejection", candidate_rejection)
    for caption in captions:
        extract_units(caption)
    return judged[0], disagreements


_CHECK_CAPTION = "A man riding a brown horse next to a red barn."
_CHECK_ENTITIES = ["man", "brown horse", "red barn", "old stable"]
_HORSE = Unit.entity("brown horse")
_RIDING = Unit.relation("man", "is riding", "brown horse")


@pytest.mark.parametrize(("unit", "foil"), [
    (_HORSE, Foil("white horse", ChangeType.ATTRIBUTE_CHANGE)),
    (_HORSE, Foil("Brown  Horse.", ChangeType.ATTRIBUTE_CHANGE)),  # equals the unit
    (Unit.entity("small dog"), Foil("little dog", ChangeType.ATTRIBUTE_CHANGE)),  # synonym
    (_HORSE, Foil("brown horses", ChangeType.OBJECT_CHANGE)),  # inflection
    (_HORSE, Foil("brown thing", ChangeType.OBJECT_CHANGE)),  # generic word
    (_HORSE, Foil("red barn", ChangeType.OBJECT_CHANGE)),  # in the caption
    (_HORSE, Foil("old stable", ChangeType.OBJECT_CHANGE)),  # another entity, not in the text
    (Unit.entity("man"), Foil("horse", ChangeType.OBJECT_CHANGE)),  # in the text, no entity
    (_HORSE, Foil("  ", ChangeType.OBJECT_CHANGE)),
    (_HORSE, Foil("N/A", ChangeType.OBJECT_CHANGE)),
    # Placeholders with a space in them (the fast check skips the regex for other such texts).
    (_HORSE, Foil("object 2", ChangeType.OBJECT_CHANGE)),
    (_HORSE, Foil("<brown horse>", ChangeType.OBJECT_CHANGE)),
    (_HORSE, Foil("Subject _", ChangeType.OBJECT_CHANGE)),
    (_HORSE, Foil("brown horse is under man", ChangeType.ANTONYM)),
    (_RIDING, Foil("black horse", ChangeType.ATTRIBUTE_CHANGE)),
    (_RIDING, Foil.relation("man", "is walking", "brown horse", ChangeType.ANTONYM)),
    (_RIDING, Foil.relation("man", "rides", "brown horse", ChangeType.ANTONYM)),
    (_RIDING, Foil.relation("man", "is riding", "red barn", ChangeType.OBJECT_REPLACE)),
    (_RIDING, Foil.relation("man", "null", "brown horse", ChangeType.NEGATION)),
    (_RIDING, Foil.relation("brown horse", "is riding", "man", ChangeType.SUBJECT_OBJECT_SWAP)),
    (Unit.relation("man", "is riding", "horse"),
     Foil.relation("horse", "is riding", "man", ChangeType.SUBJECT_OBJECT_SWAP)),
    (Unit.relation("man", "is near", "fence"),
     Foil.relation("fence", "is near", "man", ChangeType.SUBJECT_OBJECT_SWAP)),
])
def test_fast_foil_check_gives_foil_rejections_reason_for_each_rule(unit, foil):
    from csclip.extract.rules.foils import FoilCheck

    check = FoilCheck(_CHECK_CAPTION, _CHECK_ENTITIES)
    assert check.rejection(unit, foil) == foil_rejection(unit, foil, _CHECK_CAPTION,
                                                         _CHECK_ENTITIES)


def test_fast_foil_check_agrees_with_foil_rejection(sample_captions, monkeypatch):
    judged, disagreements = _foil_verdicts_disagree(sample_captions, monkeypatch)
    assert judged > 2_000
    assert not disagreements, disagreements[:10]


@pytest.mark.slow  # every distinct SugarCrepe caption string: ~12 s on an idle core
def test_fast_foil_check_agrees_with_foil_rejection_on_every_shared_caption(
        sugarcrepe_dir, monkeypatch):
    judged, disagreements = _foil_verdicts_disagree(_shared_captions(sugarcrepe_dir),
                                                    monkeypatch)
    assert judged > 80_000
    assert not disagreements, disagreements[:10]


def test_fast_unit_and_foil_builders_give_the_dataclasses_objects():
    # The extractor builds its Units and Foils without the frozen dataclasses' __init__;
    # the objects must be the ones __init__ builds, field for field (and stay frozen).
    from dataclasses import FrozenInstanceError, fields

    from csclip.extract.rules.foils import _make_foils, _make_unit

    args = ("man is under horse", ChangeType.ANTONYM, "man", "is under", "horse")
    (foil,), reference = _make_foils([(args, None)]), Foil(*args)
    assert list(vars(foil).items()) == list(vars(reference).items())
    assert [f.name for f in fields(Foil)] == list(vars(foil))
    assert foil == reference and hash(foil) == hash(reference) and repr(foil) == repr(reference)
    unit_args = ("relation", "man is riding horse", (foil,), "man", "is riding", "horse")
    unit, unit_reference = _make_unit(*unit_args), Unit(*unit_args)
    assert list(vars(unit).items()) == list(vars(unit_reference).items())
    assert [f.name for f in fields(Unit)] == list(vars(unit))
    assert unit == unit_reference and hash(unit) == hash(unit_reference)
    with pytest.raises(FrozenInstanceError):
        foil.text = "changed"  # type: ignore[misc]


# Everything extract_units returned for every 25th SugarCrepe caption (301), hashed:
# speed work must leave it unchanged. A deliberate change of the extractor's output
# updates it (print the digest below and say why in the commit).
_SAMPLE_OUTPUT_SHA256 = "fa013b1aa3ca0054dd182ff2e69807d7c07fc74af3bb8c78e271a7ada013a395"


def test_output_on_sample_captions_is_unchanged(sample_captions):
    import hashlib

    digest = hashlib.sha256()
    for caption in sample_captions:
        digest.update(repr(extract_units(caption)).encode())
        digest.update(b"\n")
    assert len(sample_captions) == 301
    assert digest.hexdigest() == _SAMPLE_OUTPUT_SHA256

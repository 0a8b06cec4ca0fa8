"""Every real-data benchmark loader on its fixture in the published format
(tests/fixtures/suites), scored with its official rule: known answers from ColorScorer,
ties, skipped items, and the capability table."""

from __future__ import annotations

import numpy as np
import pytest
from suites_helpers import FIXTURES, ColorScorer

from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.suites.aro import load_aro, order_perturbations, pre_caption
from csclip.eval.suites.core import (
    BenchmarkNotFound,
    MacroRule,
    choice_correct,
    evaluate_suite_data,
    macro_accuracy,
    pair_correct,
)
from csclip.eval.suites.registry import (
    BENCHMARKS,
    CAPABILITY_OF,
    evaluate_benchmarks,
    load_benchmarks,
)

ROOT = str(FIXTURES)


def score(loader):
    data = loader(ROOT)
    metrics, _ = evaluate_suite_data(Encoder(ColorScorer()), data)
    return data, metrics


def test_strict_rule_counts_a_tie_as_wrong_and_argmax_gives_it_to_the_first():
    tie = np.array([0.5, 0.5])
    assert not choice_correct(tie, (0,), "strict")
    assert choice_correct(tie, (0,), "argmax_first")  # true first: right
    assert not choice_correct(tie, (1,), "argmax_first")  # true second (ARO's VG): wrong
    assert choice_correct(np.array([0.9, 0.8, 0.1]), (0, 1), "strict")
    assert not choice_correct(np.array([0.9, 0.1, 0.5]), (0, 1), "strict")  # both must win


def test_pair_rule_is_winogrounds_strict_text_and_image_scores():
    assert pair_correct(1.0, 0.0, 0.0, 1.0) == (True, True)
    assert pair_correct(1.0, 0.0, 1.0, 1.0) == (False, False)  # ties fail
    assert pair_correct(1.0, 0.5, 0.2, 0.4) == (True, False)  # s11 < s01: image fails


def test_macro_accuracy_leaves_out_small_and_excluded_categories():
    correct = np.array([1, 1, 0, 0, 1])
    cats = ["a", "a", "b", "b", "c"]
    assert macro_accuracy(correct, cats, MacroRule(2)) == 0.5
    assert macro_accuracy(correct, cats, MacroRule(1, frozenset({"b"}))) == 1.0
    assert np.isnan(macro_accuracy(correct, cats, MacroRule(3)))


def test_aro_macro_accuracy_crops_and_order_ties():
    data, metrics = score(load_aro)
    # VG-R: "on" 25/25, "under" 20/25 (5 ties: the false caption is first, so a tie is
    # wrong), "near" has 2 items (< 25), "by" is symmetric: macro = (100 + 80) / 2.
    assert metrics["aro_vg_relation_i2t"] == pytest.approx(90.0)
    assert metrics["aro_vg_attribution_i2t"] == pytest.approx(100.0)  # the 3-item pair is out
    # The crop is the red left half of a red|blue image: the true caption "the red cup ..."
    # wins only because the box was cropped.
    assert all("#crop=0,0,8,8" in key for key in data.images if "scene" in key)
    # Order foils keep the colour word: every candidate ties, and the official argmax
    # gives the tie to the true caption (first).
    assert metrics["aro_coco_order_i2t"] == 100.0 and metrics["aro_coco_order_num"] == 2
    assert metrics["aro_flickr30k_order_i2t"] == 100.0
    assert metrics["aro_flickr30k_order_skipped"] == 1  # its image is not there
    assert metrics["aro_i2t"] == pytest.approx(np.mean([90.0, 100.0, 100.0, 100.0]))


def test_aro_order_foils_follow_the_official_four_perturbations():
    caption = "A red car parked by the road."
    foils = order_perturbations(caption)
    tokens = "A red car parked by the road .".split()
    # Seeded by the caption: these exact foils on every run and in every process.
    assert foils == ("A road parked red by the car .", "A red car parked . the road by",
                     "A car red by parked the road .", "road . A red car parked by the")
    assert all(sorted(f.split()) == sorted(tokens) for f in foils)
    nouns_adjectives, others, within, reordered = (f.split() for f in foils)
    content = {1, 2, 3, 6}  # red car parked road: the words not in the function-word list
    assert [w for i, w in enumerate(nouns_adjectives) if i not in content] == \
        [w for i, w in enumerate(tokens) if i not in content]
    assert [w for i, w in enumerate(others) if i in content] == [w for i, w in enumerate(tokens) if i in content]
    assert [sorted(within[i:i + 3]) for i in (0, 3, 6)] == [sorted(tokens[i:i + 3]) for i in (0, 3, 6)]
    groups = [tuple(tokens[i:i + 3]) for i in (0, 3, 6)]  # the trigrams, moved whole
    assert sorted(map(tuple, (reordered[0:2], reordered[2:5], reordered[5:8]))) == sorted(groups)
    assert pre_caption(caption) == "a red car parked by the road"


def test_winoground_pairs_tags_and_pooled_score():
    data, metrics = score(lambda root: BENCHMARKS["winoground"](root))
    # ex 0 and 1: colours decide (right); ex 2: no colour word, all ties (wrong); ex 3's
    # second image is missing: skipped.
    assert metrics["winoground_object_i2t"] == 100.0 and metrics["winoground_both_i2t"] == 0.0
    assert metrics["winoground_i2t"] == pytest.approx(200 / 3)  # pooled over 3 pairs
    assert metrics["winoground_group"] == pytest.approx(200 / 3)
    assert metrics["winoground_both_skipped"] == 1


def test_coco_counterfactuals_reads_the_winoground_layout():
    _, metrics = score(BENCHMARKS["coco_cf"])
    assert metrics["coco_cf_i2t"] == metrics["coco_cf_t2i"] == metrics["coco_cf_group"] == 100.0


def test_whatsup_argmax_gives_a_tie_to_the_true_first_option():
    _, metrics = score(BENCHMARKS["whatsup"])
    # red mug: right; four colourless options tie: right (official argmax); blue book with
    # "red ..." first: wrong.
    assert metrics["whatsup_controlled_a_i2t"] == pytest.approx(200 / 3)
    # COCO-QA: image 7 (red): right; image 8 is missing.
    assert metrics["whatsup_coco_one_i2t"] == 100.0 and metrics["whatsup_coco_one_skipped"] == 1


def test_sugarcrepe_suite_is_strict():
    _, metrics = score(BENCHMARKS["sugarcrepe"])
    assert metrics["sugarcrepe_swap_att_i2t"] == 50.0  # the colourless pair ties: wrong
    assert metrics["sugarcrepe_add_obj_i2t"] == 100.0 and metrics["sugarcrepe_add_obj_skipped"] == 1
    assert metrics["sugarcrepe_i2t"] == 75.0


def test_sugarcrepe_pp_needs_both_positives_and_finds_shared_coco_images():
    data, metrics = score(BENCHMARKS["sugarcrepe_pp"])
    assert all("/coco/val2017/" in key for key in data.images)
    assert metrics["sugarcrepe_pp_swap_att_i2t"] == 50.0  # caption2 without colour ties


def test_valse_keeps_validated_items_only():
    _, metrics = score(BENCHMARKS["valse"])
    # existence: 2 validated items (yellow ball: right; no colour at all: tie, wrong);
    # the third has mturk caption 1. actant_swap: foil starts with yellow: wrong.
    assert metrics["valse_existence_num"] == 2 and metrics["valse_existence_i2t"] == 50.0
    assert metrics["valse_actant_swap_i2t"] == 0.0


def test_colorswap_reads_parquet_with_inline_images():
    _, metrics = score(BENCHMARKS["colorswap"])
    assert metrics["colorswap_all_num"] == 2
    assert metrics["colorswap_i2t"] == metrics["colorswap_group"] == 50.0


def test_cola_pairs_from_image_urls():
    _, metrics = score(BENCHMARKS["cola"])
    assert metrics["cola_t2i"] == 50.0  # the official COLA score; the colourless pair ties


def test_spec_image_to_text_and_text_to_image():
    _, metrics = score(BENCHMARKS["spec"])
    # I2T: red image picks "a red ball" (label 1): right; colourless keys tie, argmax takes
    # index 0 but the label is 1: wrong. T2I: "a blue ball" picks image b (label 1):
    # right; "a ball" ties, argmax 0 = label: right.
    assert metrics["spec_absolute_spatial_i2t"] == 50.0
    assert metrics["spec_absolute_spatial_t2i"] == 100.0


def test_svo_probes_is_text_to_image_only():
    _, metrics = score(BENCHMARKS["svo_probes"])
    # The official match / no-match rule: the median of the unique pairs' cosines
    # (1, 0, 0, 0) is 0, a pair matches above it. "A red girl": its red image matches,
    # the blue one does not: 100. Colourless: the positive does not match, the negative
    # rightly does not: (0 + 100) / 2.
    assert metrics["svo_probes_subj_neg_t2i"] == 100.0
    assert metrics["svo_probes_verb_neg_t2i"] == 50.0
    assert metrics["svo_probes_obj_neg_skipped"] == 1
    assert "svo_probes_i2t" not in metrics


def test_bla_gives_per_sentence_credit_as_its_official_script():
    _, metrics = score(BENCHMARKS["bla"])
    # The first item ranks its two true sentences first: credit 1. The second's True2 ties
    # the false ones at CLIPScore 0, and the official torch.topk ranks it last (True1,
    # False1, False2, True2; tests/fixtures/official_outputs/bla_ties.json): credit 1/2.
    assert metrics["bla_active_passive_i2t"] == 75.0


def test_vl_checklist_reads_its_corpus_configs():
    _, metrics = score(BENCHMARKS["vl_checklist"])
    # color: red kite on red: right; blue kite on green: wrong (both 0 vs red 0: a tie).
    assert metrics["vl_checklist_attribute_color_i2t"] == 50.0
    # spatial: no colour words, a tie: wrong (strict); one image missing.
    assert metrics["vl_checklist_relation_spatial_i2t"] == 0.0
    assert metrics["vl_checklist_relation_spatial_skipped"] == 1
    # Object/Size/large names an annotation file this copy does not have: not a subset.
    assert not any(k.startswith("vl_checklist_object") for k in metrics)


def test_missing_benchmark_is_one_line_and_others_still_run(tmp_path, caplog):
    (tmp_path / "sugarcrepe").mkdir()
    with pytest.raises(BenchmarkNotFound, match="winoground: not found under"):
        BENCHMARKS["winoground"](str(tmp_path))
    caplog.set_level("WARNING")
    metrics = evaluate_benchmarks(Encoder(ColorScorer()), ["winoground", "whatsup"], ROOT + "/nowhere")
    assert metrics == {}
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 2 and all("; skipped" in line and "expects" in line for line in lines)


def test_malformed_file_names_the_file(tmp_path):
    (tmp_path / "cola").mkdir()
    (tmp_path / "cola" / "COLA_multiobjects_matching_benchmark.json").write_text('{"a": 1}')
    with pytest.raises(DataError, match="COLA_multiobjects_matching_benchmark.json"):
        BENCHMARKS["cola"](str(tmp_path))


def test_a_file_of_only_malformed_records_is_the_wrong_file(tmp_path):
    (tmp_path / "cola").mkdir()
    (tmp_path / "cola" / "COLA_multiobjects_matching_benchmark.json").write_text('[{"a": 1}]')
    assert BENCHMARKS["cola"](str(tmp_path)).skip_counts == {("multi_objects",
                                                               "malformed_record"): 1}
    with pytest.raises(DataError, match="none of its 1 records is in the published format"):
        load_benchmarks(["cola"], str(tmp_path), allow_partial=True)


def test_capability_and_suite_averages():
    metrics = evaluate_benchmarks(Encoder(ColorScorer()), sorted(BENCHMARKS), ROOT,
                                  allow_partial=True)
    for name in BENCHMARKS:
        assert any(k.startswith(f"{name}_") for k in metrics), name
    relational = [metrics[f"{b}_{s}_i2t"] for (b, s), c in CAPABILITY_OF.items()
                  if c == "relational" and f"{b}_{s}_i2t" in metrics]
    assert metrics["cap_relational_i2t"] == pytest.approx(np.mean(relational))
    i2t = [metrics[f"{b}_i2t"] for b in BENCHMARKS if f"{b}_i2t" in metrics]
    assert metrics["suite_i2t"] == pytest.approx(np.mean(i2t))
    assert "suite_t2i" in metrics and "suite_group" in metrics


def test_every_fixture_subset_has_a_capability():
    metrics = evaluate_benchmarks(Encoder(ColorScorer()), sorted(BENCHMARKS), ROOT,
                                  allow_partial=True)
    subsets = {k.rsplit("_", 1)[0] for k in metrics if k.endswith("_num")}
    known = {f"{b}_{s}" for b, s in CAPABILITY_OF}
    assert subsets <= known, subsets - known


def test_limit_keeps_the_first_items_per_subset():
    data = load_aro(ROOT).limit(3)
    assert sum(1 for i in data.text_choices if i.subset == "vg_relation") == 3
    assert set(data.images) == {i.image for i in data.text_choices}


def test_a_malformed_record_is_a_counted_rejection_not_a_failed_file(tmp_path):
    import json
    import shutil

    shutil.copytree(FIXTURES / "aro", tmp_path / "aro")
    path = tmp_path / "aro" / "visual_genome_relation.json"
    rows = json.loads(path.read_text())
    path.write_text(json.dumps([*rows, {"image_path": "scene.png"}]))  # no captions, no box
    data = load_aro(str(tmp_path))
    assert data.skip_counts[("vg_relation", "malformed_record")] == 1
    assert data.read()["vg_relation"] == len(rows) + 1
    assert data.scored()["vg_relation"] == len(rows)


@pytest.mark.parametrize(("config", "message"), [
    (b"ANNO_PATH: [unclosed\n", "not a YAML corpus config"),
    (b"\xff\xfe bad bytes", "not a YAML corpus config|not in the published format"),
    (b'ANNO_PATH: "../../secret.json"\nIMG_ROOT: "vg"\n', "inside it"),
    (b'ANNO_PATH: "data/Attribute/vg/color.json"\nIMG_ROOT: "/etc"\n', "inside it"),
])
def test_a_bad_vl_checklist_corpus_config_is_one_line(tmp_path, config, message):
    import shutil

    root = tmp_path / "vl_checklist"
    shutil.copytree(FIXTURES / "vl_checklist", root)
    (root / "corpus" / "v1" / "Attribute" / "color" / "vg.yaml").write_bytes(config)
    with pytest.raises(DataError, match=message):
        BENCHMARKS["vl_checklist"](str(tmp_path))


def test_classnames_that_are_not_text_are_one_line(tmp_path):
    from csclip.eval.zeroshot import load_image_folder

    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.jpg").write_bytes(b"jpeg")
    (tmp_path / "classnames.txt").write_bytes(b"cat\n\xff\xfedog\n")
    with pytest.raises(DataError, match="classnames.txt: not UTF-8 text"):
        load_image_folder(str(tmp_path))

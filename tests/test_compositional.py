"""Compositional suites: mirrored world pairs checked by the scene oracle, Winoground
scores with known answers, replace items, SugarCrepe on its real texts, and the suites in
evaluate_bundle / compare_models."""

from __future__ import annotations

import csv
import io
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from suites_helpers import CaptionLengthScorer

from csclip.config.eval import SuitesConfig
from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.halftruth import BenchmarkConfig
from csclip.eval.pipeline import compare_models, evaluate_bundle
from csclip.eval.suites import evaluate_suites
from csclip.eval.suites.core import IncompleteBenchmark
from csclip.eval.suites.registry import BENCHMARKS
from csclip.eval.suites.rules import strict_accuracy, winoground_metrics
from csclip.eval.suites.sugarcrepe import (
    SUGARCREPE_SUBSETS,
    evaluate_sugarcrepe,
    load_sugarcrepe_files,
)
from csclip.eval.suites.world import evaluate_world_suites
from csclip.units import UnitsRecord
from csclip.world import iter_world, scene_from_record
from csclip.world.generate import world_record
from csclip.world.pairs import (
    build_mirrored_pairs,
    build_replace_items,
    mirror_scene,
    mirrored_pair,
)
from csclip.world.render import render_png

FAST = BenchmarkConfig(num_bootstrap=20)


@pytest.fixture(scope="module")
def world_val() -> list[UnitsRecord]:
    return list(iter_world(WorldConfig(num_train=0, num_val=24, num_test=0), splits=("val",)))


@pytest.fixture(scope="module")
def tiny_bundle():
    from csclip.model import create_bundle

    return create_bundle("csclip-tiny")


# --- world pairs ------------------------------------------------------------------------


def test_each_caption_is_true_of_its_image_only(world_val):
    pairs = build_mirrored_pairs(world_val, seed=0, max_pairs=100)
    assert len(pairs) == len(world_val)  # every scene has two objects in distinct cells
    for pair in pairs:
        assert pair.scene_a.holds(pair.caption_a), pair.caption_a
        assert not pair.scene_b.holds(pair.caption_a), pair.caption_a
        assert pair.scene_b.holds(pair.caption_b), pair.caption_b
        assert not pair.scene_a.holds(pair.caption_b), pair.caption_b
        assert pair.image_a != pair.image_b
        # Image A is the record's own rendering, so its features can be reused.
        assert pair.image_a == next(r for r in world_val if r.image_id == pair.image_id).image_bytes
        assert sorted(pair.caption_a.split()) == sorted(pair.caption_b.split())


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), grid_size=st.integers(2, 4), index=st.integers(0, 50))
def test_mirrored_captions_hold_of_their_own_image_only(seed, grid_size, index):
    config = WorldConfig(seed=seed, grid_size=grid_size, max_objects=min(4, grid_size**2))
    pair = mirrored_pair(world_record(config, "val", index), random.Random(seed))
    assert pair is not None
    assert pair.scene_a.holds(pair.caption_a) and not pair.scene_a.holds(pair.caption_b)
    assert pair.scene_b.holds(pair.caption_b) and not pair.scene_b.holds(pair.caption_a)


def test_mirror_twice_is_the_identity_and_mirrored_images_are_flips(world_val):
    scene = scene_from_record(world_val[0])
    for axis in ("x", "y"):
        assert mirror_scene(mirror_scene(scene, axis), axis) == scene
    # Shapes are symmetric left-right, so the x-mirror renders as the pixel flip.
    flipped = Image.open(io.BytesIO(render_png(scene))).transpose(Image.FLIP_LEFT_RIGHT)
    mirrored = Image.open(io.BytesIO(render_png(mirror_scene(scene, "x"))))
    difference = np.abs(np.asarray(flipped, dtype=int) - np.asarray(mirrored, dtype=int))
    assert (difference.max(axis=-1) > 0).mean() < 0.02  # a pixel of rounding at edges


def test_pairs_are_seeded_and_capped(world_val):
    first = build_mirrored_pairs(world_val, seed=3, max_pairs=5)
    assert first == build_mirrored_pairs(world_val, seed=3, max_pairs=5)
    assert len(first) == 5


def test_replace_foil_is_false_and_caption_entity_true(world_val):
    items = build_replace_items(world_val, seed=0, max_items=100)
    assert len(items) >= len(world_val) // 2
    scenes = {r.image_id: scene_from_record(r) for r in world_val}
    by_id = {r.image_id: r for r in world_val}
    for item in items:
        record = by_id[item.image_id]
        assert item.caption == record.caption and item.foil_caption != item.caption
        # The edited span: the unit's text in the caption became one of its foils.
        units = [u for u in record.entities if u.text in item.caption]
        changed = [
            f.text
            for u in units
            for f in u.foils
            if item.caption.replace(u.text, f.text, 1) == item.foil_caption
        ]
        assert changed, item
        assert not scenes[item.image_id].holds(changed[0])
        assert item.change_type in ("attribute_change", "object_change")


# --- scores -----------------------------------------------------------------------------


def test_winoground_known_answer():
    # Pair 1: all correct. Pair 2: texts right, images wrong (caption A prefers image B).
    # Pair 3: a tie between image A's two captions fails the text score.
    a_a = np.array([0.9, 0.6, 0.5])
    a_b = np.array([0.1, 0.2, 0.5])
    b_a = np.array([0.2, 0.7, 0.1])
    b_b = np.array([0.8, 0.9, 0.9])
    metrics = winoground_metrics(a_a, a_b, b_a, b_b)
    assert metrics["comp_i2t"] == pytest.approx(200 / 3)
    assert metrics["comp_t2i"] == pytest.approx(200 / 3)  # pair 3: 0.5 > 0.1 and 0.9 > 0.5
    assert metrics["comp_group"] == pytest.approx(100 / 3)
    assert metrics["comp_num_pairs"] == 3


def test_no_pairs_reports_no_scores():
    empty = np.zeros(0)
    assert winoground_metrics(empty, empty, empty, empty) == {"comp_num_pairs": 0.0}


def test_strict_accuracy_counts_ties_as_wrong():
    assert strict_accuracy(np.array([1.0, 0.5, 0.2]), np.array([0.0, 0.5, 0.3])) == pytest.approx(
        100 / 3
    )


def test_world_suites_with_caption_length_scorer(world_val):
    # The length scorer gives every image the same scores: swapped captions have the same
    # length (ties), so every text and image comparison fails.
    metrics = evaluate_world_suites(Encoder(CaptionLengthScorer()), world_val)
    assert metrics["comp_i2t"] == metrics["comp_t2i"] == metrics["comp_group"] == 0.0
    items = build_replace_items(world_val, seed=0, max_items=200)
    expected = 100 * np.mean([len(i.caption) > len(i.foil_caption) for i in items])
    assert metrics["comp_i2t_replace"] == pytest.approx(expected)
    assert metrics["comp_num_replace_items"] == len(items)


def test_suites_skip_what_cannot_be_measured():
    records = [UnitsRecord(sample_id="s", image_id="i", caption="a dog", split="val")]
    # No image and no scene: no retrieval, no world suite, no key at all.
    assert evaluate_suites(Encoder(CaptionLengthScorer()), records) == {}


def test_sugarcrepe_config_needs_images():
    with pytest.raises(ValueError, match="coco_images"):
        SuitesConfig(sugarcrepe_dir="x")


# --- SugarCrepe on its real texts ---------------------------------------------------------


def write_coco_images(root, items) -> None:
    root.mkdir(exist_ok=True)
    for item in items:
        Image.new("RGB", (32, 32), (random.randrange(256), 0, 0)).save(root / item["filename"])


def read_subsets(directory) -> dict[str, list[dict]]:
    """The SugarCrepe files as the test reads them itself (index order)."""
    out = {}
    for path in sorted(directory.glob("*.json")):
        rows = json.loads(path.read_text())
        out[path.stem] = [rows[k] for k in sorted(rows, key=int)]
    return out


def small_sugarcrepe(sugarcrepe_dir, tmp_path, per_subset: int = 4):
    """The first `per_subset` real items of every subset, as SugarCrepe files."""
    subsets = {s: items[:per_subset] for s, items in read_subsets(sugarcrepe_dir).items()}
    out = tmp_path / "sugarcrepe"
    out.mkdir()
    for subset, items in subsets.items():
        (out / f"{subset}.json").write_text(json.dumps({str(k): i for k, i in enumerate(items)}))
    return out, subsets


def test_sugarcrepe_reads_every_real_record(sugarcrepe_dir, tmp_path):
    subsets = read_subsets(sugarcrepe_dir)
    assert set(subsets) == set(SUGARCREPE_SUBSETS)
    write_coco_images(tmp_path / "val2017", [i for items in subsets.values() for i in items])
    data = load_sugarcrepe_files(str(sugarcrepe_dir), str(tmp_path / "val2017"))
    assert data.read() == data.scored() == {s: len(items) for s, items in subsets.items()}


def test_sugarcrepe_caption_length_known_answer(sugarcrepe_dir, tmp_path):
    directory, subsets = small_sugarcrepe(sugarcrepe_dir, tmp_path)
    write_coco_images(tmp_path / "val2017", [i for items in subsets.values() for i in items])
    metrics = evaluate_sugarcrepe(
        Encoder(CaptionLengthScorer(prefer_short=True)), directory, str(tmp_path / "val2017")
    )
    for subset, items in subsets.items():
        expected = 100 * np.mean([len(i["caption"]) < len(i["negative_caption"]) for i in items])
        assert metrics[f"sugarcrepe_{subset}_i2t"] == pytest.approx(expected), subset
        assert metrics[f"sugarcrepe_{subset}_skipped"] == 0
        assert metrics[f"sugarcrepe_{subset}_read"] == len(items)
    # Additions make the negative longer: a shorter-preferring scorer gets them all right.
    assert metrics["sugarcrepe_add_att_i2t"] == metrics["sugarcrepe_add_obj_i2t"] == 100.0
    per_subset = [metrics[f"sugarcrepe_{s}_i2t"] for s in subsets]
    assert metrics["sugarcrepe_i2t"] == pytest.approx(np.mean(per_subset))


def test_sugarcrepe_dir_and_registry_suite_are_one_implementation(sugarcrepe_dir, tmp_path):
    directory, subsets = small_sugarcrepe(sugarcrepe_dir, tmp_path)
    write_coco_images(directory / "val2017", [i for items in subsets.values() for i in items])
    encoder = Encoder(CaptionLengthScorer(prefer_short=True))
    from_dir = evaluate_sugarcrepe(encoder, directory, str(directory / "val2017"))
    from csclip.eval.suites.core import evaluate_suite_data

    from_registry, _ = evaluate_suite_data(encoder, BENCHMARKS["sugarcrepe"](str(tmp_path)))
    assert from_dir == from_registry


def test_sugarcrepe_missing_image_fails_in_one_line_or_is_a_counted_skip(sugarcrepe_dir, tmp_path):
    directory, subsets = small_sugarcrepe(sugarcrepe_dir, tmp_path, per_subset=2)
    missing = subsets["add_att"][0]["filename"]
    present = [i for items in subsets.values() for i in items if i["filename"] != missing]
    write_coco_images(tmp_path / "val2017", present)
    lost = sum(i["filename"] == missing for items in subsets.values() for i in items)
    with pytest.raises(IncompleteBenchmark) as error:
        evaluate_sugarcrepe(Encoder(CaptionLengthScorer()), directory, str(tmp_path / "val2017"))
    message = str(error.value)
    assert "\n" not in message and missing in message and "--allow-partial" in message
    metrics = evaluate_sugarcrepe(Encoder(CaptionLengthScorer()), directory,
                                  str(tmp_path / "val2017"), allow_partial=True)
    assert sum(v for k, v in metrics.items() if k.endswith("_skipped_missing_image")) == lost
    assert metrics["sugarcrepe_add_att_read"] == 2
    assert metrics["sugarcrepe_add_att_num"] + metrics["sugarcrepe_add_att_skipped"] == 2


def test_sugarcrepe_missing_root_names_it(sugarcrepe_dir, tmp_path):
    with pytest.raises(DataError, match="nowhere"):
        evaluate_sugarcrepe(Encoder(CaptionLengthScorer()), sugarcrepe_dir, str(tmp_path / "nowhere"))


def test_sugarcrepe_no_files_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="no SugarCrepe subset files"):
        load_sugarcrepe_files(str(tmp_path), str(tmp_path))


# --- integration --------------------------------------------------------------------------


def test_suite_modules_do_not_import_ray():
    import subprocess
    import sys

    code = (
        "import sys, csclip.world.pairs, csclip.eval.retrieval, csclip.eval.suites; "
        "assert 'ray' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_evaluate_bundle_adds_suite_metrics(world_val, tiny_bundle):
    world_val = world_val[:12]
    report = evaluate_bundle(tiny_bundle, world_val, benchmark=FAST)
    for key in ("comp_i2t", "comp_t2i", "comp_group", "comp_i2t_replace", "ret_i2t", "ret_t2i"):
        assert 0.0 <= report.metrics[key] <= 100.0, key
    assert report.metrics["ret_num_images"] == len(world_val)
    assert report.metrics["comp_num_pairs"] == len(world_val)
    assert "ht_all" in report.metrics
    off = SuitesConfig(retrieval=False, num_world_pairs=0)
    plain = evaluate_bundle(tiny_bundle, world_val, benchmark=FAST, suites=off)
    assert not any(k.startswith(("comp_", "ret_")) for k in plain.metrics)
    assert plain.metrics["ht_all"] == report.metrics["ht_all"]


def test_compare_models_writes_the_suites_table(world_val, tiny_bundle, tmp_path):
    result = compare_models(
        {"tiny": tiny_bundle},
        world_val[:12],
        tmp_path,
        benchmark=FAST,
        suites=SuitesConfig(num_world_pairs=8),
    )
    assert "Retrieval and compositional suites" in result.markdown
    with open(result.files["suites.csv"]) as handle:
        rows = list(csv.DictReader(handle))
    metrics = result.reports["tiny"].metrics
    assert float(rows[0]["comp_group"]) == pytest.approx(metrics["comp_group"])
    assert float(rows[0]["ret_t2i_r10"]) == pytest.approx(metrics["ret_t2i_r10"])
    assert rows[0]["sugarcrepe_i2t"] == ""  # not measured: empty, never 0


def _pipeline():
    import importlib.util

    from tests.conftest import REPO_ROOT

    spec = importlib.util.spec_from_file_location(
        "evaluate_pipeline", REPO_ROOT / "pipelines" / "evaluate.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pipeline_runs_sugarcrepe_and_names_a_missing_image_folder(
    sugarcrepe_dir, tmp_path, capsys
):
    directory, subsets = small_sugarcrepe(sugarcrepe_dir, tmp_path, per_subset=2)
    write_coco_images(tmp_path / "val2017", [i for items in subsets.values() for i in items])
    common = [
        "--model", "csclip-tiny", "--out", str(tmp_path / "eval"), "--sugarcrepe", str(directory),
        "--set", "tracking.enabled=false", "--set", "benchmark.num_bootstrap=10",
        "--set", "data.world.num_val=12", "--set", "suites.num_world_pairs=4",
    ]  # fmt: skip
    main = _pipeline().main
    assert main([*common, "--coco-images", str(tmp_path / "val2017")]) == 0
    assert "Retrieval and compositional suites" in capsys.readouterr().out
    with open(tmp_path / "eval" / "suites.csv") as handle:
        row = list(csv.DictReader(handle))[0]
    assert 0.0 <= float(row["sugarcrepe_i2t"]) <= 100.0
    assert 0.0 <= float(row["comp_group"]) <= 100.0
    assert main([*common, "--coco-images", str(tmp_path / "absent")]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "absent" in error and "\n" not in error


def test_sugarcrepe_reads_images_from_s3(sugarcrepe_dir, tmp_path, s3_endpoint, monkeypatch):
    from s3_helpers import fresh_bucket

    directory, subsets = small_sugarcrepe(sugarcrepe_dir, tmp_path, per_subset=2)
    local = tmp_path / "val2017"
    write_coco_images(local, [i for items in subsets.values() for i in items])
    with fresh_bucket(s3_endpoint, monkeypatch, "coco") as client:
        for path in local.iterdir():
            client.put_object(Bucket="coco", Key=f"val2017/{path.name}", Body=path.read_bytes())
        scorer = CaptionLengthScorer(prefer_short=True)
        from_s3 = evaluate_sugarcrepe(Encoder(scorer), directory, "s3://coco/val2017")
        assert from_s3 == evaluate_sugarcrepe(Encoder(scorer), directory, str(local))
        assert from_s3["sugarcrepe_add_obj_i2t"] == 100.0
        with pytest.raises(DataError, match="s3://coco/missing"):
            evaluate_sugarcrepe(Encoder(scorer), directory, "s3://coco/missing")

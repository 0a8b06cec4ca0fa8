"""A `csclip evaluate --out` folder read by CLIP_benchmark's own `clip_benchmark build`
(LAION-AI/CLIP_benchmark@48de38c, the installed package): one row per model and dataset,
their dataset names, metric names and scales (fractions), counts as integers, a
pretrained tag for random weights, and the completion marker out of build's way."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from suites_helpers import FIXTURES

from csclip.entry.evaluate import main
from csclip.eval.report import EVALUATION_COMPLETE, check_evaluation

# csclip-tiny with random weights on the tiny world (4 images); besides the half-truth
# benchmark and retrieval over its records, three suites CLIP_benchmark knows: SugarCrepe
# (two subsets), a zero-shot folder and COCO retrieval (Karpathy test split).
ARGS = ["--model", "csclip-tiny", "--set", "model.image_size=32",
        "--set", "data.world.num_val=4", "--set", "data.world.image_size=32",
        "--set", "benchmark.num_bootstrap=0", "--set", "benchmark.image_side=false",
        "--set", "suites.num_world_pairs=0", "--set", "tracking.enabled=false",
        "--suite", "sugarcrepe,zeroshot,coco_retrieval", "--data-root", str(FIXTURES),
        "--allow-partial"]
RETRIEVAL = {f"{kind}_retrieval_recall@{k}" for kind in ("image", "text") for k in (1, 5, 10)}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the evaluation folder, the rows of CLIP_benchmark's build over it by dataset)."""
    root = tmp_path_factory.mktemp("build")
    out, table = root / "eval", root / "benchmark.csv"
    assert main([*ARGS, "--out", str(out)]) == 0
    done = subprocess.run([sys.executable, "-m", "clip_benchmark.cli", "build", str(out),
                           "--output", str(table)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    with table.open() as handle:
        rows = list(csv.DictReader(handle))
    by_dataset = {row["dataset"]: row for row in rows}
    assert len(by_dataset) == len(rows)  # one row per (model, dataset): one model here
    return out, by_dataset


def test_build_reads_every_result_with_a_pretrained_tag(built):
    out, rows = built
    assert {"sugar_crepe/add_obj", "sugar_crepe/swap_att", "colors", "mscoco_captions",
            "retrieval", "halftruth", "world_zeroshot/shape"} <= set(rows)
    for row in rows.values():
        assert (row["model"], row["pretrained"]) == ("csclip-tiny", "random")
        assert row["model_fullname"] == "csclip-tiny random"
        assert row["language"] == "en"
    # The marker is written last and lists every result; build does not read it.
    check_evaluation(out)
    listed = json.loads((out / EVALUATION_COMPLETE).read_text())["files"]
    results = sorted(p.name for p in out.glob("*.json"))
    assert len(results) == len(rows) and set(results) <= set(listed)
    assert "sugar_crepe_add_obj_random_csclip-tiny_image_caption_selection.json" in results


def _csv(path):
    with path.open() as handle:
        return list(csv.DictReader(handle))


def test_sugarcrepe_rows_carry_clip_benchmarks_names_and_fractions(built):
    out, rows = built
    # Our benchmarks table (percent) is the reference: theirs is the same number / 100.
    ours = {r["subset"]: r for r in _csv(out / "benchmarks.csv") if r["benchmark"] == "sugarcrepe"}
    for subset, scored in (("add_obj", 1), ("swap_att", 2)):
        row = rows[f"sugar_crepe/{subset}"]
        assert row["task"] == "image_caption_selection"
        assert row["num_scored"] == str(scored)  # an integer, not 1.0
        # One image per pair: CLIP_benchmark's acc (all right) is its text_acc.
        assert float(row["text_acc"]) == float(row["acc"]) == pytest.approx(
            float(ours[subset]["i2t"]) / 100, abs=1e-12)
    assert rows["sugar_crepe/add_obj"]["num_skipped_missing_image"] == "1"
    with (built[0] / "sugar_crepe_add_obj_random_csclip-tiny_image_caption_selection.json"
          ).open() as handle:
        result = json.load(handle)
    assert set(result) == {"dataset", "model", "pretrained", "task", "metrics", "language"}
    assert isinstance(result["metrics"]["num_scored"], int)
    assert "add_att_i2t" not in result["metrics"] and "i2t" not in result["metrics"]


def test_zeroshot_and_retrieval_rows_as_clip_benchmark_names_them(built):
    out, rows = built
    suites = _csv(out / "suites.csv")[0]  # ours, in percent
    colors = rows["colors"]
    assert colors["task"] == "zeroshot_classification"
    assert colors["num_images"] == "4"
    assert float(colors["acc1"]) == pytest.approx(float(suites["zs_avg"]) / 100, abs=1e-12)
    assert 0.0 <= float(colors["mean_per_class_recall"]) <= 1.0
    for dataset in ("mscoco_captions", "retrieval"):
        row = rows[dataset]
        assert row["task"] == "zeroshot_retrieval"
        values = {key: float(row[key]) for key in RETRIEVAL}
        assert all(0.0 <= v <= 1.0 for v in values.values())
        assert row["num_images"].isdigit() and row["counting"] == "clip_benchmark"
    coco = rows["mscoco_captions"]  # I2T: an image finds its caption (text retrieval)
    assert float(coco["text_retrieval_recall@1"]) == pytest.approx(
        float(suites["coco_ret_i2t"]) / 100, abs=1e-12)
    assert float(coco["image_retrieval_recall@1"]) == pytest.approx(
        float(suites["coco_ret_t2i"]) / 100, abs=1e-12)
    # Our half-truth benchmark keeps its own metrics, its counts as integers.
    halftruth = rows["halftruth"]
    assert halftruth["task"] == "half_truth" and halftruth["num_items_all"].isdigit()

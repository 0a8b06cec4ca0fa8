"""COCO retrieval counted as CLIP_benchmark counts it, exact ties included: its images in
CocoCaptions' order (ascending COCO id), checked against CLIP_benchmark's own output on a
tie probe (tests/fixtures/official_outputs/README.md)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from csclip.eval.encoder import FeatureTables
from csclip.eval.retrieval import evaluate_karpathy, load_karpathy

PROBE = json.loads((Path(__file__).parent / "fixtures" / "official_outputs"
                    / "clip_benchmark_coco_ties.json").read_text())


class ProbeEncoder:
    """The probe's features for every text and image (an Encoder's `features`)."""

    def features(self, texts, images) -> FeatureTables:
        by_file = {i["filename"]: i["feature"] for i in PROBE["input"]["images"]}
        image_ids = list(images)
        image_rows = [by_file[Path(str(images[i])).name] for i in image_ids]
        text_rows = [PROBE["input"]["text_features"][t] for t in texts]
        return FeatureTables({t: k for k, t in enumerate(texts)}, np.array(text_rows, np.float32),
                             {i: k for k, i in enumerate(image_ids)}, np.array(image_rows, np.float32))


def _karpathy(tmp_path: Path) -> str:
    (tmp_path / "val2014").mkdir()
    images = []
    for image in PROBE["input"]["images"]:
        (tmp_path / "val2014" / image["filename"]).write_bytes(b"probe")
        images.append({"filepath": "val2014", "filename": image["filename"], "split": "test",
                       "cocoid": image["cocoid"], "imgid": len(images),
                       "sentences": image["sentences"]})
    (tmp_path / "dataset_coco.json").write_text(json.dumps({"images": images}))
    return str(tmp_path / "dataset_coco.json")


def test_coco_images_in_clip_benchmark_order(tmp_path):
    karpathy = load_karpathy(_karpathy(tmp_path), str(tmp_path), by_coco_id=True)
    assert [int(i) for i in karpathy.rset.image_ids] == PROBE["coco_id_order"]


def test_coco_ties_fall_as_clip_benchmark_counts_them(tmp_path):
    metrics = evaluate_karpathy(ProbeEncoder(), "coco", _karpathy(tmp_path), str(tmp_path),
                                counting="clip_benchmark")
    theirs = PROBE["metrics"]
    # Their recall is a float32 mean; ours a float64 percentage of the same hits.
    assert metrics["coco_ret_t2i"] == pytest.approx(100 * theirs["image_retrieval_recall@1"], abs=1e-4)
    assert metrics["coco_ret_i2t"] == pytest.approx(100 * theirs["text_retrieval_recall@1"], abs=1e-4)


def test_clip_benchmark_counting_is_the_default(tmp_path):
    metrics = evaluate_karpathy(ProbeEncoder(), "coco", _karpathy(tmp_path), str(tmp_path))
    assert metrics["coco_ret_counting_clip_benchmark"] == 1.0

"""COCO / Flickr30k Karpathy-test retrieval from local copies: the loader on a tiny
Karpathy fixture, its known recall, and the named suites with a missing folder."""

from __future__ import annotations

import json

import pytest
from suites_helpers import FIXTURES, ColorScorer

from csclip.config.eval import SuitesConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.retrieval import evaluate_karpathy, load_karpathy
from csclip.eval.suites import evaluate_named_suites

COCO = FIXTURES / "coco"


def test_loader_keeps_the_test_split_and_counts_missing_images():
    karpathy = load_karpathy(str(COCO / "dataset_coco.json"), str(COCO))
    assert karpathy.rset.image_ids == ("0", "1", "2")  # the train image is left out
    assert len(karpathy.rset.texts) == 4 and karpathy.num_skipped_captions == 1
    assert karpathy.images["0"].endswith("val2014/COCO_val2014_000000000000.jpg")


def test_known_recall_both_ways():
    metrics = evaluate_karpathy(Encoder(ColorScorer()), "coco", str(COCO / "dataset_coco.json"),
                                str(COCO))
    # Each image's captions are the only texts with its colour: R@1 100 both ways.
    assert metrics["coco_ret_i2t"] == metrics["coco_ret_t2i"] == 100.0
    assert metrics["coco_ret_num_images"] == 3 and metrics["coco_ret_num_queries_t2i"] == 4
    assert metrics["coco_ret_skipped_captions"] == 1


def test_flickr_tie_is_a_miss():
    metrics = evaluate_karpathy(Encoder(ColorScorer()), "flickr30k",
                                str(FIXTURES / "flickr30k" / "dataset_flickr30k.json"),
                                str(FIXTURES / "flickr30k" / "flickr30k-images"), counting="strict")
    # "a dog" (the blue image's caption) scores 0 with both images: as a query its image
    # ties the other (a miss), and for the blue image it ties "a yellow taxi" (a miss).
    assert metrics["flickr30k_ret_t2i"] == 50.0 and metrics["flickr30k_ret_i2t"] == 50.0


def test_named_suites_skip_what_is_missing(tmp_path, caplog):
    caplog.set_level("WARNING")
    config = SuitesConfig(names=("coco_retrieval", "flickr30k_retrieval", "zeroshot"),
                          data_root=str(FIXTURES))
    metrics = evaluate_named_suites(Encoder(ColorScorer()), config)
    assert {"coco_ret_i2t", "flickr30k_ret_i2t", "zs_avg"} <= set(metrics)
    empty = SuitesConfig(names=("coco_retrieval", "zeroshot"), data_root=str(tmp_path))
    assert evaluate_named_suites(Encoder(ColorScorer()), empty) == {}
    assert sum("; skipped" in r.getMessage() for r in caplog.records) == 2


def test_no_test_images_is_a_data_error(tmp_path):
    (tmp_path / "d.json").write_text('{"images": [{"filename": "x.jpg", "imgid": 1, '
                                     '"split": "test", "sentences": [{"raw": "a", "sentid": 1}]}]}')
    with pytest.raises(DataError, match="no 'test' captions"):
        load_karpathy(str(tmp_path / "d.json"), str(tmp_path))


def test_config_rejects_unknown_suites_and_missing_root():
    with pytest.raises(ValueError, match="unknown suites"):
        SuitesConfig(names=("aro", "imagenet"), data_root="x")
    with pytest.raises(ValueError, match="needs suites.data_root"):
        SuitesConfig(names=("aro",))


@pytest.mark.parametrize("entry", [{"filepath": "..", "filename": "secret.jpg"},
                                   {"filepath": "val2014", "filename": "../../secret.jpg"},
                                   {"filename": "SECRET"}])
def test_an_image_outside_the_root_is_refused_naming_the_file_and_entry(tmp_path, entry):
    """Karpathy files name images relative to their root (filepath/filename): an absolute
    path or a ".." escape is refused, not read and scored (benchmark_file's rule)."""
    root = tmp_path / "coco"
    secret = tmp_path / "secret.jpg"
    secret.write_bytes((COCO / "val2014" / "COCO_val2014_000000000000.jpg").read_bytes())
    (root / "val2014").mkdir(parents=True)
    entry = {k: (str(secret) if v == "SECRET" else v) for k, v in entry.items()}
    path = root / "dataset_coco.json"
    path.write_text(json.dumps({"images": [{**entry, "cocoid": 7, "split": "test",
                                            "sentences": [{"raw": "a", "sentid": 1}]}]}))
    with pytest.raises(DataError) as err:
        load_karpathy(str(path), str(root))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: image '7' at "), message
    assert "outside" in message and str(root) in message

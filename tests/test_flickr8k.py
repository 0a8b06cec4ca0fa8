"""Flickr8k retrieval (suite flickr8k_retrieval) in CLIP_benchmark's and Karpathy's
layouts, its recall beside COCO's in one encoder (features never shared across the two
by image id), and the paper's Retr columns (ret_paper_*: the mean of COCO and Flickr8k)."""

from __future__ import annotations

import pytest
from paper_fixtures import FLICKR8K, write_coco, write_flickr8k
from suites_helpers import ColorScorer

from csclip.config.eval import SuitesConfig
from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.retrieval import evaluate_karpathy, load_clip_benchmark_captions
from csclip.eval.suites import evaluate_named_suites, find_named_suites


def test_clip_benchmark_caption_file_is_read_as_theirs(tmp_path):
    folder = write_flickr8k(tmp_path)
    loaded = load_clip_benchmark_captions(str(folder / "flickr8k_test_karpathy.txt"),
                                          str(folder / "Images"))
    # The header is skipped; a comma inside a caption stays in it (split at ".jpg,").
    assert loaded.rset.image_ids == tuple(name for name, _, _ in FLICKR8K)
    assert len(loaded.rset.instances) == 5 and "a dog, green" in loaded.rset.texts
    assert loaded.images[FLICKR8K[0][0]] == str(folder / "Images" / FLICKR8K[0][0])
    bad = tmp_path / "bad.txt"
    bad.write_text("image,caption\nno image here\n")
    with pytest.raises(DataError, match="line 2: no '<image>.jpg,<caption>'"):
        load_clip_benchmark_captions(str(bad), str(folder / "Images"))


@pytest.mark.parametrize("layout", ["clip_benchmark", "karpathy"])
def test_both_layouts_give_the_same_known_recall(layout, tmp_path):
    write_flickr8k(tmp_path, layout)
    found = find_named_suites(SuitesConfig(names=("flickr8k_retrieval",),
                                           data_root=str(tmp_path)))
    captions, images = found.retrieval["flickr8k_retrieval"]
    assert captions.endswith("flickr8k_test_karpathy.txt" if layout == "clip_benchmark"
                             else "dataset_flickr8k.json")
    metrics = evaluate_karpathy(Encoder(ColorScorer()), "flickr8k", captions, images,
                                counting="clip_benchmark")
    # Each image's captions are the only texts with its colour (the train image is out).
    assert metrics["flickr8k_ret_i2t"] == metrics["flickr8k_ret_t2i"] == 100.0
    assert metrics["flickr8k_ret_num_images"] == 3
    assert metrics["flickr8k_ret_num_queries_t2i"] == 5


def test_coco_and_flickr8k_in_one_encoder_give_ret_paper(tmp_path):
    write_coco(tmp_path)
    write_flickr8k(tmp_path, "karpathy")  # image ids 0, 1, 2: COCO's cocoids too
    scorer = ColorScorer()
    config = SuitesConfig(names=("coco_retrieval", "flickr8k_retrieval"),
                          data_root=str(tmp_path), retrieval_counting="clip_benchmark")
    metrics = evaluate_named_suites(Encoder(scorer), config)
    # Each id is another colour in the two (paper_fixtures.FLICKR8K): features looked up by
    # id across the two would retrieve the wrong captions.
    assert scorer.encoded_images == 6  # three each, none taken from the other's ids
    assert metrics["coco_ret_i2t"] == metrics["flickr8k_ret_i2t"] == 100.0
    assert metrics["ret_paper_i2t"] == 100.0 and metrics["ret_paper_t2i"] == 100.0
    only_coco = evaluate_named_suites(Encoder(ColorScorer()), SuitesConfig(
        names=("coco_retrieval",), data_root=str(tmp_path)))
    assert "ret_paper_i2t" not in only_coco  # the paper's Retr needs both


def test_ret_paper_is_the_mean_of_coco_and_flickr8k():
    from csclip.eval.suites import paper_retrieval

    # The authors' CS-CLIP row: I2T (61.9 + 81.5) / 2, T2I (46.3 + 67.3) / 2.
    out = paper_retrieval({"coco_ret_i2t": 61.9, "flickr8k_ret_i2t": 81.5,
                           "coco_ret_t2i": 46.3, "flickr8k_ret_t2i": 67.3})
    assert out == pytest.approx({"ret_paper_i2t": 71.7, "ret_paper_t2i": 56.8})
    assert paper_retrieval({"coco_ret_i2t": 61.9, "coco_ret_t2i": 46.3}) == {}


def test_missing_flickr8k_names_both_layouts(tmp_path):
    found = find_named_suites(SuitesConfig(names=("flickr8k_retrieval",),
                                           data_root=str(tmp_path)))
    line = found.missing["flickr8k_retrieval"]
    assert line.startswith(f"flickr8k_retrieval: not found under {tmp_path}/flickr8k (expects ")
    assert "flickr8k_test_karpathy.txt" in line and "dataset_flickr8k.json" in line


@pytest.mark.parametrize("named", ["../secret.jpg", "ABSOLUTE"])
def test_a_caption_line_naming_an_image_outside_the_root_is_refused(tmp_path, named):
    """An absolute path or a ".." escape in the caption file is refused in one line naming
    the file and the line, not read and scored (benchmark_file's rule)."""
    folder = write_flickr8k(tmp_path)
    secret = folder / "secret.jpg"  # beside Images/, outside it
    secret.write_bytes((folder / "Images" / FLICKR8K[0][0]).read_bytes())
    named = str(secret) if named == "ABSOLUTE" else named
    captions = folder / "flickr8k_test_karpathy.txt"
    captions.write_text(captions.read_text() + f"{named},a red square\n")
    with pytest.raises(DataError) as err:
        load_clip_benchmark_captions(str(captions), str(folder / "Images"))
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{captions} line 7: image "), message
    assert repr(named) in message and "outside" in message

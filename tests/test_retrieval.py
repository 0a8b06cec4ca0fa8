"""Retrieval Recall@k: known answers on hand-made features, the any-caption rule, strict
ties, feature reuse, and a real model on world records."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.encoder import BundleScorer, Encoder, FeatureTables, encode_features, image_sources
from csclip.eval.retrieval import (
    RetrievalSet,
    evaluate_retrieval,
    image_to_text_ranks,
    recall_metrics,
    retrieval_metrics,
    retrieval_set,
    text_to_image_ranks,
)
from csclip.units import UnitsRecord
from csclip.world import iter_world


@pytest.fixture(scope="module")
def world_val_small() -> list[UnitsRecord]:
    return list(iter_world(WorldConfig(num_train=0, num_val=24, num_test=0), splits=("val",)))


@pytest.fixture(scope="module")
def tiny_bundle():
    from csclip.model import create_bundle

    return create_bundle("csclip-tiny")


def unit_rows(*angles: float) -> np.ndarray:
    """Unit vectors in 2-D at the given angles (degrees): cosines are easy to order."""
    radians = np.deg2rad(angles)
    return np.stack([np.cos(radians), np.sin(radians)], axis=1)


def test_image_to_text_known_ranks():
    images = unit_rows(0, 90)
    # Text angles 0, 10, 80, 95: image 0 (0°) orders them 0, 10, 80, 95; image 1 (90°)
    # orders them 95 (5° away), 80, 10, 0.
    texts = unit_rows(0, 10, 80, 95)
    ranks = image_to_text_ranks(images, texts, [[1], [0]])
    assert ranks.tolist() == [2, 4]
    metrics = recall_metrics(ranks, np.array([1, 1]), ks=(1, 2, 4))
    assert metrics["ret_i2t"] == 0.0
    assert metrics["ret_i2t_r2"] == 50.0
    assert metrics["ret_i2t_r4"] == 100.0


def test_any_caption_in_top_k_is_a_hit():
    images = unit_rows(0, 90)
    texts = unit_rows(0, 10, 80, 95)
    # Image 1 has two captions: 10° (3rd for it) and 95° (1st): its best caption counts.
    ranks = image_to_text_ranks(images, texts, [[0], [1, 3]])
    assert ranks.tolist() == [1, 1]
    # Image 0's true captions 0° and 10° are its top two: the second one never pushes the
    # first down, and a wrong text is counted only above the best true one.
    assert image_to_text_ranks(images, texts, [[0, 1], [3]]).tolist() == [1, 1]


def test_text_to_image_known_ranks():
    images = unit_rows(0, 40, 90)
    texts = unit_rows(35, 100)
    # Text 35° is closest to image 40°, then 0°, then 90°; text 100° to 90°, 40°, 0°.
    ranks = text_to_image_ranks(images, texts, [[0], [1]])
    assert ranks.tolist() == [2, 2]
    metrics = recall_metrics(np.array([1]), ranks, ks=(1, 5))
    assert metrics["ret_t2i"] == 0.0 and metrics["ret_t2i_r5"] == 100.0


def test_tie_with_a_wrong_item_is_a_miss():
    images = unit_rows(0)
    texts = unit_rows(30, -30)  # same cosine with the image
    assert image_to_text_ranks(images, texts, [[0]]).tolist() == [2]
    # Two identical images: the text's own image ties with the other one.
    assert text_to_image_ranks(unit_rows(10, 10), unit_rows(10), [[0]]).tolist() == [2]


def test_shared_caption_does_not_count_against_its_other_image():
    # One text captions images 0 and 2; each (text, image) query ranks only against the
    # images that text does not caption: image 1 (50°) beats both.
    ranks = text_to_image_ranks(unit_rows(0, 50, 90), unit_rows(45), [[0, 2]])
    assert ranks.tolist() == [2, 2]
    assert text_to_image_ranks(unit_rows(0, 50), unit_rows(45), [[0, 1]]).tolist() == [1, 1]


@settings(max_examples=30, deadline=None)
@given(num_images=st.integers(1, 6), seed=st.integers(0, 99))
def test_recall_is_monotone_and_matches_a_loop(num_images, seed):
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(num_images, 3))
    texts = rng.normal(size=(2 * num_images, 3))
    positives = [[2 * i, 2 * i + 1] for i in range(num_images)]
    ranks = image_to_text_ranks(images, texts, positives)
    for i, true in enumerate(positives):
        scores = texts @ images[i]
        best = max(scores[j] for j in true)
        wrong = [scores[j] for j in range(len(texts)) if j not in true]
        assert ranks[i] == 1 + sum(s >= best for s in wrong)
    metrics = recall_metrics(ranks, ranks, ks=(1, 5, 10))
    assert metrics["ret_i2t"] <= metrics["ret_i2t_r5"] <= metrics["ret_i2t_r10"]


def record(image_id: str, caption: str, image: bytes = b"png") -> UnitsRecord:
    return UnitsRecord(
        sample_id=f"{image_id}-{caption}",
        image_id=image_id,
        caption=caption,
        split="val",
        image_bytes=image,
    )


def test_retrieval_set_keeps_one_row_per_image_and_text():
    rset = retrieval_set([record("a", "x"), record("a", "y"), record("b", "x"), record("b", "x")])
    assert rset == RetrievalSet(("a", "b"), ("x", "y"), ((0, 0), (0, 1), (1, 0)),
                                ((0, 0), (0, 1), (1, 0), (1, 0)))  # instances: repeats kept
    assert rset.positives_of_images() == [[0, 1], [0]]
    assert rset.positives_of_texts() == [[0, 1], [0]]


def test_empty_records_raise():
    with pytest.raises(DataError, match="no records"):
        retrieval_set([])


class TableScorer:
    """Features looked up from fixed tables; counts what it was asked to encode."""

    def __init__(self, texts: dict[str, np.ndarray], images: dict[bytes, np.ndarray]):
        self.texts, self.images = texts, images
        self.encoded_texts: list[str] = []
        self.encoded_images = 0

    def encode_texts(self, texts):
        self.encoded_texts += list(texts)
        return np.array([self.texts[t] for t in texts]).reshape(len(texts), 2)

    def encode_images(self, images):
        self.encoded_images += len(images)
        return np.array([self.images[i] for i in images]).reshape(len(images), 2)


def test_evaluate_retrieval_known_answer_and_reuses_features():
    scorer = TableScorer(
        {"cat": unit_rows(0)[0], "dog": unit_rows(90)[0], "pet": unit_rows(40)[0]},
        {b"A": unit_rows(5)[0], b"B": unit_rows(80)[0]},
    )
    records = [record("a", "cat", b"A"), record("b", "dog", b"B"), record("b", "pet", b"B")]
    encoder = Encoder(scorer)
    encoder.features(["pet"], image_sources(records, ["a", "b"]))
    scorer.encoded_texts, scorer.encoded_images = [], 0
    metrics = evaluate_retrieval(encoder, records, ks=(1, 2))
    assert sorted(scorer.encoded_texts) == ["cat", "dog"] and scorer.encoded_images == 0
    # I2T: a -> cat (rank 1); b -> dog first. T2I: cat -> a; dog -> b; pet (40°) is
    # closer to a (5°) than to its own image b (80°): rank 2.
    assert metrics["ret_i2t"] == 100.0
    assert metrics["ret_t2i"] == pytest.approx(200 / 3)
    assert metrics["ret_t2i_r2"] == 100.0
    assert metrics["ret_num_images"] == 2 and metrics["ret_num_queries_t2i"] == 3


def test_encoder_encodes_nothing_when_all_is_cached():
    scorer = TableScorer({"cat": unit_rows(0)[0]}, {b"A": unit_rows(0)[0]})
    encoder = Encoder(scorer)
    known = encoder.features(["cat"], {"a": b"A"})
    scorer.encoded_texts, scorer.encoded_images = [], 0
    again = encoder.features(["cat"], {"a": b"A"})
    assert again.image_index == known.image_index and again.text_index == known.text_index
    assert again.image_features is known.image_features
    assert scorer.encoded_texts == [] and scorer.encoded_images == 0


def test_real_model_on_world_records(world_val_small, tiny_bundle):
    metrics = evaluate_retrieval(Encoder(BundleScorer(tiny_bundle)), world_val_small)
    assert metrics["ret_num_images"] == len(world_val_small)
    for key in ("ret_i2t", "ret_t2i", "ret_i2t_r5", "ret_t2i_r5", "ret_i2t_r10", "ret_t2i_r10"):
        assert 0.0 <= metrics[key] <= 100.0
    assert metrics["ret_i2t"] <= metrics["ret_i2t_r5"] <= metrics["ret_i2t_r10"]
    # The same numbers from features encoded together up front (reuse path).
    rset = retrieval_set(world_val_small)
    features: FeatureTables = encode_features(
        BundleScorer(tiny_bundle), rset.texts, image_sources(world_val_small, rset.image_ids)
    )
    assert retrieval_metrics(features, rset) == pytest.approx({k: v for k, v in metrics.items()})

"""Batched scoring: unique texts and images once, parity with one-at-a-time and with Ray
Data, the caption-length known answer."""

from __future__ import annotations

import numpy as np
import pytest
from suites_helpers import CaptionLengthScorer

from csclip.config.world import WorldConfig
from csclip.errors import DataError
from csclip.eval.encoder import (
    BundleScorer,
    Encoder,
    encode_features,
    encode_features_with_ray,
    image_sources,
    load_image,
)
from csclip.eval.halftruth import BenchmarkConfig, build_benchmark, prepare_benchmark, score_items
from csclip.eval.pipeline import evaluate_encoder
from csclip.model import create_bundle
from csclip.units import UnitsRecord
from csclip.world import iter_world

NO_CI = BenchmarkConfig(num_bootstrap=0, image_side=False)


def read_images(records: list[UnitsRecord], image_ids: list[str]) -> dict[str, bytes]:
    """Each image's bytes, read as the encoders read them (image_sources, load_image)."""
    return {i: load_image(s) for i, s in image_sources(records, image_ids).items()}


@pytest.fixture(scope="module")
def world_records() -> list[UnitsRecord]:
    return list(iter_world(WorldConfig(num_train=0, num_val=12, num_test=0), splits=("val",)))


@pytest.fixture(scope="module")
def tiny():
    return create_bundle("csclip-tiny")


class CountingScorer(CaptionLengthScorer):
    """Records every text and image it is asked to encode."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []
        self.num_images = 0
        self.image_calls = 0

    def encode_texts(self, texts):
        self.texts.extend(texts)
        return super().encode_texts(texts)

    def encode_images(self, images):
        self.num_images += len(images)
        self.image_calls += 1
        return super().encode_images(images)


def test_each_unique_text_and_image_is_encoded_once(world_records):
    prepared = prepare_benchmark(world_records, NO_CI)
    scorer = CountingScorer()
    encode_features(scorer, prepared.texts, prepared.images)
    assert len(scorer.texts) == len(set(scorer.texts)) == len(set(prepared.texts))
    assert len(prepared.texts) > len(set(prepared.texts))  # anchors repeat across conditions
    assert scorer.num_images == len(world_records)


def test_batched_scores_equal_one_pair_at_a_time(world_records, tiny):
    items = build_benchmark(world_records, seed=0)[:4]
    images = read_images(world_records, [i.image_id for i in items])
    scorer = BundleScorer(tiny, batch_size=7)
    scores = score_items(
        encode_features(
            scorer, [t for i in items for t in (i.anchor, i.completion, i.half_truth)], images
        ),
        items,
    )
    for k, item in enumerate(items):
        image = scorer.encode_images([images[item.image_id]])[0]
        text = scorer.encode_texts([item.half_truth])[0]
        # Batch size changes the float32 summation order inside the encoders: 1e-5, not 1e-6.
        assert float(image @ text) == pytest.approx(scores.half_truth[k], abs=1e-5)
    features = scorer.encode_texts(["red circle", "blue square"])
    assert np.allclose(np.linalg.norm(features, axis=1), 1.0, atol=1e-6)


@pytest.mark.parametrize("prefer_short", [False, True])
def test_caption_length_scorer_gets_the_known_answer(world_records, prefer_short):
    prepared = prepare_benchmark(world_records, NO_CI)  # as compare_models, one scorer
    report = evaluate_encoder("scorer", Encoder(CaptionLengthScorer(prefer_short)), prepared,
                              world_records, NO_CI)
    items = report.items
    # Every A- is "A and ..." or a relation clause: strictly longer than the anchor A.
    assert all(len(i.half_truth) > len(i.anchor) for i in items)
    assert report.metrics["ht_all"] == (100.0 if prefer_short else 0.0)
    assert report.metrics["consistency_all"] == (0.0 if prefer_short else 100.0)
    longer = [
        len(i.completion) < len(i.half_truth)
        if prefer_short
        else len(i.completion) > len(i.half_truth)
        for i in items
    ]
    assert report.metrics["winrate_all"] == pytest.approx(100 * np.mean(longer))
    ties = sum(len(i.completion) == len(i.half_truth) for i in items)
    assert ties > 0  # e.g. Ant "is above" vs "is below": a tie must count as a loss both ways


def test_missing_image_raises_with_the_image_named(world_records):
    bare = UnitsRecord("s1", "img-without-pixels", "a red circle", "val")
    with pytest.raises(DataError, match="img-without-pixels"):
        read_images([bare], ["img-without-pixels"])
    with pytest.raises(DataError, match="not in the units table"):
        read_images(world_records, ["unknown-image"])


def test_images_are_read_in_chunks_from_their_paths(tmp_path, world_records, monkeypatch):
    monkeypatch.setattr("csclip.eval.encoder.IMAGES_PER_READ", 5)
    records = []
    for record in world_records:
        (tmp_path / f"{record.image_id}.png").write_bytes(record.image_bytes)
        records.append(
            UnitsRecord(
                record.sample_id,
                record.image_id,
                record.caption,
                record.split,
                record.entities,
                record.relations,
                image_path=str(tmp_path / f"{record.image_id}.png"),
            )
        )
    ids = [r.image_id for r in records]
    scorer = CountingScorer()
    from_paths = encode_features(scorer, ["red circle"], image_sources(records, ids))
    from_bytes = encode_features(
        CaptionLengthScorer(), ["red circle"], read_images(world_records, ids)
    )
    assert scorer.num_images == len(records) == 12 and scorer.image_calls == 3  # 5 + 5 + 2
    np.testing.assert_array_equal(from_paths.image_features, from_bytes.image_features)


def test_image_path_is_read_from_disk(tmp_path, world_records):
    path = tmp_path / "image.png"
    path.write_bytes(world_records[0].image_bytes)
    record = UnitsRecord("s1", "img-1", "a red circle", "val", image_path=str(path))
    assert read_images([record], ["img-1"]) == {"img-1": world_records[0].image_bytes}
    missing = UnitsRecord("s2", "img-2", "a red circle", "val", image_path=str(tmp_path / "no.png"))
    with pytest.raises(DataError, match="no.png"):
        read_images([missing], ["img-2"])


def test_ray_scores_equal_in_process_scores(ray_session, world_records, tiny, tmp_path):
    records = world_records[:4]
    # Two images travel as bytes, two as paths the actors read themselves.
    for record in records[:2]:
        (tmp_path / f"{record.image_id}.png").write_bytes(record.image_bytes)
    mixed = [
        UnitsRecord(
            r.sample_id,
            r.image_id,
            r.caption,
            r.split,
            r.entities,
            r.relations,
            image_path=str(tmp_path / f"{r.image_id}.png"),
        )
        for r in records[:2]
    ] + records[2:]
    items = build_benchmark(mixed, seed=0)
    images = image_sources(mixed, [i.image_id for i in items])
    assert sum(isinstance(v, str) for v in images.values()) == 2
    texts = [t for i in items for t in (i.anchor, i.completion, i.half_truth)]
    local = score_items(encode_features(BundleScorer(tiny, batch_size=16), texts, images), items)
    remote = score_items(encode_features_with_ray(tiny, texts, images, batch_size=16,
                                                  concurrency=1), items)
    for name in ("anchor", "completion", "half_truth"):
        np.testing.assert_allclose(getattr(remote, name), getattr(local, name), atol=1e-6)

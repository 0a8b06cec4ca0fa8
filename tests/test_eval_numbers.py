"""Evaluation numbers that must not change with how a run is invoked: VL-CheckList's subsets
with a relative or an absolute --data-root, image features of two retrieval sets whose ids
collide, retrieval counted as CLIP_benchmark counts it under the paper protocol, and the
paper protocol's benchmark cap. Pure Python, no Ray."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from suites_helpers import FIXTURES, RGB, ColorScorer

from csclip.eval.encoder import Encoder
from csclip.eval.suites.core import evaluate_suite_data
from csclip.eval.suites.vl_checklist import load_vl_checklist

# ---------------------------------------------------------------------------------------
# VL-CheckList: the subset is the corpus path below corpus/v1, whatever the root's spelling
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", ["official", "paper"])
def test_vl_checklist_subsets_are_the_same_with_a_relative_root(monkeypatch, protocol):
    absolute = load_vl_checklist(str(FIXTURES), protocol)
    monkeypatch.chdir(FIXTURES.parent)
    relative = load_vl_checklist(os.path.join(".", FIXTURES.name), protocol)
    assert relative.subsets() == absolute.subsets() == ["attribute_color", "relation_spatial"]
    scored_absolute, _ = evaluate_suite_data(Encoder(ColorScorer()), absolute)
    scored_relative, _ = evaluate_suite_data(Encoder(ColorScorer()), relative)
    assert scored_relative == scored_absolute
    assert scored_relative["vl_checklist_attribute_color_i2t"] == 50.0


# ---------------------------------------------------------------------------------------
# Image features: cached by what the image is, never by an id two suites share
# ---------------------------------------------------------------------------------------


def karpathy_set(folder: Path, dataset: str, images: list[tuple[str, list[str]]]) -> str:
    """A Karpathy JSON with one solid-colour image per (colour, captions), test split,
    ids 0, 1, ... as each dataset spells them (COCO: cocoid under val2014/; Flickr: imgid
    under flickr30k-images/). Returns the JSON's path."""
    coco = dataset == "coco"
    image_dir = folder / ("val2014" if coco else "flickr30k-images")
    image_dir.mkdir(parents=True, exist_ok=True)
    entries, sentence = [], 0
    for number, (colour, captions) in enumerate(images):
        name = f"{dataset}_{number}.png"
        Image.new("RGB", (4, 4), RGB[colour]).save(image_dir / name)
        sentences = [{"raw": c, "sentid": sentence + k} for k, c in enumerate(captions)]
        sentence += len(captions)
        entry = {"filename": name, "split": "test", "sentences": sentences}
        entry.update({"filepath": "val2014", "cocoid": number} if coco else {"imgid": number})
        entries.append(entry)
    path = folder / f"dataset_{dataset}.json"
    path.write_text(json.dumps({"dataset": dataset, "images": entries}))
    return str(path)


def test_a_flickr_image_is_never_scored_with_the_coco_image_of_its_id(tmp_path):
    from csclip.eval.retrieval import evaluate_karpathy

    coco = karpathy_set(tmp_path / "coco", "coco", [("red", ["a red train"]),
                                                     ("green", ["a green field"])])
    flickr_folder = tmp_path / "flickr30k"
    flickr = karpathy_set(flickr_folder, "flickr30k", [("yellow", ["a yellow taxi"]),
                                                        ("blue", ["a blue boat"])])
    alone = evaluate_karpathy(Encoder(ColorScorer()), "flickr30k", flickr,
                              str(flickr_folder / "flickr30k-images"))
    scorer = ColorScorer()
    encoder = Encoder(scorer)  # one evaluation: COCO first, then Flickr, one cache
    evaluate_karpathy(encoder, "coco", coco, str(tmp_path / "coco"))
    together = evaluate_karpathy(encoder, "flickr30k", flickr,
                                 str(flickr_folder / "flickr30k-images"))
    assert together == alone
    assert together["flickr30k_ret_i2t"] == together["flickr30k_ret_t2i"] == 100.0
    assert scorer.encoded_images == 4
    # The same files again (another suite reading them) are not encoded again.
    evaluate_karpathy(encoder, "coco", coco, str(tmp_path / "coco"))
    assert scorer.encoded_images == 4


def test_images_given_as_bytes_are_cached_by_their_content():
    import io

    def png(colour: str) -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (4, 4), RGB[colour]).save(buffer, format="PNG")
        return buffer.getvalue()

    scorer = ColorScorer()
    encoder = Encoder(scorer)
    first = encoder.features(["red"], {"0": png("red")})
    second = encoder.features(["red"], {"0": png("blue"), "1": png("red")})
    assert first.similarity(["0"], ["red"]).tolist() == [1.0]
    assert second.similarity(["0", "1"], ["red", "red"]).tolist() == [0.0, 1.0]
    assert scorer.encoded_images == 2  # the red image once, under either id


# ---------------------------------------------------------------------------------------
# Retrieval under the paper protocol: CLIP_benchmark's queries and torch.topk's ties
# ---------------------------------------------------------------------------------------


def clip_benchmark_recall_at_k(scores, positive_pairs, k):
    """CLIP_benchmark's recall_at_k, re-typed from LAION-AI/CLIP_benchmark@48de38c
    (clip_benchmark/metrics/zeroshot_retrieval.py): the reference the paper protocol must
    equal. scores: (nb texts, nb images); positive_pairs: bool, same shape."""
    import torch

    nb_texts, nb_images = scores.shape
    topk_indices = torch.topk(scores, k, dim=1)[1]
    nb_positive = positive_pairs.sum(dim=1)
    topk_indices_onehot = torch.nn.functional.one_hot(topk_indices, num_classes=nb_images)
    positive_pairs_reshaped = positive_pairs.view(nb_texts, 1, nb_images)
    nb_true_positive = (topk_indices_onehot * positive_pairs_reshaped).sum(dim=(1, 2))
    return nb_true_positive / nb_positive


# Three images, four caption instances: "a dog" names no colour and ties with everything
# (a miss in ours; torch.topk's pick in theirs: on this torch, its own image, the first),
# and a repeated caption (one query in ours, two in theirs).
PROBE = [("blue", ["a dog"]), ("red", ["a red train", "a red train"]),
         ("green", ["a green field"])]


def clip_benchmark_reference(k: int) -> tuple[float, float]:
    """(text_retrieval_recall@k, image_retrieval_recall@k) in percent, as their evaluate()
    computes them: one text row per caption instance, grouped by image in dataset order."""
    import io

    import torch

    scorer = ColorScorer()
    texts = [c for _, captions in PROBE for c in captions]
    texts_image_index = [n for n, (_, captions) in enumerate(PROBE) for _ in captions]
    pngs = []
    for colour, _ in PROBE:
        buffer = io.BytesIO()
        Image.new("RGB", (4, 4), RGB[colour]).save(buffer, format="PNG")
        pngs.append(buffer.getvalue())
    normalize = torch.nn.functional.normalize
    texts_emb = normalize(torch.tensor(scorer.encode_texts(texts), dtype=torch.float32), dim=-1)
    images_emb = normalize(torch.tensor(scorer.encode_images(pngs), dtype=torch.float32), dim=-1)
    scores = texts_emb @ images_emb.t()
    positive_pairs = torch.zeros_like(scores, dtype=bool)
    positive_pairs[torch.arange(len(scores)), texts_image_index] = True
    image_retrieval = (clip_benchmark_recall_at_k(scores, positive_pairs, k) > 0).float().mean()
    text_retrieval = (clip_benchmark_recall_at_k(scores.T, positive_pairs.T, k) > 0).float().mean()
    return 100.0 * text_retrieval.item(), 100.0 * image_retrieval.item()


def test_paper_protocol_retrieval_counts_as_clip_benchmark(tmp_path):
    from csclip.config.eval import SuitesConfig
    from csclip.eval.suites import evaluate_named_suites

    karpathy_set(tmp_path / "coco", "coco", PROBE)
    paper = SuitesConfig(names=("coco_retrieval",), data_root=str(tmp_path), protocol="paper")
    metrics = evaluate_named_suites(Encoder(ColorScorer()), paper)
    i2t, t2i = clip_benchmark_reference(1)
    assert metrics["coco_ret_i2t"] == pytest.approx(i2t)
    assert metrics["coco_ret_t2i"] == pytest.approx(t2i)
    assert metrics["coco_ret_num_queries_t2i"] == 4  # the repeated caption is two queries
    assert metrics["coco_ret_counting_clip_benchmark"] == 1.0
    # Ours, the named option: 3 distinct queries, and the ties are misses.
    ours = evaluate_named_suites(Encoder(ColorScorer()), paper.model_copy(
        update={"retrieval_counting": "strict"}))
    assert ours["coco_ret_t2i"] == pytest.approx(200 / 3) != metrics["coco_ret_t2i"]
    assert ours["coco_ret_i2t"] == pytest.approx(200 / 3)
    assert ours["coco_ret_num_queries_t2i"] == 3 and ours["coco_ret_counting_clip_benchmark"] == 0
    # One counting by default, whatever the protocol: CLIP_benchmark's.
    official = SuitesConfig(names=("coco_retrieval",), data_root=str(tmp_path))
    assert evaluate_named_suites(Encoder(ColorScorer()), official)["coco_ret_t2i"] == \
        metrics["coco_ret_t2i"]


def test_clip_benchmark_hits_take_torch_topk_at_every_k():
    from csclip.eval.retrieval import clip_benchmark_hits

    rng = np.random.default_rng(0)
    # Enough images (>= 64 k) for torch's heap selection, coarse features for many ties.
    images = rng.integers(0, 3, (130, 4)).astype(np.float32)
    texts = rng.integers(0, 3, (40, 4)).astype(np.float32)
    instances = sorted((int(rng.integers(0, 130)), t) for t in range(40))
    import torch

    scores = torch.from_numpy(texts[[t for _, t in instances]]) @ torch.from_numpy(images).T
    positive_pairs = torch.zeros_like(scores, dtype=bool)
    positive_pairs[torch.arange(len(scores)), [i for i, _ in instances]] = True
    i2t, t2i = clip_benchmark_hits(images, texts, instances, (1, 2))
    for k in (1, 2):
        theirs = clip_benchmark_recall_at_k(scores, positive_pairs, k) > 0
        assert t2i[k].tolist() == theirs.tolist()
        theirs = clip_benchmark_recall_at_k(scores.T, positive_pairs.T, k) > 0
        assert i2t[k].tolist() == theirs.tolist()


# ---------------------------------------------------------------------------------------
# The paper protocol's benchmark at the paper's size
# ---------------------------------------------------------------------------------------


def test_benchmark_build_paper_caps_at_the_papers_5000_images_per_pass():
    from csclip.entry import benchmark as benchmark_entry
    from csclip.eval.halftruth import PAPER_NUM_SAMPLES, BenchmarkConfig

    parser = benchmark_entry.build_parser()
    for protocol in ("paper", "auto"):
        args = parser.parse_args(["build", "--units", "u.json", "--protocol", protocol,
                                  "--out", "b.json"])
        assert benchmark_entry._config(args).num_samples == 5000  # what the file records
    args = parser.parse_args(["build", "--units", "u.json", "--protocol", "paper",
                              "--num-samples", "0", "--out", "b.json"])
    assert benchmark_entry._config(args).num_samples is None  # every image
    assert PAPER_NUM_SAMPLES == BenchmarkConfig().num_samples == 5000

"""Image-text retrieval Recall@k (image->text and text->image) over a set of captioned
images, from features encoded once by csclip.eval.encoder (SPEC §5)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from csclip.errors import DataError
from csclip.eval.encoder import Encoder, FeatureTables, image_sources
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

RECALL_KS: tuple[int, ...] = (1, 5, 10)
BLOCK_ROWS = 1024  # similarity rows computed at once: bounds memory on large sets


@dataclass(frozen=True)
class RetrievalSet:
    """Images and their captions: `pairs` holds (image index, text index) for every
    caption; texts are unique (a text captioning two images is one text with two pairs)."""

    image_ids: tuple[str, ...]
    texts: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...]

    def positives_of_images(self) -> list[list[int]]:
        """Text indices that caption each image."""
        out: list[list[int]] = [[] for _ in self.image_ids]
        for image, text in self.pairs:
            out[image].append(text)
        return out

    def positives_of_texts(self) -> list[list[int]]:
        """Image indices each text captions."""
        out: list[list[int]] = [[] for _ in self.texts]
        for image, text in self.pairs:
            out[text].append(image)
        return out


def retrieval_set(records: Sequence[UnitsRecord]) -> RetrievalSet:
    """One image per image_id, every distinct (image, caption) pair of `records`.

    Raises DataError when `records` is empty.
    """
    if not records:
        raise DataError("retrieval: no records; evaluate a non-empty split")
    image_ids = tuple(dict.fromkeys(r.image_id for r in records))
    texts = tuple(dict.fromkeys(r.caption for r in records))
    image_index = {i: k for k, i in enumerate(image_ids)}
    text_index = {t: k for k, t in enumerate(texts)}
    pairs = tuple(dict.fromkeys((image_index[r.image_id], text_index[r.caption]) for r in records))
    return RetrievalSet(image_ids, texts, pairs)


def _positive_mask(rows: Sequence[Sequence[int]], num_columns: int) -> np.ndarray:
    mask = np.zeros((len(rows), num_columns), dtype=bool)
    for row, columns in enumerate(rows):
        mask[row, list(columns)] = True
    return mask


def image_to_text_ranks(
    image_features: np.ndarray, text_features: np.ndarray, positives: Sequence[Sequence[int]]
) -> np.ndarray:
    """Rank (1 = best) of each image's best-scoring true caption among all texts.

    Strict: rank = 1 + the number of wrong texts scoring >= that caption, so a tie with a
    wrong text at the boundary is a miss. Other true captions never push it down (SPEC
    §5: I2T counts a hit when ANY of the image's captions is in the top k).

    image_features: (M, D) L2-normalised; text_features: (N, D); positives: per image,
    the indices of its captions (non-empty). Returns (M,) int ranks.
    """
    ranks = np.zeros(len(positives), dtype=np.int64)
    for start in range(0, len(positives), BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        similarity = image_features[block].astype(np.float64) @ text_features.T.astype(
            np.float64
        )  # (b, N)
        is_true = _positive_mask(positives[block], text_features.shape[0])  # (b, N)
        best_true = np.where(is_true, similarity, -np.inf).max(axis=1, keepdims=True)  # (b, 1)
        ranks[block] = 1 + ((similarity >= best_true) & ~is_true).sum(axis=1)
    return ranks


def text_to_image_ranks(
    image_features: np.ndarray, text_features: np.ndarray, positives: Sequence[Sequence[int]]
) -> np.ndarray:
    """Rank of each (text, own image) query among all images, one entry per pair in the
    order of `positives` (per text, its images).

    Strict: rank = 1 + the number of images that the text does not caption scoring >= its
    own image; an image the same text also captions is not counted against it.
    """
    ranks: list[np.ndarray] = []
    for start in range(0, len(positives), BLOCK_ROWS):
        block = slice(start, start + BLOCK_ROWS)
        similarity = text_features[block].astype(np.float64) @ image_features.T.astype(
            np.float64
        )  # (b, M)
        is_true = _positive_mask(positives[block], image_features.shape[0])  # (b, M)
        for row, images in enumerate(positives[block]):
            own = similarity[row, images][:, None]  # (p, 1)
            wrong = similarity[row][~is_true[row]][None, :]  # (1, M - p)
            ranks.append(1 + (wrong >= own).sum(axis=1))
    return np.concatenate(ranks) if ranks else np.zeros(0, dtype=np.int64)


def recall_metrics(
    i2t_ranks: np.ndarray, t2i_ranks: np.ndarray, ks: Sequence[int] = RECALL_KS
) -> dict[str, float]:
    """`ret_i2t` / `ret_t2i` (R@1) and `ret_<dir>_r<k>` for the other k, in percent."""
    metrics: dict[str, float] = {}
    for direction, ranks in (("i2t", i2t_ranks), ("t2i", t2i_ranks)):
        if len(ranks) == 0:
            continue  # not measured: no key (tables show it as missing, never 0)
        for k in ks:
            key = f"ret_{direction}" if k == 1 else f"ret_{direction}_r{k}"
            metrics[key] = 100.0 * float(np.mean(ranks <= k))
    metrics["ret_num_images"] = float(len(i2t_ranks))
    metrics["ret_num_queries_t2i"] = float(len(t2i_ranks))
    return metrics


def retrieval_metrics(
    features: FeatureTables, rset: RetrievalSet, ks: Sequence[int] = RECALL_KS
) -> dict[str, float]:
    """Recall@k both ways from features that hold every image and text of `rset`."""
    images = features.image_features[[features.image_index[i] for i in rset.image_ids]]
    texts = features.text_features[[features.text_index[t] for t in rset.texts]]
    i2t = image_to_text_ranks(images, texts, rset.positives_of_images())
    per_text = rset.positives_of_texts()
    t2i = text_to_image_ranks(images, texts, per_text)
    metrics = recall_metrics(i2t, t2i, ks)
    metrics["ret_num_texts"] = float(len(rset.texts))
    return metrics


def evaluate_retrieval(
    encoder: Encoder, records: Sequence[UnitsRecord], ks: Sequence[int] = RECALL_KS
) -> dict[str, float]:
    """Recall@k over `records` (their images and captions), with features from `encoder`
    (its cache: what the half-truth benchmark encoded is not encoded again).

    Raises DataError for no records or a record without image bytes or path.
    """
    rset = retrieval_set(records)
    features = encoder.features(rset.texts, image_sources(records, rset.image_ids))
    metrics = retrieval_metrics(features, rset, ks)
    log.debug(  # every evaluation runs it (csclip.eval.suites): not a line of the demo's log
        "retrieval over %d images, %d texts: R@1 i2t %.1f t2i %.1f",
        len(rset.image_ids),
        len(rset.texts),
        metrics.get("ret_i2t", float("nan")),
        metrics.get("ret_t2i", float("nan")),
    )
    return metrics


# ---------------------------------------------------------------------------------------
# COCO / Flickr30k Karpathy test from local or s3:// copies
# ---------------------------------------------------------------------------------------

KARPATHY_LAYOUT = {
    "coco": "dataset_coco.json (Karpathy) and the val2014/ folder its filepath names",
    "flickr30k": "dataset_flickr30k.json (Karpathy) and flickr30k-images/ (or images/)",
}


@dataclass(frozen=True)
class KarpathySet:
    """A Karpathy split as a RetrievalSet with its image URIs, and the captions left out
    because their image is missing."""

    rset: RetrievalSet
    images: dict[str, str]
    num_skipped_captions: int


def load_karpathy(json_uri: str, image_root: str, split: str = "test") -> KarpathySet:
    """The `split` images of a Karpathy JSON (dataset_coco.json / dataset_flickr30k.json,
    read by csclip.karpathy) with every caption; images under image_root (local
    or s3://). Raises DataError for a malformed file or a split without images."""
    from csclip.eval.suites.core import ImageFolder
    from csclip.karpathy import read_karpathy
    from csclip.storage import filesystem_for

    filesystem, path = filesystem_for(json_uri)
    folder = ImageFolder(image_root)
    pairs: list[tuple[str, str]] = []
    images: dict[str, str] = {}
    skipped = 0
    for entry in read_karpathy(filesystem, path, restval_as_train=True):
        if entry.split != split:
            continue
        ref = folder.ref(entry.image_file)
        if ref is None:
            skipped += 1
            continue
        images[entry.image_id] = ref
        pairs.append((entry.image_id, entry.caption))
    if not pairs:
        raise DataError(f"{json_uri}: no {split!r} captions with an image under {image_root} "
                        f"({skipped} without an image)")
    image_ids = tuple(dict.fromkeys(i for i, _ in pairs))
    texts = tuple(dict.fromkeys(t for _, t in pairs))
    image_index = {i: k for k, i in enumerate(image_ids)}
    text_index = {t: k for k, t in enumerate(texts)}
    rset = RetrievalSet(image_ids, texts, tuple(dict.fromkeys(
        (image_index[i], text_index[t]) for i, t in pairs)))
    return KarpathySet(rset, images, skipped)


def evaluate_karpathy(encoder: Encoder, dataset: str, json_uri: str, image_root: str,
                      split: str = "test") -> dict[str, float]:
    """Recall@1/5/10 both ways on a Karpathy split: keys `<dataset>_ret_i2t`,
    `<dataset>_ret_t2i` (R@1), `<dataset>_ret_{i2t,t2i}_r{5,10}`, counts and
    `<dataset>_ret_skipped_captions` (image missing). Same rules as the world's retrieval
    (any caption counts for I2T; a tie with a wrong item is a miss)."""
    karpathy = load_karpathy(json_uri, image_root, split)
    features = encoder.features(karpathy.rset.texts, karpathy.images)
    metrics = retrieval_metrics(features, karpathy.rset)
    out = {f"{dataset}_{key}": value for key, value in metrics.items()}
    out[f"{dataset}_ret_skipped_captions"] = float(karpathy.num_skipped_captions)
    log.info("%s %s retrieval: %d images, %d captions (%d skipped): R@1 i2t %.1f t2i %.1f",
             dataset, split, len(karpathy.rset.image_ids), len(karpathy.rset.pairs),
             karpathy.num_skipped_captions, out[f"{dataset}_ret_i2t"], out[f"{dataset}_ret_t2i"])
    return out

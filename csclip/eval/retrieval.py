"""Image-text retrieval Recall@k (image->text and text->image) over a set of captioned
images, from features encoded once by csclip.eval.encoder (SPEC §5), counted one of two
ways (`RetrievalCounting`, docs/evaluation.md "Retrieval"):

- "strict" (ours): one text query per distinct (image, caption) pair; a hit needs the
  true item strictly above every wrong one within the top k (a tie at the boundary is a
  miss), so the number does not depend on the order of the files.
- "clip_benchmark": as LAION-AI/CLIP_benchmark counts it (clip_benchmark/metrics/
  zeroshot_retrieval.py at 48de38c, which the CS-CLIP authors' numbers come from): one text
  query per caption instance (a caption repeated for an image is two queries), and the
  top k of each float32 score row is what torch.topk returns, ties included.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from csclip.config.eval import RetrievalCounting
from csclip.errors import DataError
from csclip.eval.benchmark_file import resolve_image
from csclip.eval.encoder import Encoder, FeatureTables, image_sources
from csclip.karpathy import read_karpathy
from csclip.storage import filesystem_for, read_bytes
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)

RECALL_KS: tuple[int, ...] = (1, 5, 10)
BLOCK_ROWS = 1024  # similarity rows computed at once: bounds memory on large sets


@dataclass(frozen=True)
class RetrievalSet:
    """Images and their captions: `pairs` holds (image index, text index) for every
    distinct caption of an image; texts are unique (a text captioning two images is one
    text with two pairs). `instances` holds every caption as the files have it, repeats
    kept, grouped by image in image order (CLIP_benchmark's query rows)."""

    image_ids: tuple[str, ...]
    texts: tuple[str, ...]
    pairs: tuple[tuple[int, int], ...]
    instances: tuple[tuple[int, int], ...]

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
    return _retrieval_set([(r.image_id, r.caption) for r in records])


def _retrieval_set(captions: Sequence[tuple[str, str]]) -> RetrievalSet:
    """The RetrievalSet of (image id, caption) in file order."""
    image_ids = tuple(dict.fromkeys(i for i, _ in captions))
    texts = tuple(dict.fromkeys(t for _, t in captions))
    image_index = {i: k for k, i in enumerate(image_ids)}
    text_index = {t: k for k, t in enumerate(texts)}
    # sorted() is stable: each image's captions keep their order.
    instances = tuple(sorted(((image_index[i], text_index[t]) for i, t in captions),
                             key=lambda pair: pair[0]))
    return RetrievalSet(image_ids, texts, tuple(dict.fromkeys(instances)), instances)


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
    """`ret_i2t` / `ret_t2i` (R@1) and `ret_<dir>_r<k>` for the other k, in percent, from
    strict ranks."""
    return hit_metrics({k: i2t_ranks <= k for k in ks}, {k: t2i_ranks <= k for k in ks},
                       len(i2t_ranks), len(t2i_ranks))


def hit_metrics(i2t_hits: dict[int, np.ndarray], t2i_hits: dict[int, np.ndarray],
                num_images: int, num_queries: int) -> dict[str, float]:
    """`ret_i2t` / `ret_t2i` (R@1) and `ret_<dir>_r<k>` for the other k, in percent, from
    a hit (bool) per query and k; plus the counts of image and text queries."""
    metrics: dict[str, float] = {}
    for direction, hits, num in (("i2t", i2t_hits, num_images), ("t2i", t2i_hits, num_queries)):
        if num == 0:
            continue  # not measured: no key (tables show it as missing, never 0)
        for k, hit in hits.items():
            key = f"ret_{direction}" if k == 1 else f"ret_{direction}_r{k}"
            metrics[key] = 100.0 * float(np.mean(hit))
    metrics["ret_num_images"] = float(num_images)
    metrics["ret_num_queries_t2i"] = float(num_queries)
    return metrics


def clip_benchmark_hits(image_features: np.ndarray, text_features: np.ndarray,
                        instances: Sequence[tuple[int, int]], ks: Sequence[int]
                        ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """(I2T, T2I) hits per k as CLIP_benchmark's zeroshot_retrieval.evaluate counts them:
    scores = texts @ images.T in float32, one text row per caption instance; a T2I query
    hits when its image is among torch.topk(its row, k), an image when one of its caption
    instances is among torch.topk(its column, k) (their recall_at_k > 0). Ties fall as
    torch.topk resolves them (docs/evaluation.md, "Retrieval"). k above the row length
    is that length: every item retrieved (where theirs raises).

    image_features: (M, D); text_features: (N, D), the unique texts; instances: (image
    index, text index) per caption instance. Returns bool arrays of shape (M,) and (Q,).
    """
    images = torch.from_numpy(np.ascontiguousarray(image_features, dtype=np.float32))
    queries = torch.from_numpy(np.ascontiguousarray(
        np.asarray(text_features, dtype=np.float32)[[t for _, t in instances]]))  # (Q, D)
    scores = queries @ images.T  # (Q, M), their `texts_emb @ images_emb.t()`
    own_image = torch.tensor([i for i, _ in instances], dtype=torch.long)  # (Q,)
    image_rows = torch.arange(images.shape[0])
    t2i = {k: _topk_hits(scores, own_image, image_rows, k) for k in ks}
    i2t = {k: _topk_hits(scores.T, image_rows, own_image, k) for k in ks}
    return i2t, t2i


def _topk_hits(scores, row_labels, column_labels, k: int) -> np.ndarray:
    """Per row of `scores` (torch, (R, C)): whether torch.topk's k columns hold one whose
    label is the row's. Blocks of BLOCK_ROWS rows; topk works row by row, so the blocks
    do not change which columns it picks."""
    k = min(k, scores.shape[1])
    hits = []
    for start in range(0, scores.shape[0], BLOCK_ROWS):
        top = torch.topk(scores[start : start + BLOCK_ROWS], k, dim=1).indices  # (b, k)
        labels = row_labels[start : start + BLOCK_ROWS, None]  # (b, 1)
        hits.append((column_labels[top] == labels).any(dim=1).numpy())
    return np.concatenate(hits) if hits else np.zeros(0, dtype=bool)


def retrieval_metrics(
    features: FeatureTables, rset: RetrievalSet, ks: Sequence[int] = RECALL_KS,
    counting: RetrievalCounting = "strict",
) -> dict[str, float]:
    """Recall@k both ways from features that hold every image and text of `rset`, counted
    `counting`'s way; `ret_counting_clip_benchmark` says which (1 or 0)."""
    images = features.image_features[[features.image_index[i] for i in rset.image_ids]]
    texts = features.text_features[[features.text_index[t] for t in rset.texts]]
    if counting == "clip_benchmark":
        i2t_hits, t2i_hits = clip_benchmark_hits(images, texts, rset.instances, ks)
        metrics = hit_metrics(i2t_hits, t2i_hits, len(rset.image_ids), len(rset.instances))
    else:
        i2t = image_to_text_ranks(images, texts, rset.positives_of_images())
        t2i = text_to_image_ranks(images, texts, rset.positives_of_texts())
        metrics = recall_metrics(i2t, t2i, ks)
    metrics["ret_num_texts"] = float(len(rset.texts))
    metrics["ret_counting_clip_benchmark"] = float(counting == "clip_benchmark")
    return metrics


def evaluate_retrieval(
    encoder: Encoder, records: Sequence[UnitsRecord], ks: Sequence[int] = RECALL_KS,
    counting: RetrievalCounting = "strict",
) -> dict[str, float]:
    """Recall@k over `records` (their images and captions), with features from `encoder`
    (its cache: what the half-truth benchmark encoded is not encoded again).

    Raises DataError for no records or a record without image bytes or path.
    """
    rset = retrieval_set(records)
    features = encoder.features(rset.texts, image_sources(records, rset.image_ids))
    metrics = retrieval_metrics(features, rset, ks, counting)
    log.debug(  # every evaluation runs it (csclip.eval.suites): not a line of the demo's log
        "retrieval over %d images, %d texts: R@1 i2t %.1f t2i %.1f",
        len(rset.image_ids),
        len(rset.texts),
        metrics.get("ret_i2t", float("nan")),
        metrics.get("ret_t2i", float("nan")),
    )
    return metrics


# ---------------------------------------------------------------------------------------
# COCO / Flickr30k / Flickr8k Karpathy test from local or s3:// copies
# ---------------------------------------------------------------------------------------

KARPATHY_LAYOUT = {
    "coco": "dataset_coco.json (Karpathy) and the val2014/ folder its filepath names",
    "flickr30k": "dataset_flickr30k.json (Karpathy) and flickr30k-images/ (or images/)",
    "flickr8k": "flickr8k_test_karpathy.txt (CLIP_benchmark's) and Images/ (or the images "
                "beside it), or dataset_flickr8k.json (Karpathy) and Flicker8k_Dataset/ (or "
                "images/)",
}


@dataclass(frozen=True)
class KarpathySet:
    """A Karpathy split as a RetrievalSet with its image URIs, and the captions left out
    because their image is missing."""

    rset: RetrievalSet
    images: dict[str, str]
    num_skipped_captions: int


def refuse_outside(entry: str, image: str, image_root: str) -> None:
    """Raise DataError, one line of `entry` (the file and its entry) and the path, when an
    annotation file's image path leaves image_root (benchmark_file's rule, resolve_image: a
    ".." component, or an absolute path or URI not under the root): a file someone hands us
    names images in its folder, never files elsewhere on the machine or in the bucket to be
    read and scored."""
    try:
        resolve_image(entry, image, image_root)
    except DataError as err:
        raise DataError(f"{entry} {image!r} is outside {image_root}; its images must be "
                        "paths under that folder (no '..', no absolute path elsewhere)"
                        ) from err


def load_karpathy(json_uri: str, image_root: str, split: str = "test",
                  by_coco_id: bool = False) -> KarpathySet:
    """The `split` images of a Karpathy JSON (dataset_coco.json / dataset_flickr30k.json,
    read by csclip.karpathy) with every caption; images under image_root (local
    or s3://). by_coco_id: images in ascending COCO id, each image's captions in file
    order, as CLIP_benchmark's mscoco_captions has them (torchvision's CocoCaptions sorts
    its image ids), so an exact tie falls on the same item under torch.topk; else file
    order. Raises DataError for a malformed file or a split without images."""
    from csclip.eval.suites.core import ImageFolder  # noqa: PLC0415  the suites package imports this module, and its core runs that package first

    filesystem, path = filesystem_for(json_uri)
    folder = ImageFolder(image_root)
    pairs: list[tuple[str, str]] = []
    images: dict[str, str] = {}
    skipped = 0
    for entry in read_karpathy(filesystem, path, restval_as_train=True):
        if entry.split != split:
            continue
        refuse_outside(f"{json_uri}: image {entry.image_id!r} at", entry.image_file, image_root)
        ref = folder.ref(entry.image_file)
        if ref is None:
            skipped += 1
            continue
        images[entry.image_id] = ref
        pairs.append((entry.image_id, entry.caption))
    if not pairs:
        raise DataError(f"{json_uri}: no {split!r} captions with an image under {image_root} "
                        f"({skipped} without an image)")
    if by_coco_id:  # a stable sort: each image's captions keep their order
        pairs.sort(key=lambda pair: int(pair[0]))
    return KarpathySet(_retrieval_set(pairs), images, skipped)


def load_clip_benchmark_captions(txt_uri: str, image_root: str) -> KarpathySet:
    """CLIP_benchmark's Flickr annotation (`flickr8k_test_karpathy.txt`, read as
    clip_benchmark.datasets.flickr.Flickr reads it: a header line, then one
    `<image>.jpg,<caption>` per line, the split at the first ".jpg,") with its images under
    image_root (local or s3://). Raises DataError for a line without ".jpg," or no image."""
    from csclip.eval.suites.core import ImageFolder  # noqa: PLC0415  the suites package imports this module, and its core runs that package first

    filesystem, path = filesystem_for(txt_uri)
    try:
        lines = read_bytes(filesystem, path).decode().splitlines()[1:]
    except UnicodeDecodeError as err:
        raise DataError(f"{txt_uri}: not UTF-8 text (byte {err.start})") from err
    folder = ImageFolder(image_root)
    pairs: list[tuple[str, str]] = []
    images: dict[str, str] = {}
    skipped = 0
    for number, line in enumerate(lines, start=2):
        line = line.strip()
        if not line:
            continue
        if ".jpg," not in line:
            raise DataError(f"{txt_uri} line {number}: no '<image>.jpg,<caption>' (expects "
                            f"{KARPATHY_LAYOUT['flickr8k']})")
        image, caption = line.split(".jpg,", 1)
        image += ".jpg"
        refuse_outside(f"{txt_uri} line {number}: image", image, image_root)
        ref = images.get(image) or folder.ref(image)
        if ref is None:
            skipped += 1
            continue
        images[image] = ref
        pairs.append((image, caption))
    if not pairs:
        raise DataError(f"{txt_uri}: no captions with an image under {image_root} "
                        f"({skipped} without an image)")
    return KarpathySet(_retrieval_set(pairs), images, skipped)


def evaluate_karpathy(encoder: Encoder, dataset: str, json_uri: str, image_root: str,
                      split: str = "test", counting: RetrievalCounting = "clip_benchmark"
                      ) -> dict[str, float]:
    """Recall@1/5/10 both ways on a Karpathy split: keys `<dataset>_ret_i2t`,
    `<dataset>_ret_t2i` (R@1), `<dataset>_ret_{i2t,t2i}_r{5,10}`, counts and
    `<dataset>_ret_skipped_captions` (image missing). Any caption counts for I2T; queries
    and ties as `counting` says (the module docstring; CLIP_benchmark's by default), COCO's
    images in CLIP_benchmark's order (ascending COCO id). A `.txt` json_uri is
    CLIP_benchmark's caption file of that split (load_clip_benchmark_captions)."""
    if json_uri.endswith(".txt"):
        karpathy = load_clip_benchmark_captions(json_uri, image_root)
    else:
        karpathy = load_karpathy(json_uri, image_root, split, by_coco_id=dataset == "coco")
    features = encoder.features(karpathy.rset.texts, karpathy.images)
    metrics = retrieval_metrics(features, karpathy.rset, counting=counting)
    out = {f"{dataset}_{key}": value for key, value in metrics.items()}
    out[f"{dataset}_ret_skipped_captions"] = float(karpathy.num_skipped_captions)
    log.info("%s %s retrieval: %d images, %d captions (%d skipped): R@1 i2t %.1f t2i %.1f",
             dataset, split, len(karpathy.rset.image_ids), len(karpathy.rset.instances),
             karpathy.num_skipped_captions, out[f"{dataset}_ret_i2t"], out[f"{dataset}_ret_t2i"])
    return out

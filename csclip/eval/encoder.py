"""The encoder of an evaluation: every unique text and every image is encoded once per
model, in batches, in process (small sets) or on Ray Data actors holding the model (large
sets), into one feature cache that the half-truth benchmark and every suite share; scores
are then cosine similarities looked up from the cached features."""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from PIL import Image

from csclip.config.eval import ScoringConfig
from csclip.errors import DataError
from csclip.model import ClipBundle
from csclip.progress import progress
from csclip.storage import filesystem_for, is_s3, read_bytes
from csclip.units import UnitsRecord

log = logging.getLogger(__name__)


@runtime_checkable
class Scorer(Protocol):
    """Anything that embeds texts and images in one space. Rows need not be normalised;
    score_items normalises them, so similarities are always cosines."""

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:  # (N, D)
        ...

    def encode_images(self, images: Sequence[bytes]) -> np.ndarray:  # (M, D)
        ...


def l2_normalize(features: np.ndarray) -> np.ndarray:
    features = np.asarray(features, dtype=np.float32)
    norms = np.linalg.norm(features, axis=-1, keepdims=True)
    return features / np.maximum(norms, 1e-12)


def decode_image(data: bytes):
    """Encoded PNG/JPEG bytes -> RGB PIL image."""
    return Image.open(io.BytesIO(data)).convert("RGB")


class BundleScorer:
    """The real scorer: an open_clip ClipBundle, batched, without gradients."""

    def __init__(self, bundle: ClipBundle, batch_size: int = 64, device: str = "cpu",
                 show_progress: bool = True) -> None:
        self.bundle = bundle
        self.batch_size = batch_size
        self.device = device
        self.show_progress = show_progress
        self.model = bundle.model.to(device).eval()

    def encode_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(N, D) L2-normalised text features, with progress (csclip.progress): every
        text of an evaluation comes in one call. Images come in chunks; encode_features
        shows theirs."""
        return self._encode(
            texts,
            lambda chunk: self.model.encode_text(
                self.bundle.tokenizer(list(chunk)).to(self.device)
            ),
            desc="encode texts" if self.show_progress else None,
        )

    def encode_images(self, images: Sequence[bytes]) -> np.ndarray:
        """(M, D) L2-normalised image features of encoded image bytes."""
        return self._encode(
            images,
            lambda chunk: self.model.encode_image(
                torch.stack([self.bundle.preprocess(decode_image(data)) for data in chunk]).to(
                    self.device
                )
            ),
        )

    def _encode(self, inputs: Sequence, encode, desc: str | None = None) -> np.ndarray:
        outputs = []
        with torch.inference_mode(), progress(desc=desc or "", total=len(inputs), unit="text",
                                              enabled=desc is not None) as bar:
            for start in range(0, len(inputs), self.batch_size):
                features = encode(inputs[start : start + self.batch_size]).float()  # (b, D)
                outputs.append(torch.nn.functional.normalize(features, dim=-1).cpu().numpy())
                bar.update(len(outputs[-1]))
        if not outputs:
            return np.zeros((0, self._embed_dim()), dtype=np.float32)
        return np.concatenate(outputs)

    def _embed_dim(self) -> int:
        projection = getattr(self.model, "text_projection", None)
        return int(projection.shape[-1]) if projection is not None else 0


@dataclass(frozen=True)
class FeatureTables:
    """L2-normalised features of unique texts and images, with their row indices."""

    text_index: Mapping[str, int]
    text_features: np.ndarray  # (num_texts, D)
    image_index: Mapping[str, int]
    image_features: np.ndarray  # (num_images, D)

    def similarity(self, image_ids: Sequence[str], texts: Sequence[str]) -> np.ndarray:
        """Cosine similarity of each (image, text) pair, shape (len(texts),)."""
        images = self.image_features[[self.image_index[i] for i in image_ids]]
        text_rows = self.text_features[[self.text_index[t] for t in texts]]
        return (images.astype(np.float64) * text_rows.astype(np.float64)).sum(-1)


ImageSource = bytes | str  # encoded image bytes, or a URI read only when it is encoded


IMAGES_PER_READ = 256  # images held in memory at once while encoding in process


def image_sources(
    records: Sequence[UnitsRecord], image_ids: Sequence[str]
) -> dict[str, ImageSource]:
    """Each image id's `image_bytes`, else its `image_path` URI (local or s3://), which is
    read only when encoded, so large sets never sit in memory whole.

    Raises DataError for an id not in `records` or a record with neither field.
    """
    by_id: dict[str, UnitsRecord] = {}
    for record in records:
        known = by_id.get(record.image_id)
        if known is None or (known.image_bytes is None and not known.image_path):
            by_id[record.image_id] = record
    sources: dict[str, ImageSource] = {}
    for image_id in dict.fromkeys(image_ids):
        record = by_id.get(image_id)
        if record is None:
            raise DataError(
                f"image {image_id!r} is in the benchmark but not in the units table; "
                "score the benchmark against the table it was built from"
            )
        if record.image_bytes is not None:
            sources[image_id] = record.image_bytes
        elif record.image_path:
            sources[image_id] = record.image_path
        else:
            raise DataError(
                f"image {image_id!r} has neither image_bytes nor image_path; "
                "fill one of them in the units table"
            )
    return sources


CROP_MARK = "#crop="  # "<uri>#crop=x,y,w,h": a box of the image (ARO's VG items)
# "<uri>#sha256=<hex>": the file's bytes must have this digest (a frozen benchmark file's
# images, csclip.eval.benchmark_file), checked where it is read, on a Ray actor too.
DIGEST_MARK = "#sha256="


def load_image(source: ImageSource) -> bytes:
    """The encoded bytes of an image source (reading a URI through csclip.storage; a URI
    ending in `#crop=x,y,w,h` is cropped to that box and re-encoded as PNG; one ending in
    `#sha256=<hex>` is refused with a DataError unless the file's bytes have that digest)."""
    if isinstance(source, bytes | bytearray | memoryview):
        return bytes(source)

    source, mark, digest = source.rpartition(DIGEST_MARK) if DIGEST_MARK in source else (
        source, "", "")
    uri, _, box = source.partition(CROP_MARK)
    filesystem, path = filesystem_for(uri)
    try:
        data = read_bytes(filesystem, path)
    except DataError as err:
        if uri.startswith(("/", "~")) or "://" in uri:
            raise
        # A relative path not joined to any root: a units table's paths are often relative
        # to an image folder the command was not given.
        raise DataError(f"{err}; a relative image path is read from the current directory: "
                        "give --image-root DIR, the folder its paths are under") from err
    if mark and hashlib.sha256(data).hexdigest() != digest:
        raise DataError(f"image {uri}: its bytes differ from those the benchmark file was "
                        f"built with (sha256 {hashlib.sha256(data).hexdigest()[:16]}..., the "
                        f"file says {digest[:16]}...); restore the image or rebuild the file")
    if not box:
        return data
    x, y, w, h = (int(v) for v in box.split(","))
    buffer = io.BytesIO()
    decode_image(data).crop((x, y, x + w, y + h)).save(buffer, format="PNG")
    return buffer.getvalue()


def _encode_image_chunk(scorer: Scorer, images: Mapping[str, ImageSource],
                        image_ids: Sequence[str]) -> np.ndarray:
    """The scorer's features of these images; an image that is there but does not decode
    (a truncated or corrupt file) is one DataError line naming it, not a PIL traceback."""
    data = [load_image(images[i]) for i in image_ids]
    try:
        return scorer.encode_images(data)
    except (OSError, ValueError) as err:  # PIL's UnidentifiedImageError is an OSError
        for image_id, encoded in zip(image_ids, data, strict=True):
            try:
                decode_image(encoded).load()
            except (OSError, ValueError) as bad:
                source = images[image_id]
                where = source if isinstance(source, str) else f"image {image_id}"
                raise DataError(f"{where}: not a readable image ({bad}); replace the file or "
                                "remove its records") from err
        raise


def encode_features(
    scorer: Scorer, texts: Sequence[str], images: Mapping[str, ImageSource]
) -> FeatureTables:
    """Encode each unique text and each image once (in process), reading images
    IMAGES_PER_READ at a time."""
    unique_texts = sorted(set(texts))
    image_ids = sorted(images)
    log.info("encoding %d unique texts and %d images", len(unique_texts), len(image_ids))
    text_features = l2_normalize(scorer.encode_texts(unique_texts))
    chunks = []
    with progress(desc="encode images", total=len(image_ids), unit="image") as bar:
        for start in range(0, len(image_ids), IMAGES_PER_READ):
            chunk = image_ids[start : start + IMAGES_PER_READ]
            chunks.append(l2_normalize(_encode_image_chunk(scorer, images, chunk)))
            bar.update(len(chunk))
    image_features = np.concatenate(chunks) if chunks else l2_normalize(scorer.encode_images([]))
    return FeatureTables(
        {t: k for k, t in enumerate(unique_texts)},
        text_features,
        {i: k for k, i in enumerate(image_ids)},
        image_features,
    )


def merge_features(first: FeatureTables, second: FeatureTables) -> FeatureTables:
    """`first` plus the rows of `second` whose text or image it lacks."""

    def merge(index_a, rows_a, index_b, rows_b):
        new_keys = [k for k in index_b if k not in index_a]
        if not new_keys:
            return index_a, rows_a
        added = rows_b[[index_b[k] for k in new_keys]]
        if rows_a.shape[0] == 0:  # an empty table may have no feature dimension: (0, 0)
            return {k: n for n, k in enumerate(new_keys)}, added
        index = dict(index_a)
        index.update({k: rows_a.shape[0] + n for n, k in enumerate(new_keys)})
        return index, np.concatenate([rows_a, added])

    text_index, text_features = merge(
        first.text_index, first.text_features, second.text_index, second.text_features
    )
    image_index, image_features = merge(
        first.image_index, first.image_features, second.image_index, second.image_features
    )
    return FeatureTables(text_index, text_features, image_index, image_features)




def image_key(source: ImageSource) -> str:
    """What the feature cache knows an image by: `sha256:<hex>` of the bytes a source holds,
    else `uri:<URI>` (a local path made absolute; crop and digest marks kept, so two crops
    of one file are two images). Never the caller's image id: ids are per benchmark (COCO's
    cocoid, Flickr's list index, a suite's file name) and the same id names different
    images in different suites of one evaluation.

    A URI is not read to key it: hashing every file again on each lookup would double the
    reads (S3 requests) an evaluation makes, and a stat per image would add one request
    each. A cache lives one evaluation in one process, and a frozen benchmark's images are
    pinned by their sha256 where they are read (DIGEST_MARK); a file rewritten in place
    during one evaluation keeps the features of its first read.
    """
    if isinstance(source, bytes | bytearray | memoryview):
        return "sha256:" + hashlib.sha256(source).hexdigest()

    if is_s3(source) or ("://" in source and not source.startswith("file://")):
        return "uri:" + source

    return "uri:" + str(Path(source.removeprefix("file://")).expanduser().absolute())


# Above this many new images an Encoder with a bundle encodes on Ray Data actors
# (scoring.ray_concurrency of them); below, in process: starting Ray and shipping the
# model costs seconds, which a smaller set never wins back.
RAY_MIN_IMAGES = 5000


class Encoder:
    """One model's encoder with its feature cache: `features(texts, images)` encodes only
    what the cache lacks, so the half-truth benchmark, retrieval and every suite of one
    evaluation encode each unique text and image once. Texts are cached by their string,
    images by what they are (image_key: their bytes or their file), never by the caller's
    id, which two suites may use for two different images.

    scorer: any Scorer; bundle: the ClipBundle behind it, which lets large image sets
    (more than RAY_MIN_IMAGES new images) go to Ray Data actors.
    """

    def __init__(self, scorer: Scorer, *, bundle: ClipBundle | None = None,
                 scoring: ScoringConfig | None = None) -> None:
        self.scorer = scorer
        self.bundle = bundle
        self.scoring = scoring or ScoringConfig()
        self._cache = FeatureTables({}, np.zeros((0, 0), np.float32), {},
                                    np.zeros((0, 0), np.float32))

    @classmethod
    def for_bundle(cls, bundle: ClipBundle, scoring: ScoringConfig | None = None) -> Encoder:
        """An Encoder over a BundleScorer of `bundle` (one per model and evaluation)."""
        scoring = scoring or ScoringConfig()
        scorer = BundleScorer(bundle, batch_size=scoring.batch_size, device=scoring.device)
        return cls(scorer, bundle=bundle, scoring=scoring)

    @property
    def cache(self) -> FeatureTables:
        """Everything encoded so far; its image_index is keyed by image_key."""
        return self._cache

    def features(self, texts: Sequence[str], images: Mapping[str, ImageSource]) -> FeatureTables:
        """Features holding every text of `texts` (and all cached ones) and every image of
        `images` under the caller's ids, encoding only what the cache lacks."""
        keys = {image_id: image_key(source) for image_id, source in images.items()}
        new_texts = sorted({t for t in texts if t not in self._cache.text_index})
        # One caller id per new image, so an image that does not decode is named by it.
        first_id: dict[str, str] = {}
        for image_id, key in keys.items():
            first_id.setdefault(key, image_id)
        new_images = {image_id: images[image_id] for key, image_id in first_id.items()
                      if key not in self._cache.image_index}
        if new_texts or new_images:
            encoded = self._encode(new_texts, new_images)
            encoded = FeatureTables(encoded.text_index, encoded.text_features,
                                    {keys[i]: row for i, row in encoded.image_index.items()},
                                    encoded.image_features)
            self._cache = merge_features(self._cache, encoded)
        cache = self._cache
        return FeatureTables(cache.text_index, cache.text_features,
                             {image_id: cache.image_index[key] for image_id, key in keys.items()},
                             cache.image_features)

    def _encode(self, texts: Sequence[str], images: Mapping[str, ImageSource]) -> FeatureTables:
        scoring = self.scoring
        if self.bundle is not None and len(images) > RAY_MIN_IMAGES:
            return encode_features_with_ray(
                self.bundle, texts, images, batch_size=scoring.batch_size,
                concurrency=scoring.ray_concurrency, device=scoring.device)
        return encode_features(self.scorer, texts, images)


class _EncodeBatch:
    """Ray Data callable class: holds one BundleScorer per actor. A batch mixes text rows
    and image rows (`kind`); features come back in the batch's row order."""

    def __init__(self, bundle_ref: list, batch_size: int, device: str) -> None:
        import ray  # noqa: PLC0415  only the Ray Data path loads ray (evaluation stays ray-free)

        # The ref is wrapped in a list so Ray hands it over unresolved; resolve it once here.
        # No progress of its own: a Ray Data batch is one of many (Ray Data shows them).
        self.scorer = BundleScorer(ray.get(bundle_ref[0]), batch_size=batch_size, device=device,
                                   show_progress=False)

    def __call__(self, batch: dict) -> dict:
        is_text = np.asarray(batch["kind"]) == "text"
        texts = [str(t) for t in np.asarray(batch["text"])[is_text]]
        # A row carries either the encoded bytes or a URI the actor reads itself.
        images = [
            load_image(str(uri)) if uri else bytes(data)
            for data, uri in zip(
                np.asarray(batch["image"], dtype=object)[~is_text],
                np.asarray(batch["uri"], dtype=object)[~is_text],
                strict=True,
            )
        ]
        text_features, image_features = (
            self.scorer.encode_texts(texts),
            self.scorer.encode_images(images),
        )
        dim = max(text_features.shape[1], image_features.shape[1])
        features = np.zeros((len(is_text), dim), dtype=np.float32)  # (b, D)
        if texts:
            features[is_text] = text_features
        if images:
            features[~is_text] = image_features
        return {"kind": batch["kind"], "row": batch["row"], "features": features}


def encode_features_with_ray(
    bundle: ClipBundle,
    texts: Sequence[str],
    images: Mapping[str, ImageSource],
    batch_size: int = 64,
    concurrency: int = 1,
    device: str = "cpu",
    num_cpus: float = 1.0,
) -> FeatureTables:
    """encode_features on Ray Data: `concurrency` actors each hold the model (shipped once
    through the object store, so random or fine-tuned weights arrive unchanged). Texts and
    images go through one actor pool in one pass."""
    import ray  # noqa: PLC0415  only the Ray Data path loads ray (evaluation stays ray-free)

    unique_texts = sorted(set(texts))
    image_ids = sorted(images)
    rows = [
        {"kind": "text", "row": k, "text": t, "image": b"", "uri": ""}
        for k, t in enumerate(unique_texts)
    ]
    rows += [
        {
            "kind": "image",
            "row": k,
            "text": "",
            "image": images[i] if isinstance(images[i], bytes) else b"",
            "uri": images[i] if isinstance(images[i], str) else "",
        }
        for k, i in enumerate(image_ids)
    ]
    log.info(
        "encoding %d unique texts and %d images on Ray Data (%d actors)",
        len(unique_texts),
        len(image_ids),
        concurrency,
    )
    text_features = image_features = None
    if rows:
        kwargs = {"bundle_ref": [ray.put(bundle)], "batch_size": batch_size, "device": device}
        # ~4 blocks per actor keeps every actor busy without tiny tasks.
        dataset = ray.data.from_items(
            rows, override_num_blocks=max(1, min(len(rows), 4 * concurrency))
        )
        out = dataset.map_batches(
            _EncodeBatch,
            fn_constructor_kwargs=kwargs,
            batch_size=batch_size,
            concurrency=concurrency,
            num_cpus=num_cpus,
            num_gpus=1 if device.startswith("cuda") else 0,
        )
        for batch in out.iter_batches(batch_size=None, batch_format="numpy"):
            if text_features is None:
                dim = batch["features"].shape[1]
                text_features = np.zeros((len(unique_texts), dim), dtype=np.float32)
                image_features = np.zeros((len(image_ids), dim), dtype=np.float32)
            is_text = batch["kind"] == "text"
            text_features[batch["row"][is_text]] = batch["features"][is_text]
            image_features[batch["row"][~is_text]] = batch["features"][~is_text]
    empty = np.zeros((0, 0), dtype=np.float32)
    return FeatureTables(
        {t: k for k, t in enumerate(unique_texts)},
        text_features if text_features is not None else empty,
        {i: k for k, i in enumerate(image_ids)},
        image_features if image_features is not None else empty,
    )

"""The per-batch work of training's data path, run inside Ray Data tasks (pure, testable
without Ray): decode + transform images, sample text slots (SPEC §3) and tokenize, all on
CPU; workers consume `iter_torch_batches` and normalise the images' uint8 pixels on their
device (csclip.train.prepared.ImageNormalizer).

Every run reads webdataset shards (csclip.train.shards; the world and units tables are
written as shards once, csclip.train.source_shards). A shard task gives rows of uint8
pixels (a shard's `pixels` encoding, decoded once) or decodes the encoded images
(`decode_batch`: decode, transform, tokenize the caption; seeded per (seed, sample, epoch)
with augmentation); `sample_batch` then draws the epoch's text slots and tokenizes them
(and draws each row's image foil among its candidates). `prepare_batch` does both in one
call, for the held-out rows (csclip.train.holdout). What a row gets depends on (seed,
sample_id, epoch) alone, not on its batch or order.
"""

from __future__ import annotations

import hashlib
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from PIL import Image, UnidentifiedImageError

from csclip.config.train import DataConfig, SamplingConfig
from csclip.errors import DataError
from csclip.preprocess import image_normalize, image_pixels, image_transform, tokenizer
from csclip.storage import READ_ATTEMPTS, READ_BACKOFF_S, filesystem_for, read_bytes_retrying
from csclip.train.image_foils import draw_foil_index, draw_image_foil, image_foil_candidates
from csclip.train.sampling import sample_rng, sample_text_columns
from csclip.units import (
    SWAP_NEGATIVES_META,
    record_from_row,
    unit_columns,
)

if TYPE_CHECKING:  # csclip.loss imports torch, which the dataset actors never need
    from csclip.loss import LayoutQuestion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataPlan:
    """What the driver learns about the data before training starts."""

    num_rows: int  # rows that decode
    num_decode_failures: int
    num_epochs: int
    steps_per_epoch: int  # optimizer steps per epoch across all workers
    total_steps: int


# ---------------------------------------------------------------------------------------
# Per-batch functions (run inside Ray Data tasks; pure, testable without Ray)
# ---------------------------------------------------------------------------------------

def _transform(preprocess_key: tuple, is_train: bool = False):
    """PIL image -> (3, H, W) float32 array; open_clip's transform without importing it
    where csclip.preprocess covers the config (a data task then never loads open_clip)."""
    return image_transform(preprocess_key, is_train)


def _augment_seed(seed: int, sample_id: str, epoch: int) -> int:
    digest = hashlib.sha256(f"augment:{seed}:{sample_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _augmented(transform, image, seed: int) -> np.ndarray:
    # torchvision's random transforms draw from torch's global generator; fork it so a
    # sample's crop depends only on (seed, sample_id, epoch), not on what ran before.
    import torch  # noqa: PLC0415  Ray Data's actors unpickle this module and never need torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transform(image)


def _tokenizer(model_name: str):
    return tokenizer(model_name)


def preprocess_key(preprocess_cfg: dict) -> tuple:
    """A hashable form of a ModelSpec.preprocess_cfg (for caching the transform)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in preprocess_cfg.items()))


def read_image_bytes(uri: str, attempts: int = READ_ATTEMPTS,
                     backoff_s: float = READ_BACKOFF_S) -> bytes:
    """The bytes of the image at `uri` (local or s3://, one filesystem client per process).

    Transient errors are retried with exponential backoff (read_bytes_retrying). Raises
    DataError naming the URI when the file does not exist or the read keeps failing: that
    is a broken image root or an unreachable store, not an image that does not decode,
    and must not shrink the data.
    """
    fs, path = filesystem_for(uri)
    try:
        return read_bytes_retrying(fs, path, attempts, backoff_s)
    except DataError as err:  # not found
        raise DataError(f"image {uri} not found ({err}); check the units table's image_path, "
                        "data.image_root (train --image-root) "
                        "or input.image_root") from err
    except OSError as err:
        raise DataError(f"cannot read image {uri}: {attempts} attempts failed, the last "
                        f"with: {err}") from err


def _image_bytes(row: dict) -> bytes | None:
    if row.get("image_bytes") is not None:
        return bytes(row["image_bytes"])
    if row.get("image_path"):
        return read_image_bytes(row["image_path"])
    return None


def decode_image(row: dict):
    """The row's image as an RGB PIL image, or None when the row has no image or its bytes
    do not decode (counted by the check pass and dropped).

    Raises DataError when the image cannot be read (see read_image_bytes).
    """
    data = _image_bytes(row)
    if data is None:
        logger.debug("row %s has neither image_bytes nor image_path", row.get("sample_id"))
        return None
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
        # convert("RGB") of an RGB image is a full-size copy: skipped.
        return image if image.mode == "RGB" else image.convert("RGB")
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError) as err:
        # PIL reports a truncated or corrupt file as OSError; the bytes are already read.
        logger.debug("image of %s does not decode: %s", row.get("sample_id"), err)
        return None


# The columns sampling reads (csclip.train.sampling.sample_text_columns); the decoded rows keep
# only these, the image and the caption's tokens (not the PNG bytes, not the scene JSON).
TEXT_COLUMNS = ("sample_id", "image_id", "caption", "split", "entities", "relations")


def text_rows(batch: pa.Table) -> pa.Table:
    """TEXT_COLUMNS of `batch`, and where it has `meta`, a `meta` holding only the records'
    precomputed shuffles (csclip.units.SWAP_NEGATIVES_META; an empty map for the others)."""
    out = batch.select(list(TEXT_COLUMNS))
    if "meta" not in batch.column_names:
        return out
    kept = [[(key, value) for key, value in (meta or ()) if key == SWAP_NEGATIVES_META]
            for meta in batch.column("meta").to_pylist()]
    return out.append_column("meta", pa.array(kept, type=pa.map_(pa.string(), pa.string())))
CAPTION_TOKENS = "caption_tokens"
LAYOUT_TARGET = "layout_target"  # loss.method layout's targets (decode_batch's `layout`)
# A row's image as the transform's (3, H, W) uint8 pixels before normalisation, one
# fixed-size binary value (a shard's pixels encoding, or decode_batch's with `pixels`).
PIXELS = "pixels"
# A row's candidate image foils (decode_batch's `image_foils`, or a shard's): each row's candidate foils
# (csclip.train.image_foils.image_foil_candidates), transformed once: their uint8 pixels
# (null where a candidate has none), the relation unit each belongs to and the text true
# of it. Each epoch draws one (sample_batch), as the streamed path draws and renders one.
FOIL_CANDIDATE_PIXELS = "image_foil_candidate_pixels"
FOIL_CANDIDATE_UNITS = "image_foil_candidate_units"
FOIL_CANDIDATE_TEXTS = "image_foil_candidate_texts"


IMAGE_SOURCE_COLUMNS = ("sample_id", "image_bytes", "image_path")


def decode_rows(batch: pa.Table) -> list:
    """Each row's decoded RGB image, None where it does not decode."""
    return [decode_image(row) for row in batch.select(
        [c for c in IMAGE_SOURCE_COLUMNS if c in batch.column_names]).to_pylist()]


def decode_batch(batch: pa.Table, *, preprocess: tuple, model_name: str, augment: bool = False,
                 seed: int = 0, epoch: int = 0, decoded: Sequence | None = None,
                 layout: LayoutQuestion | None = None, pixels: bool = False,
                 image_foils: bool = False) -> pa.Table:
    """The image half of preparation: decode + transform each image and tokenize each
    caption. Rows whose image does not decode are dropped (the check pass counted them).
    Without `augment` nothing here depends on the epoch; with it, open_clip's training
    transform is seeded by (seed, sample_id, epoch).

    decoded: the rows' images as decode_rows gives them, when the caller already has them.
    Returns TEXT_COLUMNS plus `image` (fixed-size list of 3*H*W float32: the transformed
    tensor, flattened), or with `pixels` PIXELS instead (the transform's (3, H, W) uint8
    before normalisation, csclip.preprocess.image_pixels: a quarter of the bytes, the
    same tensor once image_normalize has them), and `caption_tokens` (fixed-size list of
    context_length int64);
    with `layout` (loss.method layout) also `layout_target` (each kind's cell, from the
    scene: csclip.train.warm_start.layout_targets); with `image_foils` (and `pixels`) also
    every row's candidate image foils (FOIL_CANDIDATE_*), of which sample_batch draws one.
    """
    if image_foils and not pixels:
        raise ValueError("the cached image foils are uint8 pixels, as the cached images")
    if pixels:
        transform = image_pixels(preprocess, augment)
    else:
        transform = _transform(preprocess, augment)
    tokenize = _tokenizer(model_name)
    decoded = decode_rows(batch) if decoded is None else decoded
    sample_ids = batch.column("sample_id").to_pylist()
    keep, images = [], []
    for index, image in enumerate(decoded):
        if image is not None:
            keep.append(index)
            images.append(
                _augmented(transform, image, _augment_seed(seed, sample_ids[index], epoch))
                if augment else transform(image))
    kept = text_rows(batch).take(pa.array(keep, type=pa.int64()))
    if not keep:
        empty_image = pa.array([], type=pa.binary(int(np.prod(image_shape(dict(preprocess)))))
                               if pixels else pa.list_(pa.float32(), 1))
        empty_tokens = pa.array([], type=pa.list_(pa.int64(), 1))
        return (kept.append_column(PIXELS if pixels else "image", empty_image)
                    .append_column(CAPTION_TOKENS, empty_tokens))
    tokens = tokenize(kept.column("caption").to_pylist()).numpy().astype(np.int64)  # (n, L)
    if pixels:
        kept = kept.append_column(PIXELS, pixel_column(stack_rows(images)))  # (n, 3, H, W) uint8
    else:
        image = stack_rows(images).astype(np.float32, copy=False)           # (n, 3, H, W)
        kept = kept.append_column("image", fixed_size_list(image))
    kept = kept.append_column(CAPTION_TOKENS, fixed_size_list(tokens))
    if layout is None and not image_foils:
        return kept
    rows = batch.take(pa.array(keep, type=pa.int64())).to_pylist()  # the scenes, as records
    if layout is not None:
        from csclip.train.warm_start import layout_targets  # noqa: PLC0415  imports torch, which Ray Data's actors never need

        kept = kept.append_column(LAYOUT_TARGET, fixed_size_list(layout_targets(rows, layout)))
    if image_foils:
        for name, column in _foil_candidates(rows, [decoded[i] for i in keep], transform).items():
            kept = kept.append_column(name, column)
    return kept


def _foil_candidates(rows: list[dict], decoded: Sequence, transform) -> dict[str, pa.Array]:
    """The FOIL_CANDIDATE_* columns of `rows` (decoded: their RGB images): every candidate
    foil rendered and transformed once."""
    pixels, units, texts = [], [], []
    for row, image in zip(rows, decoded, strict=True):
        candidates = image_foil_candidates(record_from_row(row), image)
        pixels.append([transform(c.image).tobytes() if c else None for c in candidates])
        units.append([c.unit if c else None for c in candidates])
        texts.append([c.foil_text if c else None for c in candidates])
    return {FOIL_CANDIDATE_PIXELS: pa.array(pixels, type=pa.list_(pa.binary())),
            FOIL_CANDIDATE_UNITS: pa.array(units, type=pa.list_(pa.string())),
            FOIL_CANDIDATE_TEXTS: pa.array(texts, type=pa.list_(pa.string()))}


def stack_rows(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The arrays stacked along a new first axis, C-contiguous. np.stack keeps its inputs'
    memory order, and the transform's pixels are an (H, W, 3) image transposed to
    (3, H, W): its stack needed a second, transposing copy (np.ascontiguousarray in
    pixel_column, or Ray's tensor column); here each array is copied once, in place."""
    dtype = np.result_type(*{np.asarray(array).dtype for array in arrays})  # a few at most
    out = np.empty((len(arrays), *np.shape(arrays[0])), dtype=dtype)
    for index, array in enumerate(arrays):
        out[index] = array
    return out


def pixel_column(pixels: np.ndarray) -> pa.FixedSizeBinaryArray:
    """(n, 3, H, W) uint8 as a PIXELS column (one fixed-size binary value a row), on the
    array's own buffer (pixel_array reads it back without a copy either)."""
    if pixels.dtype != np.uint8:
        raise ValueError(f"pixels are uint8, not {pixels.dtype}")
    flat = np.ascontiguousarray(pixels).reshape(len(pixels), -1)
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(flat.shape[1]), len(flat),
                                                [None, pa.py_buffer(flat)])


def fixed_size_list(array: np.ndarray) -> pa.FixedSizeListArray:
    """(n, ...) -> one fixed-size list per row (sample_batch reshapes it back). Plain Arrow,
    so the cached blocks need no Ray tensor extension."""
    flat = np.ascontiguousarray(array).reshape(len(array), -1)
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.ravel()), flat.shape[1])


def _unflatten(column: pa.ChunkedArray | pa.Array, shape: Sequence[int]) -> np.ndarray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.flatten().to_numpy().reshape(len(column), *shape)


def sample_batch(batch: pa.Table, *, sampling: dict, model_name: str, seed: int, epoch: int,
                 image_shape: Sequence[int], columns: Sequence[str] | None = None,
                 preprocess: tuple | None = None, normalize: bool = True
                 ) -> dict[str, np.ndarray]:
    """The per-epoch half of preparation, on decode_batch's rows or on rows of uint8
    pixels (a shard's, or decode_batch's: their PIXELS, normalised here by `preprocess`'s
    transform, or with `normalize` False passed on as uint8 for the worker to normalise;
    rows whose image did not decode are dropped): sample the text slots (SPEC §3) for
    `epoch` and tokenize them.

    columns: the token columns to produce (an Objective's `columns`; default: those of
    CS-CLIP); plain CLIP needs only the caption, whose tokens decode_batch made, so it
    samples nothing. image_shape: (3, H, W) of the transformed image.
    Returns image (n, 3, H, W) float32 (uint8 pixels unless `normalize`); each token
    column (n, context_length) int64;
    unit_mask (n,) bool when unit columns are produced; negative_mask (n,) bool (False:
    no caption negative could be built, SPEC §3) when caption_negative is produced;
    the image-foil columns (image_foil_batch's) where `columns` has `image_foil_*`,
    drawn among the rows' candidates (cached_image_foils).
    """
    if PIXELS in batch.column_names and batch.column(PIXELS).null_count:
        batch = batch.filter(batch.column(PIXELS).is_valid())  # a copy: only when needed
    if batch.num_rows == 0:
        return {}
    config = SamplingConfig.model_validate(sampling)
    wanted = list(columns) if columns is not None else [
        "caption", "caption_negative", *unit_columns(config.num_unit_slots)]
    caption_tokens = _unflatten(batch.column(CAPTION_TOKENS), (-1,))
    out: dict[str, np.ndarray] = {"image": _images(batch, image_shape, preprocess)  # (n, 3, H, W)
                                  if normalize or PIXELS not in batch.column_names else
                                  pixel_array(batch.column(PIXELS), image_shape)}
    if LAYOUT_TARGET in batch.column_names:  # loss.method layout: images and targets only
        out[LAYOUT_TARGET] = _unflatten(batch.column(LAYOUT_TARGET), (-1,)).astype(np.int64)
    foil_columns = [name for name in wanted if name.startswith("image_foil_")]
    if foil_columns:  # rows with their candidates (decode_batch's image_foils, a shard's)
        wanted = [name for name in wanted if name not in foil_columns]
        out.update(cached_image_foils(batch, model_name=model_name, seed=seed, epoch=epoch,
                                      image_shape=image_shape,
                                      preprocess=preprocess if normalize else None))
    if not wanted:
        return out
    if wanted == ["caption"]:
        out["caption"] = caption_tokens.astype(np.int64)                   # (n, L)
        return out
    records = [record_from_row(row) for row in text_rows(batch).to_pylist()]
    texts = sample_text_columns(records, config, seed, epoch)
    tokenize = _tokenizer(model_name)
    for name in wanted:
        # The caption is the record's own, tokenized once in decode_batch.
        tokens = caption_tokens if name == "caption" else tokenize(list(texts[name])).numpy()
        out[name] = tokens.astype(np.int64)                                 # (n, L)
    if any(name.startswith("unit_") for name in wanted):
        out["unit_mask"] = np.asarray(texts["unit_mask"], dtype=bool)      # (n,)
    if "caption_negative" in wanted:
        out["negative_mask"] = np.asarray(texts["negative_mask"], dtype=bool)  # (n,)
    return out


def _images(batch: pa.Table, image_shape: Sequence[int], preprocess: tuple | None) -> np.ndarray:
    """The rows' transformed images, (n, 3, H, W) float32."""
    if PIXELS not in batch.column_names:
        return _unflatten(batch.column("image"), image_shape).astype(np.float32, copy=False)
    if preprocess is None:
        raise ValueError("rows of pixels need the preprocess key to normalise them")
    return image_normalize(preprocess)(pixel_array(batch.column(PIXELS), image_shape))


def pixel_array(column: pa.ChunkedArray | pa.Array, image_shape: Sequence[int]) -> np.ndarray:
    """A fixed-size binary column of (3, H, W) uint8 pixels (no nulls) as (n, 3, H, W)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    size = int(np.prod(image_shape))
    data = np.frombuffer(column.buffers()[1], dtype=np.uint8, count=len(column) * size,
                         offset=column.offset * size)
    return data.reshape(len(column), *image_shape)


def cached_image_foils(batch: pa.Table, *, model_name: str, seed: int, epoch: int,
                       image_shape: Sequence[int], preprocess: tuple | None = None
                       ) -> dict[str, np.ndarray]:
    """image_foil_batch's columns for rows with their candidate foils (decode_batch's
    `image_foils`, a shard's): each row's foil drawn among its candidates, rendered and
    transformed once, by the draw image_foil_batch makes on the decoded image, so both
    give the same foils. uint8 pixels, or normalised by `preprocess`."""
    if FOIL_CANDIDATE_PIXELS not in batch.column_names:
        raise ValueError("image foils from rows of pixels need their candidates "
                         "(decode_batch with image_foils)")
    images = pixel_array(batch.column(PIXELS), image_shape)
    drawn = []
    for sample_id, pixels, units, texts in zip(
            batch.column("sample_id").to_pylist(), batch.column(FOIL_CANDIDATE_PIXELS).to_pylist(),
            batch.column(FOIL_CANDIDATE_UNITS).to_pylist(),
            batch.column(FOIL_CANDIDATE_TEXTS).to_pylist(), strict=True):
        pick = (draw_foil_index(len(pixels), sample_rng(seed, f"{sample_id}/image-foil", epoch))
                if pixels else None)
        drawn.append(None if pick is None or pixels[pick] is None else
                     (np.frombuffer(pixels[pick], dtype=np.uint8).reshape(image_shape),
                      units[pick], texts[pick]))
    out = _image_foil_output(drawn, images, batch.column("caption").to_pylist(), model_name)
    if preprocess is not None:
        out["image_foil"] = image_normalize(preprocess)(out["image_foil"])
    return out


def image_shape(preprocess_cfg: dict) -> tuple[int, int, int]:
    """(3, H, W) of the transformed image for a ModelSpec.preprocess_cfg."""
    size = preprocess_cfg["size"]
    height, width = (size, size) if isinstance(size, int) else tuple(size)
    return 3, int(height), int(width)


def prepare_batch(batch: pa.Table, *, sampling: dict, preprocess: tuple, model_name: str,
                  seed: int, epoch: int, columns: Sequence[str] | None = None,
                  augment: bool = False, layout: LayoutQuestion | None = None,
                  normalize: bool = True) -> dict[str, np.ndarray]:
    """The held-out rows' preparation (csclip.train.holdout): decode_batch then
    sample_batch, in one task. Without augment, the same outputs as a shard of pixels, row
    for row; augment: open_clip's training transform, seeded by (seed, sample_id, epoch).
    With `image_foil_*` columns (loss.image_foils) also each sample's image foil
    (image_foil_batch), which needs the decoded image and the scene, hence this path.
    normalize False: `image` (and `image_foil`) are the transform's (n, 3, H, W) uint8
    pixels, which the worker normalises (csclip.train.prepared.ImageNormalizer) to the
    float32 tensors this gives otherwise, bit for bit: a quarter of the bytes through
    Arrow, the object store and iter_torch_batches (the epochs ship these)."""
    foil_columns = [c for c in columns or () if c.startswith("image_foil_")]
    decoded = decode_rows(batch)  # once: the foils need the decoded images too
    rows = decode_batch(batch, preprocess=preprocess, model_name=model_name, augment=augment,
                        seed=seed, epoch=epoch, decoded=decoded, layout=layout,
                        pixels=not normalize)
    out = sample_batch(rows, sampling=sampling, model_name=model_name, seed=seed, epoch=epoch,
                       image_shape=image_shape(dict(preprocess)),
                       columns=None if columns is None else
                       [c for c in columns if c not in foil_columns],
                       preprocess=preprocess, normalize=normalize)
    if foil_columns and out:
        out.update(image_foil_batch(batch, decoded, out["image"], preprocess=preprocess,
                                    model_name=model_name, seed=seed, epoch=epoch,
                                    pixels=not normalize))
    return out


def image_foil_batch(batch: pa.Table, decoded: Sequence, images: np.ndarray, *,
                     preprocess: tuple, model_name: str, seed: int, epoch: int,
                     pixels: bool = False) -> dict[str, np.ndarray]:
    """The image-foil columns of `batch`'s decodable rows (the rows, in order, of
    decode_batch), each sample's foil drawn per (seed, sample, epoch)
    (csclip.train.image_foils) and transformed like its image. decoded:
    decode_rows(batch); images: the kept rows' transformed images (with `pixels` their
    uint8 pixels, and the foils' are pixels too)."""
    if pixels:
        transform = image_pixels(preprocess)
    else:
        transform = _transform(preprocess)
    records = [record_from_row(row)
               for row, image in zip(batch.to_pylist(), decoded, strict=True) if image is not None]
    drawn = []
    for record, image in zip(records, (i for i in decoded if i is not None), strict=True):
        foil = draw_image_foil(record, image, sample_rng(seed, f"{record.sample_id}/image-foil",
                                                         epoch))
        drawn.append((transform(foil.image), foil.unit, foil.foil_text) if foil else None)
    return _image_foil_output(drawn, images, [r.caption for r in records], model_name)


def _image_foil_output(drawn: Sequence[tuple[np.ndarray, str, str] | None], images: np.ndarray,
                       captions: Sequence[str], model_name: str) -> dict[str, np.ndarray]:
    """The image-foil columns from each row's drawn foil (its transformed image, its
    relation unit, the text true of it) or None: `image_foil` (n, 3, H, W) (uint8 pixels
    or float32, as `images`), `image_foil_unit` and `image_foil_text` tokens (n, L),
    `image_foil_mask` (n,). A row without a foil gets its own image and caption as
    placeholders, masked out of the loss."""
    foil_images = stack_rows([foil[0] if foil else image for foil, image in
                              zip(drawn, images, strict=True)])              # (n, 3, H, W)
    if foil_images.dtype != np.uint8:
        foil_images = foil_images.astype(np.float32)
    tokenize = _tokenizer(model_name)
    units = [foil[1] if foil else caption for foil, caption in zip(drawn, captions, strict=True)]
    texts = [foil[2] if foil else caption for foil, caption in zip(drawn, captions, strict=True)]
    return {"image_foil": foil_images,
            "image_foil_unit": tokenize(units).numpy().astype(np.int64),          # (n, L)
            "image_foil_text": tokenize(texts).numpy().astype(np.int64),          # (n, L)
            "image_foil_mask": np.asarray([foil is not None for foil in drawn], dtype=bool)}


# ---------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------

def plan_steps(num_rows: int, num_read: int, data: DataConfig, num_workers: int, epochs: int,
               max_steps: int | None) -> DataPlan:
    """Epochs and steps of `num_rows` usable rows (of `num_read`; 0: not known).

    Each epoch is split equally over the workers and each worker drops its last partial
    batch, so an epoch has num_rows // (batch_size * num_workers) steps on every worker
    (num_rows // batch_size with data.batch_scope "global").
    With max_steps the plan holds enough epochs for max_steps; otherwise `epochs`.
    Raises DataError when the data is smaller than one global batch.
    """
    global_batch = data.batch_size * (1 if data.batch_scope == "global" else num_workers)
    if num_rows < global_batch:
        of = f" (of {num_read})" if num_read else ""
        raise DataError(f"{num_rows} usable rows{of} is less than one global "
                        f"batch ({global_batch} rows); lower data.batch_size or add data")
    # (num_rows // num_workers) // batch_size: a worker's rows of the equal split, in
    # whole batches.
    steps_per_epoch = num_rows // global_batch
    if max_steps is not None:
        num_epochs, total_steps = math.ceil(max_steps / steps_per_epoch), max_steps
    else:
        num_epochs, total_steps = epochs, epochs * steps_per_epoch
    return DataPlan(num_rows, 0, num_epochs, steps_per_epoch, total_steps)


def deterministic(dataset):
    """`dataset` with Ray Data's preserve_order on, for it and every dataset derived from
    it (a Dataset keeps the DataContext of its creation; derived ones share it).

    Without it the blocks of a map, a materialize or a union come out in the order their
    tasks finish, and the batches a worker sees differ from run to run (and from a
    killed run to its resumption). It costs the overlap of out-of-order tasks: see
    docs/training.md ("Resume").
    """
    dataset.context.execution_options.preserve_order = True
    return dataset


def local_shuffle_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of a worker's local shuffle buffer in one epoch."""
    digest = hashlib.sha256(f"local-shuffle:{seed}:{epoch}:{rank}".encode()).digest()
    return int.from_bytes(digest[:4], "little")

"""What a training sample holds in shards of pixels besides its caption: the eval
transform's uint8 pixels (`{key}.pixels.npy`) and, where the objective draws image foils,
every candidate foil rendered and transformed once (`{key}.foils.npy`, `{key}.foils.json`).
Written by csclip.train.source_shards, read by csclip.train.shards' tasks: rows of
csclip.train.stream's layout (PIXELS, CAPTION_TOKENS, FOIL_CANDIDATE_*), from which
sample_batch draws each epoch's text slots and image foil, as decoding would."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
from PIL import Image

from csclip.errors import DataError
from csclip.preprocess import tokenizer
from csclip.shards import PIXELS_SUFFIX
from csclip.train.image_foils import image_foil_candidates
from csclip.train.stream import (
    CAPTION_TOKENS,
    FOIL_CANDIDATE_PIXELS,
    FOIL_CANDIDATE_TEXTS,
    FOIL_CANDIDATE_UNITS,
    PIXELS,
    fixed_size_list,
    image_shape,
    pixel_column,
    text_rows,
)
from csclip.units import UnitsRecord

__all__ = ["FOILS_META_SUFFIX", "FOILS_SUFFIX", "FOIL_MEMBERS", "foil_candidate_columns",
           "foil_candidate_members", "pixel_rows"]

# A sample's image-foil candidates in shards of pixels (foil_candidate_members).
FOILS_SUFFIX = "foils.npy"
FOILS_META_SUFFIX = "foils.json"
FOIL_MEMBERS = (FOILS_SUFFIX, FOILS_META_SUFFIX)


def _pixels(key: str, data: bytes, shape: tuple[int, int, int], uri: str) -> np.ndarray:
    try:
        array = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError) as err:
        raise DataError(f"shard {uri}: {key}.{PIXELS_SUFFIX} is not a .npy array ({err})") from err
    if array.dtype != np.uint8 or array.shape != shape:
        raise DataError(f"shard {uri}: {key}.{PIXELS_SUFFIX} is {array.dtype} {array.shape}, "
                        f"and this model's transform gives uint8 {shape}: write the shards "
                        "again with this model (csclip shards --encoding pixels --model ...)")
    return array


def foil_candidate_members(record: UnitsRecord, image: Image.Image,
                           transform: Callable[[Image.Image], np.ndarray],
                           shape: tuple[int, int, int]) -> dict[str, bytes]:
    """A sample's image-foil candidates (csclip.train.image_foils.image_foil_candidates of
    its record and decoded RGB image) as shard members, each transformed as its image is:
    FOILS_SUFFIX, their (k, 3, H, W) uint8 pixels (zeros where a unit has no foil), and
    FOILS_META_SUFFIX, each one's relation unit and the text true of it (null where none).
    Each epoch draws one (csclip.train.stream.cached_image_foils), as decoding would."""
    candidates = image_foil_candidates(record, image)
    pixels = np.zeros((len(candidates), *shape), dtype=np.uint8)
    for index, candidate in enumerate(candidates):
        if candidate is not None:
            pixels[index] = transform(candidate.image)
    buffer = io.BytesIO()
    np.save(buffer, pixels, allow_pickle=False)
    meta = {"units": [c.unit if c else None for c in candidates],
            "texts": [c.foil_text if c else None for c in candidates]}
    return {FOILS_SUFFIX: buffer.getvalue(), FOILS_META_SUFFIX: json.dumps(meta).encode()}


def foil_candidate_columns(members: Sequence[dict[str, bytes]], shape: tuple[int, int, int],
                           uri: str) -> dict[str, pa.Array]:
    """The FOIL_CANDIDATE_* columns (csclip.train.stream.decode_batch's) of samples whose
    members foil_candidate_members wrote."""
    pixels, units, texts = [], [], []
    for found in members:
        if FOILS_SUFFIX not in found or FOILS_META_SUFFIX not in found:
            raise DataError(f"shard {uri} holds no image-foil candidates ({FOILS_SUFFIX}); "
                            "loss.image_foil_weight needs shards written with them (a units "
                            "table's or the world's, csclip.train.source_shards) or with "
                            "encoded images (csclip shards --encoding original)")
        array = np.load(io.BytesIO(found[FOILS_SUFFIX]), allow_pickle=False)
        meta = json.loads(found[FOILS_META_SUFFIX])
        if array.dtype != np.uint8 or array.shape[1:] != shape or len(array) != len(meta["units"]):
            raise DataError(f"shard {uri}: {FOILS_SUFFIX} is {array.dtype} {array.shape}, not "
                            f"{len(meta['units'])} uint8 foils of {shape}")
        pixels.append([a.tobytes() if unit is not None else None
                       for a, unit in zip(array, meta["units"], strict=True)])
        units.append(meta["units"])
        texts.append(meta["texts"])
    return {FOIL_CANDIDATE_PIXELS: pa.array(pixels, type=pa.list_(pa.binary())),
            FOIL_CANDIDATE_UNITS: pa.array(units, type=pa.list_(pa.string())),
            FOIL_CANDIDATE_TEXTS: pa.array(texts, type=pa.list_(pa.string()))}


def pixel_rows(rows: pa.Table, arrays: Sequence[bytes], preprocess: tuple, model_name: str,
                uri: str) -> pa.Table:
    """`rows` (units columns) with their images' uint8 pixels (the `.pixels.npy` members'
    bytes, `arrays`) and their captions' tokens: the rows sample_batch reads."""
    shape = image_shape(dict(preprocess))
    ids = rows.column("sample_id").to_pylist()
    pixels = np.stack([_pixels(key, data, shape, uri) for key, data in zip(ids, arrays,
                                                                          strict=True)])
    tokens = tokenizer(model_name)(rows.column("caption").to_pylist()).numpy()
    return (text_rows(rows).append_column(PIXELS, pixel_column(pixels))
            .append_column(CAPTION_TOKENS, fixed_size_list(tokens.astype(np.int64))))

"""Ray Data preprocessing for training: read units (the synthetic world or a units table),
decode + transform images, sample text slots (SPEC §3) and tokenize, all on CPU in Ray
Data; workers only consume `iter_torch_batches`.

Slot sampling depends on the epoch, so the training stream is the union of one
`map_batches` per epoch (each with its own `epoch` argument) over the same source.
Images that fail to decode are counted by a check pass before training and dropped from
the stream with their ids logged: never a crash, never a silent loss.
"""

from __future__ import annotations

import functools
import hashlib
import io
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pydantic import Field

from csclip.config import StrictModel
from csclip.errors import ConfigError, DataError
from csclip.loss import Objective, unit_columns
from csclip.sampling import SamplingConfig, sample_text_columns
from csclip.units import UnitsRecord, record_from_row
from csclip.world.config import WorldConfig

logger = logging.getLogger(__name__)


class DataConfig(StrictModel):
    """The `data` section of a training config."""

    world: WorldConfig = WorldConfig()
    # A units table (Parquet, local or s3://) with image_bytes or image_path; None trains
    # on the synthetic world generated from `world`.
    units_uri: str | None = None
    split: str = "train"
    batch_size: int = Field(32, ge=1)  # per worker
    shuffle_buffer: int = Field(512, ge=0)  # local shuffle buffer rows; 0 = no shuffle
    # open_clip's training transform (RandomResizedCrop, scale 0.9-1) instead of the eval
    # transform. The paper trains with the eval transform, hence off; seeded per sample.
    augment: bool = False
    # Worker-side feed (Ray Data iter_torch_batches): batches prepared ahead of the step
    # in a background thread, and page-locked host memory for the copy to the GPU (used
    # only when the worker has a CUDA device).
    prefetch_batches: int = Field(2, ge=0)
    pin_memory: bool = True


@dataclass(frozen=True)
class DataPlan:
    """What the driver learns about the data before training starts."""

    num_rows: int  # rows that decode
    num_decode_failures: int
    failed_ids: tuple[str, ...]  # the first few, for the log
    num_epochs: int
    steps_per_epoch: int  # optimizer steps per epoch across all workers
    total_steps: int


def source_dataset(data: DataConfig):
    """The units rows to train on, as a Ray Dataset in UNITS_SCHEMA."""
    import ray.data

    if data.units_uri is None:
        from csclip.world.ray_source import world_dataset

        return world_dataset(data.world, data.split)
    from csclip.storage import filesystem_for

    fs, path = filesystem_for(data.units_uri)
    try:
        ds = ray.data.read_parquet(path, filesystem=fs)
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"data.units_uri: cannot read {data.units_uri} ({err}); "
                        "point it at a units Parquet file or directory") from err
    split = data.split
    return ds.filter(lambda row: row["split"] == split)


def load_split(units_uri: str | None, split: str, world: WorldConfig) -> list[UnitsRecord]:
    """The records of one split: read from a units table (local or s3://; only that
    split's rows are read) or, when units_uri is None, generated from the synthetic world.

    Evaluation, the ablation's trials and the demo all load their validation split here.
    Raises ConfigError for a split the world does not have, DataError for a missing table
    or an empty split (naming the splits that are present).
    """
    if units_uri is None:
        from csclip.world import iter_world

        if split not in ("train", "val", "test"):
            raise ConfigError(f"split {split!r}: the synthetic world has train, val, test")
        records = list(iter_world(world, splits=(split,)))
        if not records:
            raise DataError(f"the synthetic world (seed {world.seed}) has no records in split {split!r}; "
                            f"raise data.world.num_{split}")
        return records
    import pyarrow.parquet as pq

    from csclip.storage import filesystem_for
    from csclip.units import UNITS_SCHEMA, table_to_records

    fs, path = filesystem_for(units_uri)
    try:
        table = pq.read_table(path, filesystem=fs, schema=UNITS_SCHEMA,
                              filters=[("split", "=", split)])
    except (FileNotFoundError, OSError) as err:
        raise DataError(f"units table not found or unreadable: {units_uri} ({err})") from err
    if table.num_rows == 0:
        present = sorted(set(pq.read_table(path, filesystem=fs, columns=["split"])
                             .column("split").to_pylist()))
        raise DataError(f"{units_uri}: no records in split {split!r} (splits present: "
                        f"{present or 'none'}); set the split or add data")
    return table_to_records(table)


# ---------------------------------------------------------------------------------------
# Per-batch functions (run inside Ray Data tasks; pure, testable without Ray)
# ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=8)
def _transform(preprocess_key: tuple, is_train: bool = False):
    from open_clip.transform import PreprocessCfg, image_transform_v2

    cfg = dict(preprocess_key)
    cfg = {k: tuple(v) if isinstance(v, list) else v for k, v in cfg.items()}
    return image_transform_v2(PreprocessCfg(**cfg), is_train=is_train)


def _augment_seed(seed: int, sample_id: str, epoch: int) -> int:
    digest = hashlib.sha256(f"augment:{seed}:{sample_id}:{epoch}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _augmented(transform, image, seed: int) -> np.ndarray:
    # torchvision's random transforms draw from torch's global generator; fork it so a
    # sample's crop depends only on (seed, sample_id, epoch), not on what ran before.
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return transform(image).numpy()


@functools.lru_cache(maxsize=4)
def _tokenizer(model_name: str):
    import open_clip

    from csclip.model import register_small_models

    register_small_models()
    return open_clip.get_tokenizer(model_name)


def preprocess_key(preprocess_cfg: dict) -> tuple:
    """A hashable form of a ModelSpec.preprocess_cfg (for caching the transform)."""
    return tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                        for k, v in preprocess_cfg.items()))


def _image_bytes(row: dict) -> bytes:
    if row.get("image_bytes") is not None:
        return bytes(row["image_bytes"])
    if row.get("image_path"):
        from csclip.storage import filesystem_for, read_bytes

        fs, path = filesystem_for(row["image_path"])
        return read_bytes(fs, path)
    raise DataError(f"row {row.get('sample_id')} has neither image_bytes nor image_path")


def decode_image(row: dict):
    """The row's image as an RGB PIL image, or None when it cannot be read or decoded."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(_image_bytes(row)))
        image.load()
        return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, DataError) as err:
        logger.debug("image of %s does not decode: %s", row.get("sample_id"), err)
        return None


def image_status(batch: pa.Table) -> dict[str, np.ndarray]:
    """Map function of the check pass: which rows decode."""
    rows = batch.to_pylist()
    ok = [decode_image(row) is not None for row in rows]
    return {"sample_id": np.array([r["sample_id"] for r in rows], dtype=object),
            "ok": np.array(ok, dtype=bool)}


def prepare_batch(batch: pa.Table, *, sampling: dict, preprocess: tuple, model_name: str,
                  seed: int, epoch: int, columns: Sequence[str] | None = None,
                  augment: bool = False) -> dict[str, np.ndarray]:
    """Map function of the training stream: decode + transform images, sample slots
    (SPEC §3) for `epoch`, tokenize. Rows whose image does not decode are dropped (the
    check pass counted them).

    columns: the token columns to produce (an Objective's `columns`; default: those of
    CS-CLIP); plain CLIP needs only the caption, so it skips slot sampling.
    augment: open_clip's training transform, seeded by (seed, sample_id, epoch), instead
    of the eval transform.
    Returns image (n, 3, H, W) float32; each token column (n, context_length) int64;
    unit_mask (n,) bool when unit columns are produced; negative_mask (n,) bool (False:
    no caption negative could be built, SPEC §3) when caption_negative is produced.
    """
    transform, tokenize = _transform(preprocess, augment), _tokenizer(model_name)
    wants_foils = columns is not None and "image_foil_unit" in columns
    records, images, decoded = [], [], []
    for row in batch.to_pylist():
        image = decode_image(row)
        if image is None:
            continue
        record = record_from_row(row)
        records.append(record)
        images.append(_augmented(transform, image, _augment_seed(seed, record.sample_id, epoch))
                      if augment else transform(image).numpy())
        decoded.append(image if wants_foils else None)
    out: dict[str, np.ndarray] = {}
    if not records:
        return out
    config = SamplingConfig.model_validate(sampling)
    wanted = list(columns) if columns is not None else [
        "caption", "caption_negative", *unit_columns(config.num_unit_slots)]
    sampled = [name for name in wanted if not name.startswith("image_foil_")]
    if sampled == ["caption"]:
        texts: dict[str, list] = {"caption": [r.caption for r in records]}
    else:
        texts = sample_text_columns(records, config, seed, epoch)
    out["image"] = np.stack(images).astype(np.float32)                   # (n, 3, H, W)
    for name in sampled:
        out[name] = tokenize(list(texts[name])).numpy().astype(np.int64)   # (n, L)
    if "unit_mask" in texts and any(name.startswith("unit_") for name in wanted):
        out["unit_mask"] = np.asarray(texts["unit_mask"], dtype=bool)      # (n,)
    if "caption_negative" in wanted:
        out["negative_mask"] = np.asarray(texts["negative_mask"], dtype=bool)  # (n,)
    if wants_foils:
        foils = image_foil_columns(records, decoded, out["image"], transform, seed, epoch)
        out["image_foil"] = foils["image_foil"]                                  # (n, 3, H, W)
        out["image_foil_mask"] = foils["image_foil_mask"]                        # (n,)
        for name in ("image_foil_unit", "image_foil_text"):
            out[name] = tokenize(foils[name]).numpy().astype(np.int64)       # (n, L)
    return out


def image_foil_columns(records: Sequence[UnitsRecord], decoded: Sequence, images: np.ndarray,
                       transform, seed: int, epoch: int) -> dict:
    """Each sample's image foil (csclip.image_foils), drawn per (seed, sample, epoch):
    `image_foil` (n, 3, H, W) transformed like the image, `image_foil_unit` (the relation
    unit's text), `image_foil_text` (the text true of the foil) and `image_foil_mask` (n,)
    bool. A sample without a foil gets its own image and caption as placeholders, masked
    out of the loss."""
    from csclip.image_foils import draw_image_foil
    from csclip.sampling import sample_rng

    foil_images, units, foil_texts, mask = [], [], [], []
    for record, image, transformed in zip(records, decoded, images, strict=True):
        foil = draw_image_foil(record, image, sample_rng(seed, f"{record.sample_id}/image-foil",
                                                         epoch))
        foil_images.append(transform(foil.image).numpy() if foil else transformed)
        units.append(foil.unit if foil else record.caption)
        foil_texts.append(foil.foil_text if foil else record.caption)
        mask.append(foil is not None)
    return {"image_foil": np.stack(foil_images).astype(np.float32), "image_foil_unit": units,
            "image_foil_text": foil_texts, "image_foil_mask": np.asarray(mask, dtype=bool)}


# ---------------------------------------------------------------------------------------
# Driver side
# ---------------------------------------------------------------------------------------

def plan_data(source, data: DataConfig, num_workers: int, epochs: int,
              max_steps: int | None, max_listed_failures: int = 20) -> DataPlan:
    """Run the check pass over `source` and work out epochs and steps.

    With max_steps the stream holds enough epochs for max_steps; otherwise `epochs`.
    Raises DataError when nothing decodes or the data is smaller than one global batch.
    """
    status = source.map_batches(image_status, batch_format="pyarrow").to_pandas()
    failed = status.loc[~status["ok"].astype(bool), "sample_id"].astype(str).tolist()
    num_rows = len(status) - len(failed)
    if failed:
        logger.warning("%d of %d images do not decode and are skipped: %s%s", len(failed),
                       len(status), failed[:max_listed_failures],
                       " ..." if len(failed) > max_listed_failures else "")
    global_batch = data.batch_size * num_workers
    if num_rows < global_batch:
        raise DataError(f"{num_rows} usable rows (of {len(status)}) is less than one global "
                        f"batch ({data.batch_size} x {num_workers} workers); lower "
                        "data.batch_size or add data")
    steps_per_epoch = num_rows // global_batch
    if max_steps is not None:
        # Streaming split may drop up to num_workers - 1 rows to keep shards equal.
        num_epochs = math.ceil((max_steps * global_batch + num_workers) / num_rows)
        total_steps = max_steps
    else:
        num_epochs = epochs
        total_steps = (epochs * num_rows - num_workers + 1) // global_batch
    return DataPlan(num_rows, len(failed), tuple(failed[:max_listed_failures]), num_epochs,
                    steps_per_epoch, total_steps)


def training_stream(source, *, sampling: SamplingConfig, preprocess_cfg: dict,
                    model_name: str, seed: int, num_epochs: int, objective: Objective,
                    augment: bool = False, rows_per_block: int = 128):
    """The union over epochs of `source` prepared for training (see prepare_batch),
    with the token columns `objective` needs."""
    columns = list(objective.columns)
    epochs: Sequence = [
        source.map_batches(
            prepare_batch, batch_format="pyarrow", batch_size=rows_per_block,
            fn_kwargs={"sampling": sampling.model_dump(mode="json"),
                       "preprocess": preprocess_key(preprocess_cfg),
                       "model_name": model_name, "seed": seed, "epoch": epoch,
                       "columns": columns, "augment": augment})
        for epoch in range(num_epochs)
    ]
    return epochs[0].union(*epochs[1:]) if len(epochs) > 1 else epochs[0]

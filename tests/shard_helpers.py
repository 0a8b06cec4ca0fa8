"""Webdataset shards of the synthetic world for the training tests, with a units output
laid out as `csclip extract --format webdataset` writes it (units/{stem}.parquet,
_done/{stem}.json, _complete.json). Written here with the webdataset package's TarWriter
(the outside writer), so the tests do not depend on csclip's own shard writer."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import webdataset as wds
from PIL import Image

from csclip.config.world import WorldConfig
from csclip.preprocess import image_pixels
from csclip.train.stream import preprocess_key
from csclip.units import EXTRACTION_COMPLETE, EXTRACTION_DONE_DIR, records_to_table
from csclip.world import iter_world


def write_world_shards(root: Path, world: WorldConfig, num_shards: int, *, seed: int = 0,
                       split: str = "train", pixels_cfg: dict | None = None
                       ) -> tuple[str, str]:
    """(shard pattern, units output) of the world's `split` in `num_shards` shards, the
    samples permuted once by `seed`. pixels_cfg: a model's preprocess_cfg, to store each
    image as the transform's uint8 pixels (`{key}.pixels.npy`) instead of its PNG."""
    records = [r for r in iter_world(world, splits=(split,))]
    random.Random(seed).shuffle(records)
    shards, units = root / "shards", root / "units_out"
    shards.mkdir(parents=True)
    (units / "units").mkdir(parents=True)
    (units / EXTRACTION_DONE_DIR).mkdir()
    transform = image_pixels(preprocess_key(pixels_cfg)) if pixels_cfg else None
    per_shard = -(-len(records) // num_shards)
    for index in range(num_shards):
        part = records[index * per_shard:(index + 1) * per_shard]
        stem = f"{index:05d}"
        with wds.TarWriter(str(shards / f"{stem}.tar")) as sink:
            for record in part:
                sample = {"__key__": record.sample_id, "txt": record.caption,
                          "json": {"sample_id": record.sample_id, "image_id": record.image_id,
                                   "split": record.split}}
                if transform is None:
                    sample["png"] = record.image_bytes
                else:
                    image = Image.open(io.BytesIO(record.image_bytes)).convert("RGB")
                    buffer = io.BytesIO()
                    np.save(buffer, np.ascontiguousarray(transform(image)), allow_pickle=False)
                    sample["pixels.npy"] = buffer.getvalue()
                sink.write(sample)
        table = records_to_table(part).drop_columns(["image_bytes"])
        pq.write_table(table, units / "units" / f"{stem}.parquet")
        (units / EXTRACTION_DONE_DIR / f"{stem}.json").write_text(json.dumps(
            {"shard": stem, "read": len(part), "with_units": len(part), "rejected": 0}))
    (units / EXTRACTION_COMPLETE).write_text("{}")
    return f"{shards}/{{00000..{num_shards - 1:05d}}}.tar", str(units)

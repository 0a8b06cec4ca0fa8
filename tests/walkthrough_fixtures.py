"""Data in the shapes docs/cluster.md's walk-through reads, small enough for a CPU
rehearsal: a COCO Karpathy split file with its images (synthetic-world scenes saved as
JPEGs under COCO's file names, one world caption per image), and a NegCLIP-format
checkpoint of csclip-tiny (the format tests/test_negclip_checkpoint.py pins)."""

from __future__ import annotations

import io
import json
from pathlib import Path

# Karpathy splits of the rehearsal's COCO: restval is read as train (as every CLIP
# fine-tuning recipe reads it), val feeds the half-truth benchmark, test is retrieval's.
SPLIT_SIZES: dict[str, int] = {"train": 24, "restval": 8, "val": 12, "test": 6}


def write_coco_karpathy(root: Path, image_size: int = 32, seed: int = 0) -> Path:
    """root/dataset_coco.json and root/images/{train2014,val2014}/COCO_*_<id>.jpg, as the
    walk-through's step 1 puts them on S3; returns the split file's path."""
    from PIL import Image

    from csclip.config.world import WorldConfig
    from csclip.world.generate import world_record

    config = WorldConfig(seed=seed, image_size=image_size)
    images, cocoid, sentid = [], 0, 0
    for split, count in SPLIT_SIZES.items():
        folder = "val2014" if split in ("val", "test") else "train2014"
        world_split = "train" if split in ("train", "restval") else "val"
        for index in range(count):
            offset = SPLIT_SIZES["train"] if split == "restval" else 0
            offset += SPLIT_SIZES["val"] if split == "test" else 0
            record = world_record(config, world_split, index + offset)
            name = f"COCO_{folder}_{cocoid:012d}.jpg"
            path = root / "images" / folder / name
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.open(io.BytesIO(record.image_bytes)).convert("RGB").save(path, quality=95)
            images.append({"filepath": folder, "filename": name, "cocoid": cocoid,
                           "imgid": cocoid, "split": split,
                           "sentences": [{"raw": record.caption, "sentid": sentid,
                                          "tokens": record.caption.lower().split()}]})
            cocoid += 1
            sentid += 1
    split_file = root / "dataset_coco.json"
    split_file.write_text(json.dumps({"images": images, "dataset": "coco"}))
    return split_file


def write_negclip_checkpoint(path: Path, seed: int = 3) -> Path:
    """csclip-tiny's random weights saved as NegCLIP's released file is saved: an
    open_clip training checkpoint, DDP's `module.` prefix, a numpy learning rate."""
    import numpy as np
    import torch

    from csclip.model import create_bundle

    torch.manual_seed(seed)
    model = create_bundle("csclip-tiny", image_size=32).model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for group in optimizer.param_groups:
        group["lr"] = np.float64(5e-7)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"epoch": 5, "name": "negclip-tiny",
                "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
                "optimizer": optimizer.state_dict()}, path)
    return path


def complete_suites(data_root: Path, names: tuple[str, ...], limit: int = 40) -> list[str]:
    """Write the images tests/fixtures/suites leaves out on purpose (its readers' "missing
    image" cases) into a copy at `data_root`, so every named suite is complete as a
    published download is; returns the paths written."""
    import re

    from PIL import Image

    from csclip.config.eval import SuitesConfig
    from csclip.errors import DataError
    from csclip.eval.suites import find_named_suites

    config = SuitesConfig(names=names, data_root=str(data_root))
    written: list[str] = []
    for _ in range(limit):
        try:
            find_named_suites(config, refuse_missing=True)
            return written
        except DataError as error:
            found = re.search(r"e\.g\. (?P<path>.+?)\);", str(error))
            if found is None:
                raise
            path = Path(found.group("path"))
            if not path.is_relative_to(data_root):  # a file's absolute path (NegBench's
                # CSVs): its last folder and file under the suite, as its reader looks
                path = data_root / str(error).split(":", 1)[0] / path.parent.name / path.name
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (8, 8), (128, 128, 128)).save(path)
            written.append(str(path))
    raise AssertionError(f"suites under {data_root} still incomplete after {written}")

"""`--out-format authors` writes entries their code reads as it reads its own: sample ids
`coco_<image>_<sentence>` (kargibora/CS-CLIP unit_pipeline/main.py:104@cc17cf9) and image
paths image root / filepath / filename (main.py:95), read here with their loaders' rules."""

from __future__ import annotations

import json
import posixpath
import re

import pyarrow.fs as pafs

from csclip.config.extract import InputConfig
from csclip.extract.answers import authors_file
from csclip.extract.captions import iter_karpathy

KARPATHY = {"images": [
    {"filepath": "train2014", "filename": "COCO_train2014_000000000009.jpg", "imgid": 0,
     "cocoid": 9, "split": "train",
     "sentences": [{"sentid": 0, "raw": "A plate of food."}, {"sentid": 1, "raw": "Food on a plate."}]},
    {"filepath": "val2014", "filename": "COCO_val2014_000000000042.jpg", "imgid": 1,
     "cocoid": 42, "split": "restval",
     "sentences": [{"sentid": 2, "raw": "A dog on a couch."}, {"sentid": 3, "raw": "A brown dog."}]},
]}


def _their_base_image_id(sample_id: str) -> str:
    # half_truth_vulnerability.py@2325a1c: one sample per image, the image being this.
    return sample_id.rsplit("_", 1)[0]


def test_authors_file_has_their_sample_ids_and_image_paths(tmp_path):
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(KARPATHY))
    rows = list(iter_karpathy(pafs.LocalFileSystem(), str(path),
                              InputConfig(format="karpathy", uri=str(path), image_root="/data/coco")))
    # The entry as authors_prompts.derive writes it: the row's sample_id and image_path.
    results = [{"authors_json": json.dumps({"sample_id": r["sample_id"], "original_caption": r["caption"],
                                            "entities": ["food"], "negative_entities": {},
                                            "image_path": r["image_path"], "relations": []})}
               for r in rows]
    entries = json.loads(authors_file(results))
    assert all(re.fullmatch(r"coco_\d+_\d+", e["sample_id"]) for e in entries)
    assert [e["sample_id"].rsplit("_", 1)[1] for e in entries] == ["0", "1", "2", "3"]  # sentid
    images = [_their_base_image_id(e["sample_id"]) for e in entries]
    assert images[0] == images[1] != images[2] == images[3]  # one image, two captions each
    their_paths = [posixpath.join("/data/coco", i["filepath"], i["filename"])
                   for i in KARPATHY["images"] for _ in i["sentences"]]
    assert [e["image_path"] for e in entries] == their_paths
    # Their COCODataset(subset_name="train") keeps an entry when "train" is in its path.
    assert ["train" in e["image_path"].lower() for e in entries] == [True, True, False, False]


def test_ids_of_other_sources_are_kept():
    results = [{"authors_json": json.dumps({"sample_id": "world-7", "image_path": None})}]
    assert json.loads(authors_file(results))[0]["sample_id"] == "world-7"

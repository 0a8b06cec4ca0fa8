"""Karpathy split files (dataset_coco.json, dataset_flickr30k.json): one caption per
entry with its image and split. Extraction reads them as caption input and evaluation as
retrieval test sets, so the reader lives in the library, below both."""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow.fs as pafs

from csclip.errors import DataError
from csclip.storage import read_bytes


@dataclass(frozen=True)
class KarpathyCaption:
    """One sentence of a Karpathy file. image_file: `filepath/filename` as the file names
    it (relative to the dataset's image root)."""

    sentence_id: str
    image_id: str
    image_file: str
    caption: str
    split: str


def read_karpathy(fs: pafs.FileSystem, path: str, restval_as_train: bool = True
                  ) -> Iterator[KarpathyCaption]:
    """Every sentence of the Karpathy JSON at `path`; "restval" images count as train
    when restval_as_train (as in every CLIP fine-tuning recipe). Raises DataError for a
    file that is not valid JSON or not in the Karpathy layout."""
    try:
        data = json.loads(read_bytes(fs, path))
    except json.JSONDecodeError as err:
        raise DataError(f"{path}: not valid JSON ({err}); check input.format") from err
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: not UTF-8 text (byte {err.start}); check input.uri") from err
    _expect(isinstance(data, dict) and isinstance(data.get("images"), list), path, "no 'images' list")
    for number, image in enumerate(data["images"]):
        _expect(isinstance(image, dict) and "sentences" in image and "split" in image, path,
                f"image {number} without 'sentences' or 'split'")
        try:
            image_id = str(image.get("cocoid", image.get("imgid")))
            split = image["split"]
            if split == "restval" and restval_as_train:
                split = "train"
            parts = [p for p in (image.get("filepath", ""), image["filename"]) if p]
            image_file = posixpath.join(*parts)
            captions = [(str(sentence["sentid"]),
                         sentence.get("raw") or " ".join(sentence.get("tokens", [])))
                        for sentence in image["sentences"]]
        except (KeyError, TypeError, AttributeError) as err:
            # A missing field (KeyError names it) or one of another type.
            _expect(False, path, f"image {number}: {type(err).__name__} {err}")
        for sentence_id, caption in captions:
            yield KarpathyCaption(sentence_id, image_id, image_file, caption, split)


def _expect(cond: bool, path: str, what: str) -> None:
    if not cond:
        raise DataError(f"{path}: not a Karpathy file ({what}); check input.format and input.uri")

"""Tiny fixtures, written at test time, in the on-disk layouts of the paper's ZS and Retr
columns (docs/evaluation.md, "The paper's ZS and Retr columns"): the seven CLIP_benchmark
zero-shot datasets under <root>/zeroshot_paper/<name>/ (a few classes each, two images per
class), Flickr8k under <root>/flickr8k/ in CLIP_benchmark's or Karpathy's layout, and the
COCO Karpathy fixture under <root>/coco/.

The 1000-class ImageNet datasets keep only their first class folders (in ImageNet's
sorted WordNet order), so that torchvision's ImageFolder index (position among the folders
present) equals the class index; likewise Caltech101 keeps the first folders of its sorted
listing. SUN397's ClassName.txt lists only the fixture's classes. Each writer returns
{path relative to the dataset folder (CIFAR-10: "test_batch/<index>"): class index}.
"""

from __future__ import annotations

import io
import json
import pickle
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from PIL import Image

FIXTURES = Path(__file__).parent / "fixtures" / "suites"
PALETTE = ((220, 20, 20), (20, 200, 20), (20, 20, 220), (230, 230, 20))  # red green blue yellow
SIZE = 24
IMAGENET_FIRST_WNIDS = ("n01440764", "n01443537", "n01484850")  # tench, goldfish, great white
IMAGENET_O_FIRST_WNIDS = ("n01443537", "n01704323", "n01770081")  # its first three classes
IMAGENETV2_CLASSES = (0, 1, 999)
CALTECH_FIRST_FOLDERS = ("BACKGROUND_Google", "Faces", "Faces_easy")  # sorted listing's start
SUN397_CLASSES = ("/a/abbey", "/a/apartment_building/outdoor", "/b/bakery/shop")
CIFAR10_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                 "truck")
CIFAR10_LABELS = (0, 0, 3, 3, 9, 9)
ZEROSHOT_PAPER = ("imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-o", "cifar10",
                  "caltech101", "sun397")


def image_bytes(color: tuple[int, int, int], fmt: str = "JPEG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (SIZE, SIZE), color).save(out, format=fmt)
    return out.getvalue()


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _class_folders(folder: Path, classes: Iterable[str], name: str, suffix: str,
                   per_class: int = 2) -> dict[str, int]:
    """<folder>/<class>/<name>_<k><suffix>, class index = position in `classes`."""
    listing = {}
    for label, cls in enumerate(classes):
        for k in range(per_class):
            relative = f"{cls}/{name}_{k + 1:04d}{suffix}"
            _write(folder / relative, image_bytes(PALETTE[(label + k) % len(PALETTE)]))
            listing[relative] = label
    return listing


def write_imagenet1k(folder: Path) -> dict[str, int]:
    """torchvision ImageNet's val layout (val/<wnid>/*.JPEG) and its meta.bin, so
    CLIP_benchmark's build_dataset reads it offline too."""
    import torch

    listing = _class_folders(folder / "val", IMAGENET_FIRST_WNIDS, "ILSVRC2012_val", ".JPEG")
    torch.save(({w: (w,) for w in IMAGENET_FIRST_WNIDS},
                [w for w in IMAGENET_FIRST_WNIDS for _ in range(2)]), folder / "meta.bin")
    return {f"val/{k}": v for k, v in listing.items()}


def write_imagenetv2(folder: Path) -> dict[str, int]:
    """ImageNetV2-matched-frequency/<class index>/*.jpeg; the label is the number."""
    listing = {}
    for cls in IMAGENETV2_CLASSES:
        for k in range(2):
            relative = f"ImageNetV2-matched-frequency/{cls}/{k:040x}.jpeg"
            _write(folder / relative, image_bytes(PALETTE[(cls + k) % len(PALETTE)]))
            listing[relative] = cls
    return listing


def write_imagenet_sketch(folder: Path) -> dict[str, int]:
    return _class_folders(folder, IMAGENET_FIRST_WNIDS, "sketch", ".JPEG")


def write_imagenet_o(folder: Path) -> dict[str, int]:
    return _class_folders(folder, IMAGENET_O_FIRST_WNIDS, "o", ".jpg")


def write_cifar10(folder: Path) -> dict[str, int]:
    """cifar-10-batches-py/test_batch and batches.meta: python pickles as the CIFAR-10
    python release has them (latin1 keys; rows of 3072 bytes, CHW)."""
    rows = []
    for index, _ in enumerate(CIFAR10_LABELS):
        pixels = np.zeros((3, 32, 32), dtype=np.uint8)
        for channel, value in enumerate(PALETTE[index % len(PALETTE)]):
            pixels[channel] = value
        rows.append(pixels.reshape(-1))
    batches = folder / "cifar-10-batches-py"
    batches.mkdir(parents=True, exist_ok=True)
    batch = {"batch_label": "testing batch 1 of 1", "labels": list(CIFAR10_LABELS),
             "data": np.stack(rows), "filenames": [f"{i}.png" for i in range(len(rows))]}
    (batches / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    (batches / "batches.meta").write_bytes(pickle.dumps(
        {"label_names": list(CIFAR10_NAMES), "num_cases_per_batch": 10000, "num_vis": 3072},
        protocol=2))
    return {f"test_batch/{i:05d}": label for i, label in enumerate(CIFAR10_LABELS)}


def write_caltech101(folder: Path) -> dict[str, int]:
    """clip_benchmark's Caltech101 layout: caltech101/101_ObjectCategories/<cat>/image_0001.jpg."""
    listing = _class_folders(folder / "caltech101" / "101_ObjectCategories",
                             CALTECH_FIRST_FOLDERS, "image", ".jpg")
    return {f"caltech101/101_ObjectCategories/{k}": v for k, v in listing.items()}


def write_sun397(folder: Path) -> dict[str, int]:
    """torchvision SUN397: SUN397/ClassName.txt and SUN397/<letter>/<class>/sun_*.jpg."""
    data = folder / "SUN397"
    data.mkdir(parents=True, exist_ok=True)
    (data / "ClassName.txt").write_text("".join(f"{c}\n" for c in SUN397_CLASSES))
    listing = {}
    for label, cls in enumerate(SUN397_CLASSES):
        for k in range(2):
            relative = f"SUN397{cls}/sun_{label}{k}abcdefgh.jpg"
            _write(folder / relative, image_bytes(PALETTE[(label + k) % len(PALETTE)]))
            listing[relative] = label
    (data / "a" / "abbey" / "README.txt").write_text("not an image: not listed\n")
    return listing


WRITERS = {"imagenet1k": write_imagenet1k, "imagenetv2": write_imagenetv2,
           "imagenet_sketch": write_imagenet_sketch, "imagenet-o": write_imagenet_o,
           "cifar10": write_cifar10, "caltech101": write_caltech101, "sun397": write_sun397}


def write_zeroshot_paper(root: Path, datasets: Iterable[str] = ZEROSHOT_PAPER
                         ) -> dict[str, dict[str, int]]:
    """<root>/zeroshot_paper/<name>/ for each of `datasets`; {name: listing}."""
    return {name: WRITERS[name](root / "zeroshot_paper" / name) for name in datasets}


# Flickr8k: two images per layout, one colour each, captions naming the colour.
# Ids 0, 1, 2 in Karpathy's layout, as COCO's fixture's, in other colours (COCO's: red, blue,
# green).
FLICKR8K = (("1000268201_693b08cb0e.jpg", (20, 200, 20), ("a green dog", "a dog, green")),
            ("1001773457_577c3a7d70.jpg", (220, 20, 20), ("a red bike",)),
            ("1002674143_1b742ab4b8.jpg", (20, 20, 220), ("a blue park", "blue water")))


def write_flickr8k(root: Path, layout: str = "clip_benchmark") -> Path:
    """<root>/flickr8k/ in CLIP_benchmark's layout (flickr8k_test_karpathy.txt: a header,
    then `<image>.jpg,<caption>` lines; images in Images/) or Karpathy's
    (dataset_flickr8k.json, images in Flicker8k_Dataset/, one train image left out)."""
    folder = root / "flickr8k"
    if layout == "clip_benchmark":
        lines = ["image,caption"] + [f"{name},{caption}" for name, _, captions in FLICKR8K
                                     for caption in captions]
        _write(folder / "flickr8k_test_karpathy.txt", ("\n".join(lines) + "\n").encode())
        images = folder / "Images"
    elif layout == "karpathy":
        entries = [{"filename": name, "imgid": i, "split": "test",
                    "sentences": [{"raw": c, "sentid": 10 * i + k} for k, c in enumerate(caps)]}
                   for i, (name, _, caps) in enumerate(FLICKR8K)]
        entries.append({"filename": "99_train.jpg", "imgid": 99, "split": "train",
                        "sentences": [{"raw": "a yellow cab", "sentid": 990}]})
        _write(folder / "dataset_flickr8k.json",
               json.dumps({"dataset": "flickr8k", "images": entries}).encode())
        images = folder / "Flicker8k_Dataset"
    else:
        raise ValueError(layout)
    for name, color, _ in FLICKR8K:
        _write(images / name, image_bytes(color))
    return folder


def write_coco(root: Path) -> Path:
    """<root>/coco/: the COCO Karpathy fixture (dataset_coco.json + val2014/)."""
    shutil.copytree(FIXTURES / "coco", root / "coco", dirs_exist_ok=True)
    return root / "coco"

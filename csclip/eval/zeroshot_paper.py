"""The paper's zero-shot column (Tables 16-17, "ZS Avg"): top-1 over the seven
CLIP_benchmark datasets the CS-CLIP authors ran (imagenet1k, imagenetv2, imagenet_sketch,
imagenet-o, sun397, caltech101, cifar10), each with CLIP_benchmark's own class names and
templates, read from the installed `clip_benchmark` package (never copied here).

Each dataset is read from CLIP_benchmark's webdataset copy, the authors' exact images, when
`<data_root>/zeroshot_paper/` holds it (`wds_<name>/` as the HuggingFace hub names it, e.g.
`wds_vtab-caltech101`, or `<name>/` in that layout: csclip.eval.shards), with the class
names and templates its files give; else from `<data_root>/zeroshot_paper/<name>/` in the
on-disk layout that CLIP_benchmark's `build_dataset(name, root=that folder,
download=False)` (and the torchvision class behind it) reads, by our own readers, because
a data root may be s3:// (they list through csclip.storage; torchvision reads a local
disk) and nothing here may download or shell out (CLIP_benchmark's builder calls wget, gdown or requests when a
root is missing or a count is off); tests/test_zeroshot_paper.py checks the listing equals
build_dataset's. CIFAR-10's pickles are read by an unpickler that finds numpy's array
reconstructors and nothing else, so a crafted file runs no code. Labels are CLIP_benchmark's class indices: for the ImageNet
family the class folder's WordNet id in ImageNet's sorted order (what ImageFolder's index
is when every class folder is there), imagenetv2's numbered folders, SUN397's
ClassName.txt order, Caltech101's sorted folders, CIFAR-10's batch labels.
docs/evaluation.md, "The paper's ZS and Retr columns".
"""

from __future__ import annotations

import ast
import codecs
import io
import json
import logging
import pickle
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np
import pyarrow.fs as pafs
from PIL import Image

from csclip.errors import DataError
from csclip.eval.encoder import Encoder, ImageSource
from csclip.eval.shards import (
    WDS_LAYOUT,
    ShardAccounting,
    is_wds_folder,
    open_wds_folder,
    read_wds_classification,
)
from csclip.eval.zeroshot import ZeroShotTask, evaluate_task
from csclip.storage import exists, filesystem_for, is_dir, join, read_bytes

log = logging.getLogger(__name__)

SUITE = "zeroshot_paper"
# CLIP_benchmark's dataset names, in the authors' table order (ImageNet family, then the
# fine-grained three).
PAPER_DATASETS: tuple[str, ...] = ("imagenet1k", "imagenetv2", "imagenet_sketch", "imagenet-o",
                                   "cifar10", "caltech101", "sun397")
# torchvision.datasets.folder.IMG_EXTENSIONS: what ImageFolder lists (case-insensitive).
IMAGE_FOLDER_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff",
                         ".webp")
IMAGENETV2_FOLDER = "ImageNetV2-matched-frequency"
# Per dataset: (what must exist under its folder to count as there, the layout in words).
LAYOUTS: dict[str, tuple[str, str]] = {
    "imagenet1k": ("val", "val/<wnid>/<image> (torchvision ImageNet's val layout; meta.bin "
                          "not needed)"),
    "imagenetv2": (IMAGENETV2_FOLDER, f"{IMAGENETV2_FOLDER}/<class 0-999>/<image>.jpeg"),
    "imagenet_sketch": ("", "<wnid>/<image> (ImageNet-Sketch's sketch/ folder)"),
    "imagenet-o": ("", "<wnid>/<image> (imagenet-o.tar's folder)"),
    "cifar10": ("cifar-10-batches-py/test_batch",
                "cifar-10-batches-py/test_batch and batches.meta (python pickles)"),
    "caltech101": ("caltech101/101_ObjectCategories",
                   "caltech101/101_ObjectCategories/<category>/<image>.jpg"),
    "sun397": ("SUN397/ClassName.txt",
               "SUN397/ClassName.txt and SUN397/<letter>/<class>/sun_*.jpg"),
}


# The webdataset copies the authors ran (CLIP_benchmark's `wds/<name>`, its folder
# `wds_<name with / as ->` on the HuggingFace hub, clip-benchmark/wds_*): their images,
# split, class names and templates. Caltech101 and CIFAR-10 are VTAB's copies (vtab/...).
WDS_FOLDERS: dict[str, str] = {
    "imagenet1k": "wds_imagenet1k", "imagenetv2": "wds_imagenetv2",
    "imagenet_sketch": "wds_imagenet_sketch", "imagenet-o": "wds_imagenet-o",
    "cifar10": "wds_vtab-cifar10", "caltech101": "wds_vtab-caltech101", "sun397": "wds_sun397",
}


LAYOUT = ("one folder per CLIP_benchmark dataset: its webdataset copy wds_<name>/ (the "
          f"authors' images; {WDS_LAYOUT}), else as build_dataset(name, root=<folder>) "
          "reads it: " + "; ".join(f"{n}/{layout}" for n, (_, layout) in LAYOUTS.items()))


def metric_slug(dataset: str) -> str:
    """The dataset's part of a metric key: `imagenet-o` -> `imagenet_o`."""
    return dataset.replace("-", "_")


# ---------------------------------------------------------------------------------------
# What the installed clip_benchmark package says
# ---------------------------------------------------------------------------------------

def _package_file(name: str) -> str:
    try:
        return resources.files("clip_benchmark.datasets").joinpath(name).read_text()
    except ModuleNotFoundError as err:
        raise DataError("the zeroshot_paper suite needs the clip_benchmark package (its class "
                        "names and templates): pip install 'clip_benchmark>=1.6,<2'") from err


@cache
def clip_benchmark_classnames() -> dict[str, list[str]]:
    """clip_benchmark/datasets/en_classnames.json."""
    return json.loads(_package_file("en_classnames.json"))


@cache
def clip_benchmark_templates() -> dict[str, list[str]]:
    """clip_benchmark/datasets/en_zeroshot_classification_templates.json."""
    return json.loads(_package_file("en_zeroshot_classification_templates.json"))


def templates_for(dataset: str) -> list[str]:
    """The dataset's templates as build_dataset picks them: its own key, else imagenet1k's
    (imagenetv2, imagenet_sketch and imagenet-o have none of their own)."""
    templates = clip_benchmark_templates()
    return list(templates.get(dataset) or templates["imagenet1k"])


@cache
def _builder_lists() -> dict[str, list[str]]:
    """The WordNet id lists of clip_benchmark/datasets/builder.py, read from its source
    (all_imagenet_wordnet_ids is module-level, imagenet_o_wnids local to build_dataset),
    so the lists are the installed package's, not a copy."""
    tree = ast.parse(_package_file("builder.py"))
    wanted = {"all_imagenet_wordnet_ids", "imagenet_o_wnids"}
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name) and node.targets[0].id in wanted:
            found[node.targets[0].id] = list(ast.literal_eval(node.value))
    missing = wanted - set(found)
    if missing:
        raise DataError(f"clip_benchmark's builder.py has no {sorted(missing)}; install "
                        "clip_benchmark>=1.6,<2")
    return found


def imagenet_wnids() -> list[str]:
    """ImageNet-1k's 1000 WordNet ids in class order (sorted)."""
    return _builder_lists()["all_imagenet_wordnet_ids"]


def imagenet_o_classes() -> tuple[list[str], list[str]]:
    """ImageNet-O's (WordNet ids, class names) in class order: imagenet1k's names masked
    by builder.py's imagenet_o_wnids, as build_dataset sets ds.classes."""
    keep = set(_builder_lists()["imagenet_o_wnids"])
    pairs = [(w, n) for w, n in zip(imagenet_wnids(), clip_benchmark_classnames()["imagenet1k"],
                                    strict=True) if w in keep]
    return [w for w, _ in pairs], [n for _, n in pairs]


# ---------------------------------------------------------------------------------------
# Readers: (images, labels, class names) of one dataset folder
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PaperDataset:
    """One dataset as read: image key -> source (a URI, or encoded bytes for CIFAR-10's
    arrays and a webdataset copy's images), image key -> class index, the class names, and
    for a webdataset copy its own templates and the shards' accounting (None: the package's
    templates, a folder read)."""

    images: dict[str, ImageSource]
    labels: dict[str, int]
    classnames: tuple[str, ...]
    templates: tuple[str, ...] | None = None
    accounting: ShardAccounting | None = None


def _files(root: str) -> list[str]:
    """Every file under `root`, as paths relative to it, sorted."""

    filesystem, path = filesystem_for(root)
    path = path.rstrip("/")
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True,
                                                       allow_not_found=True))
    return sorted(i.path[len(path) + 1:] for i in infos if i.type == pafs.FileType.File)


def _uri(root: str, relative: str) -> str:
    return f"{root.rstrip('/')}/{relative}"


def _read(uri: str) -> bytes:
    filesystem, path = filesystem_for(uri)
    return read_bytes(filesystem, path)


def _by_folder(name: str, root: str, relatives: list[str], class_of: dict[str, int],
               suffixes: tuple[str, ...] = IMAGE_FOLDER_SUFFIXES, key_prefix: str = ""
               ) -> tuple[dict[str, ImageSource], dict[str, int]]:
    """ImageFolder's listing: `<folder>/<image>` whose folder is a class of class_of;
    a folder that is not is a DataError naming it. Keys: zeroshot_paper/<name>/<key_prefix
    + path under root>."""
    images: dict[str, ImageSource] = {}
    labels: dict[str, int] = {}
    for relative in relatives:
        if "/" not in relative or not relative.lower().endswith(suffixes):
            continue
        folder = relative.split("/", 1)[0]  # ImageFolder: the top folder, files at any depth
        if folder not in class_of:
            raise DataError(f"{root}/{folder}: not a class folder of {name} (expects "
                            f"{LAYOUTS[name][1]})")
        key = f"{SUITE}/{name}/{key_prefix}{relative}"
        images[key] = _uri(root, relative)
        labels[key] = class_of[folder]
    return images, labels


def read_imagenet_family(name: str, root: str) -> PaperDataset:
    """imagenet1k (root/val/<wnid>/), imagenet_sketch and imagenet-o (root/<wnid>/):
    the label is the WordNet id's index among the dataset's classes."""
    if name == "imagenet-o":
        wnids, classnames = imagenet_o_classes()
    else:
        wnids, classnames = imagenet_wnids(), clip_benchmark_classnames()["imagenet1k"]
    folder = _uri(root, "val") if name == "imagenet1k" else root
    images, labels = _by_folder(name, folder, _files(folder), {w: i for i, w in enumerate(wnids)},
                                key_prefix="val/" if name == "imagenet1k" else "")
    return PaperDataset(images, labels, tuple(classnames))


def read_imagenetv2(root: str) -> PaperDataset:
    """ImageNetV2 matched-frequency: `<class index>/<image>.jpeg` (what
    clip_benchmark.datasets.imagenetv2 globs), the folder's number is the label."""
    folder = _uri(root, IMAGENETV2_FOLDER)
    classes = {str(i): i for i in range(1000)}
    images, labels = _by_folder("imagenetv2", folder, _files(folder), classes, (".jpeg",),
                                f"{IMAGENETV2_FOLDER}/")
    return PaperDataset(images, labels, tuple(clip_benchmark_classnames()["imagenet1k"]))


def read_caltech101(root: str) -> PaperDataset:
    """clip_benchmark.datasets.caltech101 (torchvision's with the background class kept):
    labels index the sorted category folders (102 with BACKGROUND_Google), images are each
    folder's *.jpg; names are en_classnames.json's "caltech101"."""
    folder = _uri(root, "caltech101/101_ObjectCategories")
    relatives = _files(folder)
    categories = sorted({r.split("/", 1)[0] for r in relatives if "/" in r})
    classnames = clip_benchmark_classnames()["caltech101"]
    if len(categories) > len(classnames):
        raise DataError(f"{folder}: {len(categories)} category folders, caltech101 has "
                        f"{len(classnames)} (expects {LAYOUTS['caltech101'][1]})")
    jpgs = [r for r in relatives if r.count("/") == 1]
    images, labels = _by_folder("caltech101", folder, jpgs,
                                {c: i for i, c in enumerate(categories)}, (".jpg",),
                                "caltech101/101_ObjectCategories/")
    # Their glob is case-sensitive "*.jpg".
    images = {k: v for k, v in images.items() if k.endswith(".jpg")}
    return PaperDataset(images, {k: labels[k] for k in images}, tuple(classnames))


def read_sun397(root: str) -> PaperDataset:
    """torchvision SUN397: classes from SUN397/ClassName.txt ("/a/abbey" -> "abbey"),
    every sun_*.jpg below, labelled by its folder path; names with "_" and "/" as spaces
    (build_dataset's)."""
    folder = _uri(root, "SUN397")
    names_uri = _uri(folder, "ClassName.txt")
    try:
        lines = _read(names_uri).decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise DataError(f"{names_uri}: not UTF-8 text ({err.reason} at byte {err.start}); "
                        f"expects one class a line, as SUN397 publishes it "
                        f"({LAYOUTS['sun397'][1]})") from err
    classes = [line[3:].strip() for line in lines if line.strip()]
    class_of = {c: i for i, c in enumerate(classes)}
    images: dict[str, ImageSource] = {}
    labels: dict[str, int] = {}
    for relative in _files(folder):
        parts = relative.split("/")
        if not (parts[-1].startswith("sun_") and parts[-1].endswith(".jpg")):
            continue
        label = class_of.get("/".join(parts[1:-1]))
        if label is None:
            raise DataError(f"{folder}/{relative}: its folder is no class of "
                            f"{folder}/ClassName.txt (expects {LAYOUTS['sun397'][1]})")
        key = f"{SUITE}/sun397/SUN397/{relative}"
        images[key] = _uri(folder, relative)
        labels[key] = label
    names = tuple(c.replace("_", " ").replace("/", " ") for c in classes)
    return PaperDataset(images, labels, names)


# What CIFAR-10's python pickles hold: dicts, lists, strings, numbers and one uint8 numpy
# array. Unpickling calls whatever global a file names (a crafted batches.meta ran a shell
# command), so only numpy's array reconstructors are found: under both module names (numpy
# 1.x pickles say numpy.core, 2.x numpy._core), protocol 5's _frombuffer, and the
# _codecs.encode through which Python 3 writes bytes at protocol 2. torchvision's CIFAR10
# checks the published md5s instead, but it needs all six batches on a local disk (ours:
# test_batch and batches.meta, local or s3://) and refuses any other file.
_NUMPY_CORE = getattr(np, "_core", None) or np.core
CIFAR10_PICKLE_GLOBALS: dict[tuple[str, str], object] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    **{(f"{module}.multiarray", "_reconstruct"): _NUMPY_CORE.multiarray._reconstruct
       for module in ("numpy.core", "numpy._core")},
    **{(f"{module}.numeric", "_frombuffer"): _NUMPY_CORE.numeric._frombuffer
       for module in ("numpy.core", "numpy._core")},
    ("_codecs", "encode"): codecs.encode,
}


class _RefusedGlobal(pickle.UnpicklingError):
    """A pickle names a global outside CIFAR10_PICKLE_GLOBALS."""


class _ArraysOnlyUnpickler(pickle.Unpickler):
    """An unpickler that finds CIFAR10_PICKLE_GLOBALS and nothing else."""

    def find_class(self, module: str, name: str) -> object:
        found = CIFAR10_PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise _RefusedGlobal(f"it names {module}.{name}")
        return found


def _unpickle(uri: str) -> dict:
    """A CIFAR-10 pickle of plain data and numpy arrays; anything else is refused before it
    is called. Object arrays (whose items could be any object) are refused as well."""
    try:
        loaded = _ArraysOnlyUnpickler(io.BytesIO(_read(uri)), encoding="latin1").load()
    except _RefusedGlobal as err:
        raise DataError(f"{uri}: refused, not a pickle of CIFAR-10's plain data and numpy "
                        f"arrays ({err}); a crafted file could run code when read; "
                        f"expects {LAYOUTS['cifar10'][1]}") from err
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise DataError(f"{uri}: not CIFAR-10's python pickle ({type(err).__name__} {err}); "
                        f"expects {LAYOUTS['cifar10'][1]}") from err
    if not isinstance(loaded, dict) or any(isinstance(v, np.ndarray) and v.dtype.hasobject
                                           for v in loaded.values()):
        raise DataError(f"{uri}: refused, not CIFAR-10's dict of plain data and numeric "
                        f"arrays; expects {LAYOUTS['cifar10'][1]}")
    return loaded


def read_cifar10(root: str) -> PaperDataset:
    """torchvision CIFAR10's test split, read by _unpickle (not torchvision: see
    CIFAR10_PICKLE_GLOBALS): the test_batch pickle's (3072-byte rows, CHW) images as PNG
    bytes (the encoder's ImageSource: encoded bytes or a URI; PNG keeps every pixel), its
    labels, batches.meta's label_names."""
    batches = _uri(root, "cifar-10-batches-py")
    batch = _unpickle(_uri(batches, "test_batch"))
    meta = _unpickle(_uri(batches, "batches.meta"))
    try:
        data = np.asarray(batch["data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        targets = [int(t) for t in batch.get("labels", batch.get("fine_labels", []))]
        classnames = tuple(str(n) for n in meta["label_names"])
    except (KeyError, ValueError, TypeError) as err:
        raise DataError(f"{batches}: not CIFAR-10's batches ({type(err).__name__} {err}); "
                        f"expects {LAYOUTS['cifar10'][1]}") from err
    if len(targets) != len(data):
        raise DataError(f"{batches}/test_batch: {len(data)} images, {len(targets)} labels")
    images: dict[str, ImageSource] = {}
    labels: dict[str, int] = {}
    for index, (pixels, target) in enumerate(zip(data, targets, strict=True)):
        out = io.BytesIO()
        Image.fromarray(pixels.transpose(1, 2, 0)).save(out, format="PNG")
        key = f"{SUITE}/cifar10/test_batch/{index:05d}"
        images[key] = out.getvalue()
        labels[key] = target
    return PaperDataset(images, labels, classnames)


def read_wds_dataset(name: str, root: str) -> PaperDataset:
    """A webdataset copy (csclip.eval.shards.read_wds_classification): its test split's
    images as encoded bytes, labels from .cls, the class names and templates of its
    files, as build_dataset("wds/...", root) reads them."""
    read = read_wds_classification(root, "test", key_prefix=f"{SUITE}/{name}/")
    return PaperDataset(dict(read.images), read.labels, read.classnames, read.templates,
                        read.accounting)


def read_paper_dataset(name: str, root: str) -> PaperDataset:
    """One of PAPER_DATASETS from its folder `root`: a webdataset copy when `root` holds
    test/nshards.txt, else the dataset's own layout (LAYOUTS)."""
    if name in PAPER_DATASETS and is_wds_folder(root):
        return read_wds_dataset(name, root)
    if name in ("imagenet1k", "imagenet_sketch", "imagenet-o"):
        return read_imagenet_family(name, root)
    readers = {"imagenetv2": read_imagenetv2, "caltech101": read_caltech101,
               "sun397": read_sun397, "cifar10": read_cifar10}
    if name not in readers:
        raise DataError(f"zeroshot_paper: unknown dataset {name!r}; one of "
                        f"{', '.join(PAPER_DATASETS)}")
    return readers[name](root)


def paper_task(name: str, root: str) -> ZeroShotTask:
    """The dataset as a ZeroShotTask with CLIP_benchmark's class names and templates
    (each template's {c} filled, as its zeroshot_classifier does)."""
    return task_of(name, root, read_paper_dataset(name, root))


def task_of(name: str, root: str, dataset: PaperDataset) -> ZeroShotTask:
    """`dataset` (read from `root`) as a ZeroShotTask: its own templates (a webdataset
    copy's), else the package's for `name`."""
    if not dataset.labels:
        layout = WDS_LAYOUT if dataset.accounting is not None else LAYOUTS[name][1]
        raise DataError(f"{root}: no images of {name} (expects {layout})")
    templates = dataset.templates or templates_for(name)
    texts = tuple(tuple(t.format(c=c) for t in templates) for c in dataset.classnames)
    return ZeroShotTask(name, dataset.images, dataset.labels, dataset.classnames, texts)


# ---------------------------------------------------------------------------------------
# Finding and scoring the suite
# ---------------------------------------------------------------------------------------

def find_paper_datasets(suite_root: str) -> tuple[dict[str, str], dict[str, str]]:
    """({dataset: folder} found, {dataset: "<folder> (expects <layout>)"} missing) under
    `suite_root` (<data_root>/zeroshot_paper): a webdataset copy first (WDS_FOLDERS[name],
    then <name>/ holding test/nshards.txt), else <name>/ in the dataset's own layout. A
    webdataset copy whose count of shards is wrong or (local) whose shards are not all
    there is a DataError here, before any model loads."""
    found: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name in PAPER_DATASETS:
        folder = join(suite_root, name)
        copy = next((f for f in (join(suite_root, WDS_FOLDERS[name]), folder)
                     if is_wds_folder(f)), None)
        marker, layout = LAYOUTS[name]
        if copy is not None:
            open_wds_folder(copy)
            found[name] = copy
        elif (exists(*filesystem_for(join(folder, marker))) if marker
              else _has_class_folders(folder)):
            found[name] = folder
        else:
            missing[name] = (f"{name} ({folder}: expects {layout}; or its webdataset copy "
                             f"{WDS_FOLDERS[name]}/)")
    return found, missing


def _has_class_folders(folder: str) -> bool:
    return any("/" in r for r in _files(folder)[:1000]) if _exists_dir(folder) else False


def _exists_dir(folder: str) -> bool:
    filesystem, path = filesystem_for(folder)
    return is_dir(filesystem, path)


def evaluate_paper_zeroshot(encoder: Encoder, datasets: dict[str, str]) -> dict[str, float]:
    """Each dataset of `datasets` ({name: folder}): `zs_paper_<name>` (top-1, CLIP_benchmark's
    acc1), `zs_paper_<name>_recall` (its mean_per_class_recall), `zs_paper_<name>_num_images`;
    `zs_paper_avg`, the mean top-1 over the datasets run (the authors' ZS_Avg averages
    acc1); `zs_paper_datasets_found` / `_asked` (k of the paper's seven). A webdataset
    copy adds `zs_paper_<name>_webdataset` (1) and its shards' accounting:
    `_num_read`, `_num_rejected`, `_rejected_<reason>` (logged, a warning when any)."""
    metrics: dict[str, float] = {}
    for name in [n for n in PAPER_DATASETS if n in datasets]:
        dataset = read_paper_dataset(name, datasets[name])
        task = task_of(name, datasets[name], dataset)
        top1, recall = evaluate_task(encoder, task)
        slug = metric_slug(name)
        metrics.update({f"zs_paper_{slug}": top1, f"zs_paper_{slug}_recall": recall,
                        f"zs_paper_{slug}_num_images": float(len(task.labels))})
        if dataset.accounting is not None:
            dataset.accounting.log(f"zero-shot (paper) {name}, webdataset {datasets[name]}")
            metrics[f"zs_paper_{slug}_webdataset"] = 1.0
            metrics.update(dataset.accounting.metrics(f"zs_paper_{slug}"))
        log.info("zero-shot (paper) %s: %d images, %d classes, %d templates: top-1 %.1f, "
                 "mean recall %.1f", name, len(task.labels), len(task.classnames),
                 len(task.class_texts[0]), top1, recall)
    run = [metric_slug(n) for n in PAPER_DATASETS if n in datasets]
    if run:
        metrics["zs_paper_avg"] = float(np.mean([metrics[f"zs_paper_{s}"] for s in run]))
    metrics["zs_paper_datasets_found"] = float(len(run))
    metrics["zs_paper_datasets_asked"] = float(len(PAPER_DATASETS))
    return metrics

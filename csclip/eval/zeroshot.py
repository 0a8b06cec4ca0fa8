"""Zero-shot classification: class embeddings from templates (CLIP's prompt ensembling),
top-1 accuracy and mean per-class recall; on ImageFolder-style dataset roots (local or
s3://) or CLIP_benchmark's webdataset folders (csclip.eval.shards), and on the synthetic
world (each scene's objects by shape, by color, by shape + color, and each scene's object
count). The paper's ZS column (Tables 16-17, CLIP_benchmark's seven datasets) is
csclip.eval.zeroshot_paper, on the same ZeroShotTask / evaluate_task."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow.fs as pafs
from open_clip.zero_shot_metadata import IMAGENET_CLASSNAMES, OPENAI_IMAGENET_TEMPLATES

from csclip.errors import DataError
from csclip.eval.encoder import Encoder, FeatureTables, ImageSource, l2_normalize
from csclip.eval.shards import ShardAccounting, is_wds_folder, read_wds_classification
from csclip.storage import exists, filesystem_for, is_dir, read_bytes
from csclip.units import UnitsRecord
from csclip.world.render import render_png
from csclip.world.scene import Scene, scene_from_record

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".JPEG", ".JPG", ".PNG")
LAYOUT = ("one folder per dataset: [test/]<class folder>/<images> (ImageFolder order: sorted "
          "folder names), optional classnames.txt (one name per line, in folder order) and "
          "templates.txt (one per line, {c} or {} for the class name)")


@dataclass(frozen=True)
class ZeroShotTask:
    """Images with their true class, the class names and, per class, the texts whose mean
    embedding is that class's classifier row."""

    name: str
    images: dict[str, ImageSource]  # key -> bytes or URI
    labels: dict[str, int]  # image key -> class index
    classnames: tuple[str, ...]
    class_texts: tuple[tuple[str, ...], ...]


def class_texts(classnames: Sequence[str], templates: Sequence[str | Callable[[str], str]]
                ) -> tuple[tuple[str, ...], ...]:
    """Every template filled with every class name ({c} or {}, or a callable as in
    open_clip's OPENAI_IMAGENET_TEMPLATES)."""
    def fill(template, name: str) -> str:
        if callable(template):
            return template(name)
        return template.replace("{c}", name).replace("{}", name)

    return tuple(tuple(fill(t, c) for t in templates) for c in classnames)


def classifier(features: FeatureTables, texts: Sequence[Sequence[str]]) -> np.ndarray:
    """(C, D) class embeddings: the normalised mean of each class's normalised text
    embeddings (CLIP's prompt ensemble)."""
    rows = [features.text_features[[features.text_index[t] for t in group]].mean(0)
            for group in texts]
    return l2_normalize(np.stack(rows))


def classification_metrics(labels: np.ndarray, predictions: np.ndarray,
                           num_classes: int) -> tuple[float, float]:
    """(top-1 accuracy, mean per-class recall) in percent; classes without images do not
    enter the recall mean."""
    top1 = 100.0 * float(np.mean(predictions == labels))
    recalls = [float(np.mean(predictions[labels == c] == c)) for c in range(num_classes)
               if (labels == c).any()]
    return top1, 100.0 * float(np.mean(recalls))


def evaluate_task(encoder: Encoder, task: ZeroShotTask) -> tuple[float, float]:
    """(top-1, mean per-class recall) of one task. A tie between classes goes to the
    first class (argmax), as in CLIP_benchmark's top-k."""
    if not task.labels:
        raise DataError(f"zero-shot task {task.name!r} has no images")
    features = encoder.features([t for group in task.class_texts for t in group], task.images)
    weights = classifier(features, task.class_texts)  # (C, D)
    keys = sorted(task.labels)
    images = features.image_features[[features.image_index[k] for k in keys]]  # (N, D)
    predictions = np.argmax(images.astype(np.float64) @ weights.T.astype(np.float64), axis=1)
    labels = np.array([task.labels[k] for k in keys])
    return classification_metrics(labels, predictions, len(task.classnames))


# ---------------------------------------------------------------------------------------
# Dataset roots (ImageFolder layout, CLIP_benchmark-style class names and templates)
# ---------------------------------------------------------------------------------------

def _read_lines(uri: str) -> list[str] | None:
    filesystem, path = filesystem_for(uri)
    if not exists(filesystem, path):
        return None
    try:
        text = read_bytes(filesystem, path).decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(f"{uri}: not UTF-8 text (byte {err.start}); one name a line") from err
    return [line.strip() for line in text.splitlines() if line.strip()]


def load_image_folder(root: str, name: str | None = None) -> ZeroShotTask:
    """A classification dataset in ImageFolder layout under `root` (or root/test): one
    sub-folder per class. Class names: classnames.txt, else open_clip's ImageNet names for
    a 1000-class dataset named imagenet*, else the folder names with "_" as spaces.
    Templates: templates.txt, else the OpenAI ImageNet templates (open_clip).

    Raises DataError when there are no class folders or classnames.txt has the wrong length.
    """

    name = name or root.rstrip("/").rsplit("/", 1)[-1]
    filesystem, path = filesystem_for(root)
    scheme = "s3://" if root.startswith("s3://") else ""
    if is_dir(filesystem, f"{path}/test"):
        path = f"{path}/test"
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    folders = sorted({i.path[len(path) + 1:].split("/", 1)[0] for i in infos
                      if i.type == pafs.FileType.File and "/" in i.path[len(path) + 1:]})
    if not folders:
        raise DataError(f"zero-shot dataset {root}: no class folders (expects {LAYOUT})")
    images, labels = {}, {}
    for info in infos:
        relative = info.path[len(path) + 1:]
        if info.type == pafs.FileType.File and "/" in relative and relative.endswith(IMAGE_SUFFIXES):
            key = f"{name}/{relative}"
            images[key] = scheme + info.path
            labels[key] = folders.index(relative.split("/", 1)[0])
    classnames = _read_lines(f"{root.rstrip('/')}/classnames.txt")
    if classnames is None:
        is_imagenet = name.lower().startswith("imagenet") and len(folders) == 1000
        classnames = list(IMAGENET_CLASSNAMES) if is_imagenet else [f.replace("_", " ")
                                                                      for f in folders]
    if len(classnames) != len(folders):
        raise DataError(f"{root}/classnames.txt has {len(classnames)} names for "
                        f"{len(folders)} class folders; give one name per folder, in order")
    templates = _read_lines(f"{root.rstrip('/')}/templates.txt") or list(OPENAI_IMAGENET_TEMPLATES)
    return ZeroShotTask(name, images, labels, tuple(classnames), class_texts(classnames, templates))


def load_wds_folder(root: str, name: str) -> tuple[ZeroShotTask, ShardAccounting]:
    """CLIP_benchmark's webdataset folder `root` (test split; its classnames.txt and
    zeroshot_classification_templates.txt) as a task, with the shards' accounting."""
    read = read_wds_classification(root, "test", key_prefix=f"{name}/")
    read.accounting.log(f"zero-shot {name}, webdataset {root}")
    task = ZeroShotTask(name, dict(read.images), read.labels, read.classnames,
                        class_texts(read.classnames, read.templates))
    return task, read.accounting


def evaluate_zeroshot_datasets(encoder: Encoder, root: str) -> dict[str, float]:
    """Every dataset folder under `root` (<data-root>/zeroshot): `zs_<name>` (top-1),
    `zs_<name>_recall` (mean per-class recall), `zs_<name>_num_images` and `zs_avg` (mean
    top-1 over the datasets, the paper's ZS column). A CLIP_benchmark webdataset folder
    (test/nshards.txt) is read from its shards, adding their accounting
    (`zs_<name>_num_read`, `_num_rejected`, `_rejected_<reason>`)."""

    filesystem, path = filesystem_for(root)
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    names = sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
    metrics: dict[str, float] = {}
    for name in names:
        folder = f"{root.rstrip('/')}/{name}"
        if is_wds_folder(folder):
            task, accounting = load_wds_folder(folder, name)
            metrics.update(accounting.metrics(f"zs_{name}"))
        else:
            task = load_image_folder(folder, name)
        top1, recall = evaluate_task(encoder, task)
        metrics.update({f"zs_{name}": top1, f"zs_{name}_recall": recall,
                        f"zs_{name}_num_images": float(len(task.labels))})
        log.info("zero-shot %s: %d images, %d classes, top-1 %.1f, mean recall %.1f", name,
                 len(task.labels), len(task.classnames), top1, recall)
    if names:
        metrics["zs_avg"] = float(np.mean([metrics[f"zs_{n}"] for n in names]))
    return metrics


# ---------------------------------------------------------------------------------------
# The synthetic world
# ---------------------------------------------------------------------------------------

COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}
# The world's captions never state a count, so counting measures words a world-trained
# model has not seen: it is reported but left out of zs_world_avg.
WORLD_AVG_TASKS: tuple[str, ...] = ("shape", "color", "shape_color")


def _rng(seed: int, image_id: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{image_id}:zeroshot".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def world_zeroshot_tasks(records: Sequence[UnitsRecord], seed: int = 0,
                         max_items: int = 500) -> dict[str, ZeroShotTask]:
    """Four tasks from world records (at most max_items each, one per record, seeded by
    (seed, image_id)): shape, color and shape_color classify one object of the scene,
    rendered alone where it stands; count classifies the scene by its number of objects.
    Classes are the shapes / colors / counts seen; texts are world language ("a red
    circle"), with shape and color classifiers ensembled over the other attribute."""
    world = sorted({r.image_id: r for r in records if r.meta.get("scene")}.values(),
                   key=lambda r: r.image_id)[:max_items]
    if not world:
        return {}
    objects, scenes = {}, {}
    for record in world:
        scene = scene_from_record(record)
        obj = _rng(seed, record.image_id).choice(scene.objects)
        objects[record.image_id] = (obj, render_png(Scene((obj,), scene.grid_size,
                                                          scene.image_size)))
        scenes[record.image_id] = (len(scene.objects), record)
    shapes = sorted({o.shape for o, _ in objects.values()})
    colors = sorted({o.color for o, _ in objects.values()})
    pairs = [f"{c} {s}" for c in colors for s in shapes]
    object_images = {f"zs/{i}": png for i, (_, png) in objects.items()}

    def article(text: str) -> str:
        return f"an {text}" if text[0] in "aeiou" else f"a {text}"

    tasks = {
        "shape": ZeroShotTask("shape", object_images,
                              {f"zs/{i}": shapes.index(o.shape) for i, (o, _) in objects.items()},
                              tuple(shapes), tuple(tuple(article(f"{c} {s}") for c in colors)
                                                   for s in shapes)),
        "color": ZeroShotTask("color", object_images,
                              {f"zs/{i}": colors.index(o.color) for i, (o, _) in objects.items()},
                              tuple(colors), tuple(tuple(article(f"{c} {s}") for s in shapes)
                                                   for c in colors)),
        "shape_color": ZeroShotTask("shape_color", object_images,
                                    {f"zs/{i}": pairs.index(f"{o.color} {o.shape}")
                                     for i, (o, _) in objects.items()},
                                    tuple(pairs), tuple((article(p),) for p in pairs)),
    }
    counts = sorted({n for n, _ in scenes.values()})
    scene_images: dict[str, ImageSource] = {}
    for image_id, (_, record) in scenes.items():
        scene_images[image_id] = record.image_bytes if record.image_bytes is not None \
            else record.image_path
    tasks["count"] = ZeroShotTask(
        "count", scene_images, {i: counts.index(n) for i, (n, _) in scenes.items()},
        tuple(COUNT_WORDS.get(n, str(n)) for n in counts),
        tuple((f"{COUNT_WORDS.get(n, str(n))} objects", f"{COUNT_WORDS.get(n, str(n))} shapes")
              for n in counts))
    return tasks


def evaluate_world_zeroshot(encoder: Encoder, records: Sequence[UnitsRecord], seed: int = 0,
                            max_items: int = 500) -> dict[str, float]:
    """`zs_world_<task>` (top-1) and `zs_world_<task>_recall` for shape, color,
    shape_color and count, `zs_world_num_items`, and `zs_world_avg` (mean top-1 of shape,
    color and shape_color: the world's ZS column). {} without world records."""
    tasks = world_zeroshot_tasks(records, seed, max_items)
    metrics: dict[str, float] = {}
    for name, task in tasks.items():
        top1, recall = evaluate_task(encoder, task)
        metrics[f"zs_world_{name}"] = top1
        metrics[f"zs_world_{name}_recall"] = recall
    if tasks:
        metrics["zs_world_num_items"] = float(len(tasks["shape"].labels))
        metrics["zs_world_avg"] = float(np.mean([metrics[f"zs_world_{t}"]
                                                 for t in WORLD_AVG_TASKS]))
    return metrics


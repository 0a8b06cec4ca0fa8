"""SugarCrepe (Hsieh et al. 2023): COCO val2017 images, each with a caption and a hard
negative, in seven subsets; I2T accuracy with ties counted wrong (its official script)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.suites.rules import strict_accuracy

log = logging.getLogger(__name__)


SUGARCREPE_SUBSETS: tuple[str, ...] = (
    "add_att",
    "add_obj",
    "replace_att",
    "replace_obj",
    "replace_rel",
    "swap_att",
    "swap_obj",
)


@dataclass(frozen=True)
class SugarCrepeItem:
    filename: str  # a COCO val2017 file name, e.g. "000000391895.jpg"
    caption: str
    negative_caption: str


def load_sugarcrepe(directory: str | Path) -> dict[str, list[SugarCrepeItem]]:
    """The subsets found in `directory` (`<subset>.json`, each a JSON object index ->
    {filename, caption, negative_caption}), items in index order.

    Raises DataError when the directory has no subset file or a file is malformed.
    """
    root = Path(directory)
    found = {s: root / f"{s}.json" for s in SUGARCREPE_SUBSETS if (root / f"{s}.json").is_file()}
    if not found:
        raise DataError(
            f"{root}: no SugarCrepe subset files ({', '.join(SUGARCREPE_SUBSETS)}.json); "
            "point suites.sugarcrepe_dir at the SugarCrepe data folder"
        )
    subsets: dict[str, list[SugarCrepeItem]] = {}
    for subset, path in found.items():
        try:
            data = json.loads(path.read_text())
            rows = sorted(data.items(), key=lambda kv: int(kv[0]))
            subsets[subset] = [
                SugarCrepeItem(row["filename"], row["caption"], row["negative_caption"])
                for _, row in rows
            ]
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise DataError(
                f"{path}: not a SugarCrepe file (expected index -> {{filename, caption, "
                f"negative_caption}}): {err!r}"
            ) from err
    return subsets


def _image_listing(image_root: str) -> tuple[str, set[str]]:
    """The root as a storage path and the file names directly under it."""
    from csclip.storage import filesystem_for, is_dir, list_files

    filesystem, path = filesystem_for(image_root)
    if not is_dir(filesystem, path):
        raise DataError(
            f"COCO image folder {image_root!r} does not exist; set suites.coco_images to the "
            "folder holding the val2017 images"
        )
    return path, {name.rsplit("/", 1)[-1] for name in list_files(filesystem, path)}


def evaluate_sugarcrepe(
    encoder: Encoder,
    directory: str | Path,
    image_root: str,
    max_per_subset: int | None = None,
) -> dict[str, float]:
    """Per-subset I2T accuracy (caption vs negative_caption, strict: a tie is wrong, as in
    SugarCrepe's official script) and their mean, in percent.

    Keys: `sugarcrepe_<subset>`, `sugarcrepe_avg` (mean over subsets with items),
    `sugarcrepe_num_<subset>` (scored) and `sugarcrepe_skipped_<subset>` (image missing).
    An item whose image is not under `image_root` is skipped and counted.

    Raises DataError when `image_root` is missing or holds none of the images.
    """
    subsets = load_sugarcrepe(directory)
    if max_per_subset is not None:
        subsets = {s: items[:max_per_subset] for s, items in subsets.items()}
    root, present = _image_listing(image_root)
    kept = {s: [i for i in items if i.filename in present] for s, items in subsets.items()}
    skipped = {s: len(subsets[s]) - len(kept[s]) for s in subsets}
    if not any(kept.values()):
        raise DataError(
            f"none of the {sum(skipped.values())} SugarCrepe images is under {image_root!r}; "
            "point suites.coco_images at COCO val2017"
        )
    from csclip.storage import join

    scheme = "s3://" if image_root.startswith("s3://") else ""
    images = {i.filename: scheme + join(root, i.filename) for items in kept.values() for i in items}
    texts = [t for items in kept.values() for i in items for t in (i.caption, i.negative_caption)]
    features = encoder.features(texts, images)
    metrics: dict[str, float] = {}
    for subset, items in kept.items():
        metrics[f"sugarcrepe_num_{subset}"] = float(len(items))
        metrics[f"sugarcrepe_skipped_{subset}"] = float(skipped[subset])
        if items:
            ids = [i.filename for i in items]
            metrics[f"sugarcrepe_{subset}"] = strict_accuracy(
                features.similarity(ids, [i.caption for i in items]),
                features.similarity(ids, [i.negative_caption for i in items]),
            )
    accuracies = [metrics[f"sugarcrepe_{s}"] for s in kept if f"sugarcrepe_{s}" in metrics]
    metrics["sugarcrepe_avg"] = float(np.mean(accuracies))
    summary = ", ".join(f"{s} {len(kept[s])} scored / {skipped[s]} skipped" for s in kept)
    if any(skipped.values()):
        log.warning("SugarCrepe: images missing under %s: %s", image_root, summary)
    else:
        log.info("SugarCrepe: %s", summary)
    return metrics


LAYOUT = ("the seven SugarCrepe files ({add,replace,swap}_*.json: index -> {filename, caption, "
          "negative_caption}) and COCO val2017 images in val2017/ (or <data-root>/coco/val2017/)")


def load_sugarcrepe_suite(data_root: str):
    """SugarCrepe as a suite of the real-data registry (<data_root>/sugarcrepe, local or
    s3://): caption vs negative_caption, strict (its official script counts a tie as
    wrong); `sugarcrepe_i2t` is the mean over subsets, as the paper reports it."""
    from csclip.eval.suites.core import (
        BenchmarkNotFound,
        SuiteData,
        TextChoice,
        exists,
        expect,
        join,
        read_json,
    )
    from csclip.eval.suites.sugarcrepe_pp import coco_images

    root = join(data_root, "sugarcrepe")
    present = [s for s in SUGARCREPE_SUBSETS if exists(join(root, f"{s}.json"))]
    images = coco_images(data_root, root)
    if not present or images is None:
        raise BenchmarkNotFound(f"sugarcrepe: not found under {root} (expects {LAYOUT})")
    data = SuiteData("sugarcrepe", tie_rule="strict")
    for subset in present:
        uri = join(root, f"{subset}.json")
        rows = read_json(uri)
        expect(isinstance(rows, dict), uri, "an object: index -> {filename, caption, "
               "negative_caption}")
        for _, row in sorted(rows.items(), key=lambda kv: int(kv[0])):
            expect({"filename", "caption", "negative_caption"} <= set(row), uri,
                   "items have filename, caption, negative_caption")
            ref = images.ref(row["filename"])
            if ref is None:
                data.skip(subset)
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(subset, ref, (row["caption"],
                                                              row["negative_caption"]), (0,)))
    return data

"""SugarCrepe (Hsieh et al., NeurIPS 2023; RAIVNLab/sugar-crepe): COCO val2017 images, each
with a caption and a hard negative, in seven subsets; I2T accuracy with ties counted wrong
(its official script). One reader for both ways of pointing at it: the registry's
<data-root>/sugarcrepe, and suites.sugarcrepe_dir + suites.coco_images."""

from __future__ import annotations

import logging

from csclip.errors import DataError
from csclip.eval.encoder import Encoder
from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    check_complete,
    evaluate_suite_data,
    exists,
    expect,
    first_existing,
    join,
    read_json,
)

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

LAYOUT = ("the repository's data/ folder (or its files at the top): {add,replace,swap}_*.json, "
          "index -> {filename, caption, negative_caption}; COCO val2017 images in val2017/ or "
          "images/ beside them, or in <data-root>/coco/val2017/")
FIELDS = {"filename", "caption", "negative_caption"}


def coco_images(data_root: str, root: str) -> ImageFolder | None:
    """The COCO val2017 folder of a COCO-based benchmark: its own val2017/ or images/, else
    the shared <data_root>/coco/val2017/."""
    folder = first_existing(root, "val2017", "images") or first_existing(data_root, "coco/val2017")
    return ImageFolder(folder) if folder else None


def subset_folder(root: str, subsets: tuple[str, ...]) -> str | None:
    """Where a COCO-based benchmark's <subset>.json files are: <root>/data/ (as its
    repository ships them) or <root> itself; None when neither has one."""
    return next((f for f in (join(root, "data"), root)
                 if any(exists(join(f, f"{s}.json")) for s in subsets)), None)


def read_sugarcrepe(folder: str, images: ImageFolder, root: str) -> SuiteData:
    """Every SugarCrepe subset file in `folder`, in index order, images from `images`; a
    record without filename / caption / negative_caption is a counted rejection."""
    data = SuiteData("sugarcrepe", tie_rule="strict", layout=LAYOUT, root=root)
    for subset in SUGARCREPE_SUBSETS:
        uri = join(folder, f"{subset}.json")
        if not exists(uri):
            continue
        rows = read_json(uri)
        expect(isinstance(rows, dict), uri, "an object: index -> {filename, caption, "
               "negative_caption}")
        for _, row in sorted(rows.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            if not (isinstance(row, dict) and FIELDS <= set(row)):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, images, str(row["filename"]))
            if refs is not None:
                data.text_choices.append(TextChoice(
                    subset, refs[0], (row["caption"], row["negative_caption"]), (0,)))
    return data


def load_sugarcrepe_suite(data_root: str) -> SuiteData:
    """SugarCrepe as a suite of the real-data registry (<data_root>/sugarcrepe, local or
    s3://): caption vs negative_caption, strict (its official script counts a tie as
    wrong); `sugarcrepe_i2t` is the mean over subsets, as the paper reports it."""
    root = join(data_root, "sugarcrepe")
    folder = subset_folder(root, SUGARCREPE_SUBSETS)
    images = coco_images(data_root, root)
    if folder is None or images is None:
        raise BenchmarkNotFound(f"sugarcrepe: not found under {root} (expects {LAYOUT})")
    return read_sugarcrepe(folder, images, root)


def load_sugarcrepe_files(directory: str, image_root: str) -> SuiteData:
    """SugarCrepe from a folder of its JSON files (or the repository's data/ under it) and
    a COCO val2017 image folder given apart (suites.sugarcrepe_dir, suites.coco_images).

    Raises DataError when the folder has no subset file or the image folder is missing.
    """
    folder = subset_folder(directory, SUGARCREPE_SUBSETS)
    if folder is None:
        raise DataError(f"{directory}: no SugarCrepe subset files ({', '.join(SUGARCREPE_SUBSETS)}"
                        ".json); point suites.sugarcrepe_dir at the SugarCrepe data folder")
    if not exists(image_root):
        raise DataError(f"COCO image folder {image_root!r} does not exist; set "
                        "suites.coco_images to the folder holding the val2017 images")
    return read_sugarcrepe(folder, ImageFolder(image_root), directory)


def evaluate_sugarcrepe(encoder: Encoder, directory: str, image_root: str,
                        max_per_subset: int | None = None,
                        allow_partial: bool = False) -> dict[str, float]:
    """SugarCrepe from suites.sugarcrepe_dir / suites.coco_images, scored exactly as the
    registry's `sugarcrepe` suite, with its keys: `sugarcrepe_<subset>_i2t`,
    `sugarcrepe_i2t` (mean over subsets), `sugarcrepe_<subset>_{num,skipped,read}`.

    Raises IncompleteBenchmark when an image is missing, unless allow_partial.
    """
    data = load_sugarcrepe_files(str(directory), image_root)
    check_complete(data, allow_partial)
    log.info("%s", data.accounting())
    metrics, _ = evaluate_suite_data(encoder, data.limit(max_per_subset))
    return metrics

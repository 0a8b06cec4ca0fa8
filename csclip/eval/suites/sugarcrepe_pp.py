"""SugarCrepe++ (Dumpala et al., NeurIPS 2024; Sri-Harsha/scpp): two positive captions
(lexically different, same meaning) and one negative per COCO val2017 image."""

from __future__ import annotations

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    first_existing,
    join,
    read_json,
)

LAYOUT = ("{replace_att,replace_obj,replace_rel,swap_att,swap_obj}.json (lists of {id, "
          "filename, caption, caption2, negative_caption}) and COCO val2017 images in "
          "val2017/ (or <data-root>/coco/val2017/)")

SUBSETS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")


def coco_images(data_root: str, root: str) -> ImageFolder | None:
    """The COCO val2017 folder of a COCO-based benchmark: its own val2017/ or images/, else
    the shared <data_root>/coco/val2017/."""
    folder = first_existing(root, "val2017", "images") or first_existing(data_root, "coco/val2017")
    return ImageFolder(folder) if folder else None


def load_sugarcrepe_pp(data_root: str) -> SuiteData:
    """SugarCrepe++'s image-to-text task (ITT): right when BOTH positives score strictly
    above the negative (its official scripts compare with >)."""
    root = join(data_root, "sugarcrepe_pp")
    present = [s for s in SUBSETS if exists(join(root, f"{s}.json"))]
    images = coco_images(data_root, root)
    if not present or images is None:
        raise BenchmarkNotFound(f"sugarcrepe_pp: not found under {root} (expects {LAYOUT})")
    data = SuiteData("sugarcrepe_pp", tie_rule="strict")
    for subset in present:
        uri = join(root, f"{subset}.json")
        rows = read_json(uri)
        rows = list(rows.values()) if isinstance(rows, dict) else rows
        for row in rows:
            expect(isinstance(row, dict) and {"filename", "caption", "caption2",
                                              "negative_caption"} <= set(row), uri,
                   "each item has filename, caption, caption2, negative_caption")
            ref = images.ref(row["filename"])
            if ref is None:
                data.skip(subset)
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(
                subset, ref, (row["caption"], row["caption2"], row["negative_caption"]), (0, 1)))
    return data

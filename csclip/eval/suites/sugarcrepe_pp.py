"""SugarCrepe++ (Dumpala et al., NeurIPS 2024; Sri-Harsha/scpp): two positive captions
(lexically different, same meaning) and one negative per COCO val2017 image."""

from __future__ import annotations

from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    SuiteData,
    TextChoice,
    exists,
    join,
    read_json,
)
from csclip.eval.suites.sugarcrepe import coco_images, subset_folder

LAYOUT = ("the repository's data/ folder (or its files at the top): {replace_att,replace_obj,"
          "replace_rel,swap_att,swap_obj}.json (lists of {id, filename, caption, caption2, "
          "negative_caption}); COCO val2017 images in val2017/ or images/ beside them, or in "
          "<data-root>/coco/val2017/")

SUBSETS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
FIELDS = {"filename", "caption", "caption2", "negative_caption"}


def load_sugarcrepe_pp(data_root: str) -> SuiteData:
    """SugarCrepe++'s image-to-text task (ITT): right when BOTH positives score strictly
    above the negative (its official scripts compare with >)."""
    root = join(data_root, "sugarcrepe_pp")
    folder = subset_folder(root, SUBSETS)
    images = coco_images(data_root, root)
    if folder is None or images is None:
        raise BenchmarkNotFound(f"sugarcrepe_pp: not found under {root} (expects {LAYOUT})")
    data = SuiteData("sugarcrepe_pp", tie_rule="strict", layout=LAYOUT, root=root)
    for subset in SUBSETS:
        uri = join(folder, f"{subset}.json")
        if not exists(uri):
            continue
        rows = read_json(uri)
        rows = list(rows.values()) if isinstance(rows, dict) else rows
        for row in rows:
            if not (isinstance(row, dict) and FIELDS <= set(row)):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, images, str(row["filename"]))
            if refs is not None:
                data.text_choices.append(TextChoice(
                    subset, refs[0], (row["caption"], row["caption2"], row["negative_caption"]),
                    (0, 1)))
    return data

"""MMVP-VLM (Tong et al., CVPR 2024; tsb0601/MMVP, Hugging Face MMVP/MMVP_VLM): pairs of
"CLIP-blind" images with one statement each, in nine visual patterns, read from the
published `Questions.csv` and `MLLM_VLM Images/<Type>/<Question ID>.jpg`.

Official (scripts/evaluate_vlm.py): each statement, prefixed "a photo of ", picks the
image it scores higher (softmax over the pair's two images > 0.5, so a tie picks the
second image); a pair is right when both statements pick their own image (T2I, pair
level), and a category's accuracy is over its pairs, the script's nine category names
given by position (15 pairs each, in file order). Paper (the CS-CLIP authors'
data_loading/mmvp.py): the bare statements, Winoground's strict text / image / group
scores per pair (I2T is their reported number), per the Type column's pattern."""

from __future__ import annotations

import csv
import io
import re

from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    Pair,
    SubsetScores,
    SuiteData,
    exists,
    expect,
    join,
)
from csclip.storage import filesystem_for, read_bytes

LAYOUT = ("Questions.csv (Question ID, Type, Statement; rows 2k-1 and 2k are one pair) and "
          "'MLLM_VLM Images/<Type>/<Question ID>.jpg', as in the MMVP/MMVP_VLM release")
IMAGES = "MLLM_VLM Images"
PROMPT = "a photo of "  # the official script's prefix
# evaluate_vlm.py's categories, in file order: pair k belongs to CATEGORIES[k // 15].
CATEGORIES = ("Orientation and Direction", "Presence of Specific Features",
              "State and Condition", "Quantity and Count", "Positional and Relational Context",
              "Color and Appearance", "Structural Characteristics", "Texts",
              "Viewpoint and Perspective")
PAIRS_PER_CATEGORY = 15


def pattern_subset(pattern: str) -> str:
    """`Orientation and Direction` -> `orientation_and_direction`."""
    return re.sub(r"[^a-z0-9]+", "_", pattern.lower()).strip("_")


def load_mmvp(data_root: str, protocol: str = "official") -> SuiteData:
    """MMVP-VLM's pairs under <data_root>/mmvp; subset = the official category of the
    pair's position (official) or its Type column (paper), slugged. A pair with a
    missing image is skipped and counted."""
    root = join(data_root, "mmvp")
    uri = join(root, "Questions.csv")
    if not exists(uri):
        raise BenchmarkNotFound(f"mmvp: not found under {root} (expects {LAYOUT})")
    filesystem, path = filesystem_for(uri)
    rows = list(csv.reader(io.StringIO(read_bytes(filesystem, path).decode("utf-8-sig"))))[1:]
    rows = [r for r in rows if r]
    expect(all(len(r) >= 3 for r in rows) and len(rows) % 2 == 0, uri,
           "rows of Question ID, Type, Statement, two per pair")
    paper = protocol == "paper"
    images = ImageFolder(join(root, IMAGES))
    data = SuiteData("mmvp", tie_rule="strict", scorer=None if paper else mmvp_pair_accuracy)
    for index, (first, second) in enumerate(zip(rows[0::2], rows[1::2], strict=True)):
        (qid1, pattern, statement1), (qid2, _, statement2) = first[:3], second[:3]
        expect(qid1.strip().isdigit() and qid2.strip().isdigit()
               and int(qid1) % 2 == 1 and int(qid2) == int(qid1) + 1, uri,
               "each pair is an odd Question ID followed by the next one")
        position = index // PAIRS_PER_CATEGORY
        subset = pattern_subset(pattern if paper or position >= len(CATEGORIES)
                                else CATEGORIES[position])
        # The official script opens both images under the first row's Type folder.
        refs = data.resolve(subset, images, *(f"{pattern.strip()}/{int(q)}.jpg"
                                               for q in (qid1, qid2)))
        if refs is None:
            continue
        prefix = "" if paper else PROMPT
        data.pairs.append(Pair(subset, refs[0], refs[1], prefix + statement1.strip(),
                               prefix + statement2.strip()))
    return data


def mmvp_pair_accuracy(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """The official pair accuracy as T2I: statement 1 must score image 1 strictly above
    image 2 (its prediction is image 1 only when its softmax exceeds 0.5), statement 2
    must not (a tie predicts image 2, its own)."""
    correct: dict[str, list[bool]] = {}
    for pair in data.pairs:
        s = features.similarity([pair.image_0, pair.image_1, pair.image_0, pair.image_1],
                                [pair.caption_0, pair.caption_0, pair.caption_1, pair.caption_1])
        first_right = s[0] > s[1]
        second_right = not s[2] > s[3]
        correct.setdefault(pair.subset, []).append(bool(first_right and second_right))
    return {subset: SubsetScores(None, 100.0 * sum(correct[subset]) / len(correct[subset])
                                 if correct.get(subset) else None, None,
                                 len(correct.get(subset, [])))
            for subset in data.subsets()}

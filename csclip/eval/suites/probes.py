"""Benchmarks with their own candidate files: SPEC (Peng et al., CVPR 2024; wjpoom/SPEC:
image2text.json / text2image.json per subset), SVO-Probes (Hendricks & Nematzadeh, 2021;
svo_probes.csv: one sentence, a positive and a negative image) and BLA (Chen et al., EMNLP
2023: two true and two false sentences per image)."""

from __future__ import annotations

import csv
import io

import numpy as np
import torch

from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageChoice,
    ImageFolder,
    SubsetScores,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)
from csclip.storage import filesystem_for, read_bytes

SPEC_LAYOUT = "<subset>/image2text.json and <subset>/text2image.json with the images they name"
SPEC_SUBSETS = ("absolute_size", "relative_size", "absolute_spatial", "relative_spatial",
                "existence", "count")
SVO_LAYOUT = ("the repository's svo_probes.csv (sentence, pos_image_id, neg_image_id, subj_neg, "
              "verb_neg, obj_neg) and the images its URLs name, downloaded as images/<image id>"
              ".jpg (or images/pos_<id>.jpg / neg_<id>.jpg, the CS-CLIP authors' loader)")
BLA_LAYOUT = ("the release's annotations/{active_passive,coordination,relative_clause}_captions"
              ".json and images/<image_id>.jpg, at the top or in bla_benchmark/ (the unpacked "
              "BLA_benchmark.zip)")
BLA_FILES = {"active_passive": "active_passive_captions.json",
             "coordination": "coordination_captions.json",
             "relative_clause": "relative_clause_captions.json"}


def load_spec(data_root: str) -> SuiteData:
    """SPEC's subsets under <data_root>/spec: I2T (an image, candidate texts, label) and
    T2I (a text, candidate images, label). The official code takes torch's argmax (the
    first maximum), so a tie goes to the first candidate."""
    root = join(data_root, "spec")
    present = [s for s in SPEC_SUBSETS if exists(join(root, s, "image2text.json"))]
    if not present:
        raise BenchmarkNotFound(f"spec: not found under {root} (expects {SPEC_LAYOUT})")
    data = SuiteData("spec", tie_rule="argmax_first", layout=SPEC_LAYOUT, root=root)
    for subset in present:
        folder = ImageFolder(join(root, subset))
        for row in read_json(join(root, subset, "image2text.json")):
            if not _is_spec_row(row):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, folder, row["query"])
            if refs is not None:
                data.text_choices.append(TextChoice(subset, refs[0], tuple(row["keys"]),
                                                    (int(row["label"]),)))
        uri = join(root, subset, "text2image.json")
        if not exists(uri):
            continue
        for row in read_json(uri):
            if not _is_spec_row(row):
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, folder, *row["keys"])
            if refs is not None:
                data.image_choices.append(ImageChoice(subset, row["query"], refs,
                                                      int(row["label"])))
    return data


def _is_spec_row(row: object) -> bool:
    return (isinstance(row, dict) and {"query", "keys", "label"} <= set(row)
            and isinstance(row["keys"], list) and len(row["keys"]) >= 2)


def load_svo_probes(data_root: str) -> SuiteData:
    """SVO-Probes, scored as its official notebook (`svo_match_accuracy`): every
    sentence-image pair is a match / no-match decision, and a subset's accuracy is the
    mean of its positive and negative pairs' accuracies (T2I: the benchmark has no foil
    sentences). Subsets by what the negative changes: subj_neg, verb_neg, obj_neg. Each
    item keeps (positive, negative), so the paper protocol's rule (the positive image
    strictly above the negative) reads the same items."""
    root = join(data_root, "svo_probes")
    uri = join(root, "svo_probes.csv")
    if not exists(uri):
        raise BenchmarkNotFound(f"svo_probes: not found under {root} (expects {SVO_LAYOUT})")
    filesystem, path = filesystem_for(uri)
    rows = list(csv.DictReader(io.StringIO(read_bytes(filesystem, path).decode("utf-8"))))
    expect(bool(rows) and {"sentence", "pos_image_id", "neg_image_id"} <= set(rows[0]), uri,
           "columns sentence, pos_image_id, neg_image_id, subj_neg, verb_neg, obj_neg")
    images = ImageFolder(join(root, "images"))
    data = SuiteData("svo_probes", tie_rule="strict", layout=SVO_LAYOUT, root=root,
                     scorer=svo_match_accuracy)
    for row in rows:
        subset = next((k for k in ("subj_neg", "verb_neg", "obj_neg")
                       if str(row.get(k, "")).strip().lower() == "true"), "other")
        ids = [str(row.get(k) or "").strip() for k in ("pos_image_id", "neg_image_id")]
        if not (row.get("sentence") and all(ids)):
            data.skip(subset, reason=MALFORMED_RECORD)
            continue
        names = [_svo_image(images, image_id, side) for image_id, side in zip(ids, ("pos", "neg"),
                                                                              strict=True)]
        refs = data.resolve(subset, images, *names)
        if refs is not None:
            data.image_choices.append(ImageChoice(subset, row["sentence"], refs, 0))
    return data


def _svo_image(images: ImageFolder, image_id: str, side: str) -> str:
    """<id>.jpg, or the CS-CLIP authors' <side>_<id>.jpg when only that is there."""
    authors = f"{side}_{image_id}.jpg"
    return authors if images.ref(authors) and not images.ref(f"{image_id}.jpg") else f"{image_id}.jpg"


def load_bla(data_root: str) -> SuiteData:
    """BLA's three tasks, scored as the official script (`bla_sentence_credit`): the
    four sentences (True1, True2, False1, False2) of the first caption group are ranked
    by their score and each one placed in the right half earns a quarter."""
    root = join(data_root, "bla")
    folder = next((join(root, d) for d in ("", "bla_benchmark", "BLA_benchmark")
                   if any(exists(join(root, d, "annotations", f)) for f in BLA_FILES.values())),
                  None)
    if folder is None:
        raise BenchmarkNotFound(f"bla: not found under {root} (expects {BLA_LAYOUT})")
    present = {s: f for s, f in BLA_FILES.items() if exists(join(folder, "annotations", f))}
    images = ImageFolder(join(folder, "images"))
    data = SuiteData("bla", tie_rule="strict", layout=BLA_LAYOUT, root=root,
                     scorer=bla_sentence_credit)
    for subset, file in present.items():
        uri = join(folder, "annotations", file)
        rows = read_json(uri)
        expect(isinstance(rows, list), uri, "a list of {image_id, caption_group}")
        for row in rows:
            group = _bla_group(row)
            if group is None:  # e.g. an empty caption_group: this record only
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            refs = data.resolve(subset, images, f"{row['image_id']}.jpg")
            if refs is not None:
                texts = (group["True1"], group["True2"], group["False1"], group["False2"])
                data.text_choices.append(TextChoice(subset, refs[0], texts, (0, 1)))
    return data


def _bla_group(row: object) -> dict | None:
    """The record's four sentences (its first caption group, as the official script
    reads it), or None when the record does not have them."""
    if not (isinstance(row, dict) and "image_id" in row and isinstance(row.get("caption_group"),
                                                                       list)):
        return None
    group = row["caption_group"][0] if row["caption_group"] else None
    keys = {"True1", "True2", "False1", "False2"}
    return group if isinstance(group, dict) and keys <= set(group) else None


# ---------------------------------------------------------------------------------------
# Official scorers
# ---------------------------------------------------------------------------------------

def bla_sentence_credit(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """BLA's official `rank_acc` (evaluation_models/clip/utils.py `rank_captions`,
    `get_accuracy`): each item's sentences are ranked by CLIPScore 2.5 * max(cos, 0)
    (highest first); a true sentence ranked in the top half, or a false one in the bottom
    half, earns 1 / (number of sentences); a subset's I2T is the mean credit. Ties (any
    two sentences with cos <= 0 tie at CLIPScore 0) fall as the official `topk` leaves
    them: the same call, torch.topk on the float32 scores on the CPU, which can rank a
    false sentence first (four zeros rank False1, False2, True1, True2; the probes of
    tests/fixtures/official_outputs/bla_ties.json, from the official code)."""
    credit: dict[str, list[float]] = {}
    for item in data.text_choices:
        cosine = features.similarity([item.image] * len(item.texts), list(item.texts))
        clip_score = torch.from_numpy(2.5 * np.maximum(cosine, 0.0)).float()  # (n,)
        order = clip_score.topk(len(item.texts)).indices.numpy()
        rank = np.empty(len(order), dtype=int)
        rank[order] = np.arange(1, len(order) + 1)
        half = len(order) / 2
        right = [(i in item.true_indices) == (rank[i] <= half) for i in range(len(order))]
        credit.setdefault(item.subset, []).append(float(np.mean(right)))
    return {subset: SubsetScores(100.0 * float(np.mean(credit[subset])) if credit.get(subset)
                                 else None, None, None, len(credit.get(subset, [])))
            for subset in data.subsets()}


def svo_match_accuracy(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """SVO-Probes' official notebook (`accuracy`): each unique (sentence, image) pair is
    classified match / no-match; positive accuracy = matched positives, negative accuracy
    = unmatched negatives, the subset's score their mean (its "Avg Accuracy"), as T2I.
    The notebook reads a binary image-text-matching head; a dual encoder has none, so a
    pair matches when its cosine is strictly above the median cosine of all the
    benchmark's unique pairs (one threshold, set without the labels)."""
    pairs: dict[tuple[str, str], float] = {}
    for item in data.image_choices:
        for image in item.images:
            pairs[(item.text, image)] = 0.0
    keys = list(pairs)
    values = features.similarity([k[1] for k in keys], [k[0] for k in keys]) if keys else []
    pairs = dict(zip(keys, map(float, values), strict=True))
    threshold = float(np.median(list(pairs.values()))) if pairs else 0.0
    positives: dict[str, dict[tuple[str, str], bool]] = {}
    negatives: dict[str, dict[tuple[str, str], bool]] = {}
    counts: dict[str, int] = {}
    for item in data.image_choices:
        positive = (item.text, item.images[item.true_index])
        positives.setdefault(item.subset, {})[positive] = pairs[positive] > threshold
        for index, image in enumerate(item.images):
            if index != item.true_index:  # the notebook's drop_duplicates: unique pairs
                negatives.setdefault(item.subset, {})[(item.text, image)] = \
                    pairs[(item.text, image)] <= threshold
        counts[item.subset] = counts.get(item.subset, 0) + 1
    out = {}
    for subset in data.subsets():
        value = None
        if positives.get(subset) and negatives.get(subset):
            value = 50.0 * (float(np.mean(list(positives[subset].values())))
                            + float(np.mean(list(negatives[subset].values()))))
        out[subset] = SubsetScores(None, value, None, counts.get(subset, 0))
    return out

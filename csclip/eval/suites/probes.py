"""Benchmarks with their own candidate files: SPEC (Peng et al., CVPR 2024; wjpoom/SPEC:
image2text.json / text2image.json per subset), SVO-Probes (Hendricks & Nematzadeh, 2021;
svo_probes.csv: one sentence, a positive and a negative image) and BLA (Chen et al., EMNLP
2023: two true and two false sentences per image)."""

from __future__ import annotations

import csv
import io

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageChoice,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)

SPEC_LAYOUT = "<subset>/image2text.json and <subset>/text2image.json with the images they name"
SPEC_SUBSETS = ("absolute_size", "relative_size", "absolute_spatial", "relative_spatial",
                "existence", "count")
SVO_LAYOUT = ("svo_probes.csv (sentence, pos_image_id, neg_image_id, subj_neg, verb_neg, "
              "obj_neg) and images/<image id>.jpg")
BLA_LAYOUT = ("annotations/{active_passive,coordination,relative_clause}_captions.json and "
              "images/<image_id>.jpg")
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
    data = SuiteData("spec", tie_rule="argmax_first")
    for subset in present:
        folder = ImageFolder(join(root, subset))
        uri = join(root, subset, "image2text.json")
        for row in read_json(uri):
            expect({"query", "keys", "label"} <= set(row), uri, "items have query, keys, label")
            ref = folder.ref(row["query"])
            if ref is None:
                data.skip(subset)
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(subset, ref, tuple(row["keys"]),
                                                (int(row["label"]),)))
        uri = join(root, subset, "text2image.json")
        if not exists(uri):
            continue
        for row in read_json(uri):
            expect({"query", "keys", "label"} <= set(row), uri, "items have query, keys, label")
            refs = [folder.ref(k) for k in row["keys"]]
            if None in refs:
                data.skip(subset)
                continue
            data.images.update({r: r for r in refs})
            data.image_choices.append(ImageChoice(subset, row["query"], tuple(refs),
                                                  int(row["label"])))
    return data


def load_svo_probes(data_root: str) -> SuiteData:
    """SVO-Probes: the sentence must score its positive image strictly above the negative
    one (T2I only: the benchmark has no foil sentences). Subsets by what the negative
    changes: subj_neg, verb_neg, obj_neg."""
    from csclip.storage import filesystem_for, read_bytes

    root = join(data_root, "svo_probes")
    uri = join(root, "svo_probes.csv")
    if not exists(uri):
        raise BenchmarkNotFound(f"svo_probes: not found under {root} (expects {SVO_LAYOUT})")
    filesystem, path = filesystem_for(uri)
    rows = list(csv.DictReader(io.StringIO(read_bytes(filesystem, path).decode("utf-8"))))
    expect(bool(rows) and {"sentence", "pos_image_id", "neg_image_id"} <= set(rows[0]), uri,
           "columns sentence, pos_image_id, neg_image_id, subj_neg, verb_neg, obj_neg")
    images = ImageFolder(join(root, "images"))
    data = SuiteData("svo_probes", tie_rule="strict")
    for row in rows:
        subset = next((k for k in ("subj_neg", "verb_neg", "obj_neg")
                       if str(row.get(k, "")).strip().lower() == "true"), "other")
        refs = [images.ref(f"{row[k].strip()}.jpg") for k in ("pos_image_id", "neg_image_id")]
        if None in refs:
            data.skip(subset)
            continue
        data.images.update({r: r for r in refs})
        data.image_choices.append(ImageChoice(subset, row["sentence"], tuple(refs), 0))
    return data


def load_bla(data_root: str) -> SuiteData:
    """BLA's three tasks: right when both True sentences score strictly above both False
    ones. Ours: the official script ranks the four sentences and gives partial credit per
    sentence in the right half; the all-or-nothing item rule is the paper's I2T
    definition (SPEC §5) and has no tie ambiguity."""
    root = join(data_root, "bla")
    present = {s: f for s, f in BLA_FILES.items() if exists(join(root, "annotations", f))}
    if not present:
        raise BenchmarkNotFound(f"bla: not found under {root} (expects {BLA_LAYOUT})")
    images = ImageFolder(join(root, "images"))
    data = SuiteData("bla", tie_rule="strict")
    for subset, file in present.items():
        uri = join(root, "annotations", file)
        for row in read_json(uri):
            expect("image_id" in row and row.get("caption_group"), uri,
                   "items have image_id and caption_group")
            group = row["caption_group"][0]
            expect({"True1", "True2", "False1", "False2"} <= set(group), uri,
                   "caption_group entries have True1, True2, False1, False2")
            ref = images.ref(f"{row['image_id']}.jpg")
            if ref is None:
                data.skip(subset)
                continue
            data.images[ref] = ref
            texts = (group["True1"], group["True2"], group["False1"], group["False2"])
            data.text_choices.append(TextChoice(subset, ref, texts, (0, 1)))
    return data

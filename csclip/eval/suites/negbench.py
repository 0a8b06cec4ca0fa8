"""NegBench (Alhamoud et al., CVPR 2025; m1k2zoo/negbench): negation in multiple-choice
questions, read from the published MCQ CSV files (`images/<name>_mcq_*.csv`: image_path,
caption_0..caption_3, correct_answer, correct_answer_template).

Both protocols score as the official benchmarks/src/evaluation/mcq.py (and the CS-CLIP
authors' loader): the prediction is torch.argmax over the candidates (a tie goes to the
first), right when it is correct_answer. Not read: the retrieval CSVs (Recall@k over a
gallery, not a choice) and the MSR-VTT files (video)."""

from __future__ import annotations

import csv
import io
import logging
import posixpath

from csclip.eval.suites.core import (
    BenchmarkNotFound,
    ImageFolder,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
)

log = logging.getLogger(__name__)

LAYOUT = ("images/COCO_val_mcq_llama3.1_rephrased.csv and/or "
          "images/VOC2007_mcq_llama3.1_rephrased.csv (image_path, caption_0..caption_3, "
          "correct_answer), with each image_path's last folder and file (val2017/<file>, "
          "JPEGImages/<file>) under negbench/")
MCQ_FILES = {"coco_mcq": "COCO_val_mcq_llama3.1_rephrased.csv",
             "voc2007_mcq": "VOC2007_mcq_llama3.1_rephrased.csv"}
NOT_READ = ("msr_vtt_mcq_rephrased_llama.csv", "COCO_val_retrieval.csv",
            "COCO_val_negated_retrieval_llama3.1_rephrased_affneg_true.csv")


def _image(images: ImageFolder, path: str) -> str | None:
    """The image an absolute image_path of the published CSV names: its last folder and
    file, then its file alone, under the benchmark folder (the README asks users to
    rewrite the paths to their own copy; this reads them unchanged)."""
    parts = [p for p in path.replace("\\", "/").split("/") if p]
    for tail in ("/".join(parts[-2:]), parts[-1] if parts else "", path):
        if tail and not posixpath.isabs(tail):
            ref = images.ref(tail)
            if ref is not None:
                return ref
    return None


def load_negbench(data_root: str, protocol: str = "official") -> SuiteData:
    """NegBench's image MCQ subsets under <data_root>/negbench (coco_mcq, voc2007_mcq)."""
    from csclip.storage import filesystem_for, read_bytes

    root = join(data_root, "negbench")
    found = {s: join(root, "images", f) for s, f in MCQ_FILES.items()
             if exists(join(root, "images", f))}
    if not found:
        raise BenchmarkNotFound(f"negbench: not found under {root} (expects {LAYOUT})")
    unread = [f for f in NOT_READ if exists(join(root, "images", f)) or exists(join(root, "videos", f))]
    if unread:
        log.info("negbench: %s not read (retrieval or video tasks)", ", ".join(unread))
    images = ImageFolder(root)
    data = SuiteData("negbench", tie_rule="argmax_first")
    for subset, uri in found.items():
        filesystem, path = filesystem_for(uri)
        rows = list(csv.DictReader(io.StringIO(read_bytes(filesystem, path).decode("utf-8"))))
        columns = set(rows[0]) if rows else set()
        options = sorted((c for c in columns if c.startswith("caption_")),
                         key=lambda c: int(c.split("_")[1]) if c.split("_")[1].isdigit() else 99)
        expect(bool(rows) and {"image_path", "correct_answer"} <= columns and len(options) >= 2,
               uri, "columns image_path, caption_0..caption_3, correct_answer")
        for row in rows:
            expect(str(row["correct_answer"]).strip().isdigit()
                   and int(row["correct_answer"]) < len(options), uri,
                   "correct_answer is the index of one caption_k")
            ref = _image(images, row["image_path"])
            if ref is None:
                data.skip(subset, example=str(row["image_path"]))
                continue
            data.images[ref] = ref
            data.text_choices.append(TextChoice(subset, ref, tuple(row[c] for c in options),
                                                (int(row["correct_answer"]),)))
    return data

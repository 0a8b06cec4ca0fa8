"""VL-CheckList (Zhao et al., 2022; om-ai-lab/VL-CheckList): its corpus of YAML configs
(ANNO_PATH, IMG_ROOT) pointing at JSON lists of [image path, {POS: [...], NEG: [...]}],
scored as its image-text contrastive task (`itc`: the first positive against the first
negative, strict, over the first 1,000 rows of each corpus), or as the CS-CLIP authors'
code (protocol "paper": every row, the best positive against the best negative)."""

from __future__ import annotations

import numpy as np
import pyarrow.fs as pafs
import yaml

from csclip.errors import DataError
from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import (
    MALFORMED_RECORD,
    BenchmarkNotFound,
    ImageFolder,
    SubsetScores,
    SuiteData,
    TextChoice,
    exists,
    expect,
    join,
    read_json,
)
from csclip.storage import filesystem_for, inside_folder, read_bytes

LAYOUT = ("the repository's corpus/v1/<Attribute|Object|Relation>/.../<name>.yaml (ANNO_PATH, "
          "IMG_ROOT) and the data/ JSON files they name, with the image folders (vg/, swig/, "
          "hake/) named by IMG_ROOT")

# The official evaluate.py (itc) keeps d.data[name][:MAX_NUM / 2] per corpus, with the
# repository's configs/sample.yaml MAX_NUM = 2000: the first 1,000 rows whose image exists.
OFFICIAL_ROWS_PER_CORPUS = 1000


def _corpus_files(corpus: str) -> list[tuple[str, list[str]]]:
    """Each corpus config (.yaml) under `corpus` (<root>/corpus/v1): its URI and its path
    parts below `corpus`. The parts are cut from the listing's own paths with the length of
    the path it was listed from (filesystem_for resolves a relative, `file://` or
    trailing-slash root once), so a relative --data-root names the same subsets as an
    absolute one."""
    filesystem, path = filesystem_for(corpus)
    infos = filesystem.get_file_info(pafs.FileSelector(path, recursive=True, allow_not_found=True))
    scheme = "s3://" if corpus.startswith("s3://") else ""
    return [(scheme + i.path, i.path[len(path) + 1:].split("/"))
            for i in sorted(infos, key=lambda i: i.path)
            if i.type == pafs.FileType.File and i.path.endswith(".yaml")]


def load_vl_checklist(data_root: str, protocol: str = "official") -> SuiteData:
    """Every corpus config under <data_root>/vl_checklist/corpus/v1; subset =
    <type>_<category> (attribute_color, object_location, object_size, relation_action,
    relation_spatial, ...), pooling that category's corpora. Official (`itc` in
    evaluate.py): the first 1,000 rows of each corpus whose image exists, right when the
    image scores its first POS text strictly above its first NEG text. Paper (the CS-CLIP
    authors' loader): every row, right when the best POS text scores strictly above the
    best NEG text (`best_positive_above_best_negative`)."""
    root = join(data_root, "vl_checklist")
    configs = _corpus_files(join(root, "corpus", "v1")) if exists(join(root, "corpus")) else []
    if not configs:
        raise BenchmarkNotFound(f"vl_checklist: not found under {root} (expects {LAYOUT})")
    paper = protocol == "paper"
    data = SuiteData("vl_checklist", tie_rule="strict",
                     scorer=best_positive_above_best_negative if paper else None)
    for uri, parts in configs:
        subset = f"{parts[0].lower()}_{parts[1].lower()}" if len(parts) > 2 else parts[0].lower()
        filesystem, path = filesystem_for(uri)
        try:
            config = yaml.safe_load(read_bytes(filesystem, path))
        except (yaml.YAMLError, UnicodeDecodeError) as err:
            raise DataError(f"{uri}: not a YAML corpus config "
                            f"({str(err).splitlines()[0] if str(err) else type(err).__name__})"
                            ) from err
        expect(isinstance(config, dict) and {"ANNO_PATH", "IMG_ROOT"} <= set(config), uri,
               "a corpus config with ANNO_PATH and IMG_ROOT")
        expect(all(isinstance(config[k], str) and inside_folder(config[k])
                   for k in ("ANNO_PATH", "IMG_ROOT")), uri,
               "ANNO_PATH and IMG_ROOT relative to the benchmark's folder, inside it")
        annotation = join(root, config["ANNO_PATH"])
        if not exists(annotation):
            continue  # a corpus whose annotation file is not here: not part of this copy
        images = ImageFolder(join(root, config["IMG_ROOT"]))
        kept = 0
        for row in read_json(annotation):
            if not (isinstance(row, list) and len(row) == 2 and isinstance(row[1], dict)
                    and row[1].get("POS") and row[1].get("NEG")):  # [image, {POS, NEG}]
                data.skip(subset, reason=MALFORMED_RECORD)
                continue
            if not paper and kept >= OFFICIAL_ROWS_PER_CORPUS:
                break
            refs = data.resolve(subset, images, row[0])
            if refs is None:
                continue
            kept += 1
            positives, negatives = list(row[1]["POS"]), list(row[1]["NEG"])
            texts = (*positives, *negatives) if paper else (positives[0], negatives[0])
            data.text_choices.append(TextChoice(subset, refs[0], tuple(texts),
                                                tuple(range(len(positives) if paper else 1))))
    return data


def best_positive_above_best_negative(features: FeatureTables,
                                      data: SuiteData) -> dict[str, SubsetScores]:
    """The CS-CLIP authors' VL-CheckList rule: right when the highest-scoring POS text
    scores strictly above the highest-scoring NEG text; a subset pools its corpora."""
    correct: dict[str, list[bool]] = {}
    for item in data.text_choices:
        scores = features.similarity([item.image] * len(item.texts), list(item.texts))
        is_true = np.zeros(len(scores), dtype=bool)
        is_true[list(item.true_indices)] = True
        correct.setdefault(item.subset, []).append(bool(scores[is_true].max()
                                                        > scores[~is_true].max()))
    return {s: SubsetScores(100.0 * float(np.mean(correct[s])) if correct.get(s) else None,
                            None, None, len(correct.get(s, []))) for s in data.subsets()}

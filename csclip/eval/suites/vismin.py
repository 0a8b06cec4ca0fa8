"""VisMin (Awal et al., NeurIPS 2024; the Hugging Face release mair-lab/vismin-bench):
minimal-change image pairs, each with its two captions, in four categories (object,
attribute, relation, counting), read from the release's Arrow (`save_to_disk`) or
Parquet files with the images inline.

Official (VisMin's contrastive evaluation, as the CS-CLIP authors'
`compute_contrastive_accuracy_from_embs` restates it): Winoground's strict text, image
and group scores per category. Paper (the authors' reported `text_contrastive_accuracy`):
over all pairs, text_0 scoring image_0 strictly above image_1 (I2T as they name it),
text_1 scoring image_1 above image_0 (T2I), and both (Group). The paper also reports the
four categories: the authors' `compute_contrastive_accuracy_from_embs` (VisMin's official
Winoground scores per category) under `group_contrastive_accuracy`, here the breakdown
subsets `category_<category>`. VisMin's paper number (`vismin_paper_average`) is what the
paper's compositional average took: the equal mean of the pooled "all" and the four
categories rounded as the authors round them (Group: the categories alone)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from csclip.eval.encoder import FeatureTables
from csclip.eval.suites.core import (
    BenchmarkNotFound,
    Pair,
    SubsetScores,
    SuiteData,
    expect,
    join,
    pair_correct,
)
from csclip.eval.suites.mmvp import pattern_subset
from csclip.storage import filesystem_for, list_files

LAYOUT = ("the release's data/test/*.arrow (datasets' save_to_disk) or *.parquet files, "
          "columns image_0, image_1 ({bytes, path}), text_0, text_1, category")
COLUMNS = {"image_0", "image_1", "text_0", "text_1", "category"}
CATEGORY = "category_"  # the paper protocol's per-category breakdown subsets: category_object


@dataclass(frozen=True)
class VisMinPair(Pair):
    """A pair and its VisMin category (slugged), kept when the paper protocol pools it."""

    category: str = ""


def _tables(root: str) -> list[tuple[str, object]]:
    """(file, pyarrow Table) of every Arrow / Parquet file under root, root/data,
    root/data/test, in sorted order."""
    out = []
    for folder in (root, join(root, "data"), join(root, "data", "test")):
        filesystem, path = filesystem_for(folder)
        for file in sorted(list_files(filesystem, path, ".parquet")):
            out.append((file, pq.read_table(file, filesystem=filesystem)))
        for file in sorted(list_files(filesystem, path, ".arrow")):
            with filesystem.open_input_file(file) as handle:
                payload = handle.read()
            try:  # datasets' save_to_disk writes the Arrow streaming format
                table = pa.ipc.open_stream(payload).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(payload).read_all()
            out.append((file, table))
    return out


def load_vismin(data_root: str, protocol: str = "official") -> SuiteData:
    """VisMin's pairs under <data_root>/vismin; subset = category (official) or "all"
    (paper)."""
    root = join(data_root, "vismin")
    tables = _tables(root)
    if not tables:
        raise BenchmarkNotFound(f"vismin: not found under {root} (expects {LAYOUT})")
    paper = protocol == "paper"
    data = SuiteData("vismin", tie_rule="strict", scorer=vismin_paper_scores if paper else None,
                     average=vismin_paper_average if paper else None)
    for file, table in tables:
        expect(COLUMNS <= set(table.column_names), file,
               "columns image_0, image_1, text_0, text_1, category")
        for index, row in enumerate(table.to_pylist()):
            keys = []
            for column in ("image_0", "image_1"):
                image = row[column]
                key = f"vismin/{file}:{row.get('id', index)}/{column}"
                data.images[key] = image.get("bytes") if isinstance(image, dict) else image
                keys.append(key)
            category = pattern_subset(str(row["category"]))
            data.pairs.append(VisMinPair("all" if paper else category, keys[0], keys[1],
                                         row["text_0"], row["text_1"], category))
    if paper:
        data.breakdown = frozenset(CATEGORY + p.category for p in data.pairs
                                   if isinstance(p, VisMinPair))
    return data


def vismin_paper_scores(features: FeatureTables, data: SuiteData) -> dict[str, SubsetScores]:
    """The CS-CLIP authors' VisMin numbers: per pair, correct_0 = s(image_0, text_0) >
    s(image_1, text_0) and correct_1 = s(image_1, text_1) > s(image_0, text_1); their
    `text_contrastive_accuracy` is the mean of correct_0 (here I2T), their image one of
    correct_1 (T2I), their group one of both. Beside them, per category
    (`category_<category>`, data.breakdown): what they store per category under
    `group_contrastive_accuracy` and their tables report as VisMin's categories, the
    official Winoground text (I2T), image (T2I) and group scores (not rounded here;
    they round each to two decimals of a fraction, as vismin_paper_average does)."""
    rows: dict[str, list[tuple[bool, bool]]] = {}
    official: dict[str, list[tuple[bool, bool]]] = {}
    for pair in data.pairs:
        s = features.similarity([pair.image_0, pair.image_1, pair.image_1, pair.image_0],
                                [pair.caption_0, pair.caption_0, pair.caption_1, pair.caption_1])
        rows.setdefault(pair.subset, []).append((bool(s[0] > s[1]), bool(s[2] > s[3])))
        if isinstance(pair, VisMinPair) and CATEGORY + pair.category in data.breakdown:
            # s(I_i, C_j): s00 = s[0], s01 = s[3], s10 = s[1], s11 = s[2]
            official.setdefault(CATEGORY + pair.category, []).append(
                pair_correct(float(s[0]), float(s[3]), float(s[1]), float(s[2])))
    out = {subset: _scores(rows.get(subset, [])) for subset in data.subsets()}
    out.update({subset: _scores(official[subset]) for subset in sorted(official)})
    return out


def _scores(rows: list[tuple[bool, bool]]) -> SubsetScores:
    """Percent of the first flags (I2T), the second (T2I) and both (Group)."""
    values = np.array(rows, dtype=bool).reshape(-1, 2)
    if not len(values):
        return SubsetScores(None, None, None, 0)
    return SubsetScores(100.0 * values[:, 0].mean(), 100.0 * values[:, 1].mean(),
                        100.0 * values.all(1).mean(), len(values))


def vismin_paper_average(subsets: Mapping[str, SubsetScores], direction: str) -> float | None:
    """VisMin's number in the paper's compositional average (Tables 16-17), as the authors'
    table notebooks compute it (kargibora/CS-CLIP 16276c7, comp_benchmarks_tables.ipynb
    cell 7, ablation_combined_figures.ipynb cells 39 and 42: `load_compositional_metrics`
    averages a dataset's "all" and its four categories equally): I2T / T2I = the mean of
    the pooled "all" and each category's official text / image score, the latter rounded
    to whole percents as `compute_contrastive_accuracy_from_embs` rounds it
    (`round(correct / count, 2)`); Group = the mean of the categories' group scores (their
    results keep no pooled group: the per-category dict overwrites it). CS-CLIP: (78.6 +
    80 + 50 + 86 + 8) / 5 = 60.5. None without a category score (the pooled "all" alone)."""
    values = [_authors_percent(scores, direction) for subset, scores in sorted(subsets.items())
              if subset.startswith(CATEGORY)]
    values = [v for v in values if v is not None]
    if not values:
        return None
    pooled = subsets.get("all")
    if direction != "group" and pooled is not None and getattr(pooled, direction) is not None:
        values.append(getattr(pooled, direction))
    return float(np.mean(values))


def _authors_percent(scores: SubsetScores, direction: str) -> float | None:
    """A category's score as the authors keep it: round(correct / count, 2), in percent."""
    value = getattr(scores, direction)
    if value is None or not scores.num_items:
        return None
    correct = round(value * scores.num_items / 100)
    return 100 * round(correct / scores.num_items, 2)

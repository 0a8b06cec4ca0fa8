"""The paper's numbers, as the authors' own outputs print them (kargibora/CS-CLIP at
commit 16276c7, the last commit that holds the LaTeX tables and the ablation notebooks),
for `csclip report --paper` (csclip.report.paper). Nothing here is typed from the
paper's PDF: every number is copied from the file named as its source, and every table
says, per column (and per row where a row comes from elsewhere), which file@commit that is.

Which paper table is which (docs/paper_report.md, "Where the numbers come from"):
- Table 1 (Acc_HT and Δ per entity / relation / overall): ht_delta_table.tex; its Acc
  columns are ht_summary_table.tex's. CLIP-FT is in neither: its Acc_HT comes from the
  "CLIP Fine-tuning" row of ablation_combined_figures.ipynb (no Δ printed there).
- Table 6 (Acc_HT per condition): ht_per_condition_table.tex.
- Table 7 (win rate s(A+) > s(A-), "full truth > half truth"): ft_summary_table.tex
  and ft_per_condition_table.tex; the consistency column s(A+) > s(A) is the Overall of
  consistency_summary_table.tex.
- Tables 16 and 17 (ablations): the saved output of cell 42 ("COMBINED SUMMARY") of
  experiments/fig_notebooks/ablation_combined_figures.ipynb, the only output that prints
  every column (compositional I2T / T2I / Group, HT All / Entity / Relation, ZS Avg,
  Retr I2T / T2I); the per-axis notebooks experiments/ablations/ablation_<axis>.ipynb
  print the compositional columns only (over another benchmark mix). Table 16 holds the
  training-data axes (N, relation fraction, swap fraction), Table 17 the optimisation
  axes (learning rate, weight decay, batch size): the order in which that notebook and
  SPEC §3 list them; the row ids are csclip.ablation.grid.PAPER_ROWS'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

REPOSITORY = "kargibora/CS-CLIP"
COMMIT = "16276c7"


def _at(path: str) -> str:
    return f"{path}@{COMMIT}"


HT_DELTA = _at("experiments/paper_figures/ht_delta_table.tex")
HT_PER_CONDITION = _at("experiments/paper_figures/ht_per_condition_table.tex")
FT_SUMMARY = _at("experiments/paper_figures/ft_summary_table.tex")
FT_PER_CONDITION = _at("experiments/paper_figures/ft_per_condition_table.tex")
CONSISTENCY_SUMMARY = _at("experiments/paper_figures/consistency_summary_table.tex")
ABLATION_SUMMARY = _at("experiments/fig_notebooks/ablation_combined_figures.ipynb") + \
    " (cell 42's saved output, COMBINED SUMMARY)"

# Our Table 6 / 7 condition slugs (csclip.eval.halftruth CONDITIONS), in the paper's order.
CONDITION_SLUGS: tuple[str, ...] = ("obj", "attr", "rand", "rel_attr", "rel_obj", "ant",
                                    "swap", "subj")
CONDITION_HEADERS: tuple[str, ...] = ("+Obj", "+Attr", "+Rand", "Rel:Attr", "Rel:Obj", "Ant",
                                      "Swap", "Subj")


@dataclass(frozen=True)
class Column:
    key: str  # our metric key (Tables 1, 6, 7) or ablation.csv column (Tables 16, 17)
    header: str  # the paper's header
    kind: str  # "acc": percent, one decimal; "gap": a cosine difference, three decimals


@dataclass(frozen=True)
class PaperTable:
    """One of the paper's tables: its columns, its rows' numbers, and where each came from
    (`sources`: column key -> file@commit; `row_sources`: a row taken from another file,
    for all its columns). `labels`: a row id's name in the authors' table, where the id
    is not that name (Tables 16-17: csclip.ablation.grid.PAPER_ROWS ids)."""

    stem: str
    title: str
    columns: tuple[Column, ...]
    rows: Mapping[str, Mapping[str, float]]
    sources: Mapping[str, str]
    row_sources: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)

    def number(self, row: str | None, key: str) -> float | None:
        return None if row is None else self.rows.get(row, {}).get(key)

    def source(self, row: str, key: str) -> str | None:
        """The file@commit a number came from (None where the paper has no number)."""
        if self.number(row, key) is None:
            return None
        return self.row_sources.get(row) or self.sources[key]


def _table(keys: tuple[str, ...], values: Mapping[str, tuple[float, ...]]
           ) -> dict[str, dict[str, float]]:
    return {name: dict(zip(keys, row, strict=True)) for name, row in values.items()}


_T1_COLUMNS = (
    Column("ht_entity", "Entity Acc", "acc"), Column("ht_gap_entity", "Entity Δ", "gap"),
    Column("ht_relation", "Relation Acc", "acc"), Column("ht_gap_relation", "Relation Δ", "gap"),
    Column("ht_all", "Overall Acc", "acc"), Column("ht_gap", "Overall Δ", "gap"),
)
_T1_ROWS = _table(tuple(c.key for c in _T1_COLUMNS), {
    "CS-CLIP": (75.4, 0.021, 65.5, 0.014, 69.3, 0.017),
    "FSC-CLIP-CC3M": (77.7, 0.023, 54.1, 0.001, 63.1, 0.01),
    "CON-CLIP": (76.0, 0.02, 48.8, -0.002, 59.2, 0.007),
    "FSC-CLIP-COCO": (74.9, 0.021, 47.9, -0.003, 58.2, 0.006),
    "ReadCLIP": (69.4, 0.013, 51.0, 0.0, 58.0, 0.005),
    "NegCLIP": (69.8, 0.011, 48.3, -0.003, 56.5, 0.002),
    "FSC-CLIP-LAION": (70.2, 0.014, 45.9, -0.008, 55.2, 0.0),
    "LA-CLIP": (66.7, 0.019, 47.8, -0.002, 55.1, 0.006),
    "SigLIP2": (69.9, 0.013, 45.2, -0.005, 54.6, 0.002),
    "DEGLA": (68.3, 0.009, 38.2, -0.012, 49.7, -0.004),
    "CE-CLIP": (59.1, 0.002, 42.9, -0.006, 49.1, -0.003),
    "LabCLIP": (64.2, 0.01, 39.2, -0.017, 48.8, -0.007),
    "DAC-LLM": (61.1, 0.004, 37.1, -0.014, 46.3, -0.007),
    "TripletCLIP": (60.0, 0.005, 37.2, -0.01, 45.9, -0.004),
    "TSVLC": (59.6, 0.003, 37.3, -0.013, 45.8, -0.007),
    "SigLIP": (56.9, -0.0, 38.8, -0.018, 45.7, -0.011),
    "DAC-SAM": (58.6, 0.002, 37.0, -0.013, 45.3, -0.008),
    "CLIC-LAION": (61.5, 0.005, 29.1, -0.021, 41.5, -0.011),
    "CLIC-RedCaps": (57.5, 0.002, 30.4, -0.018, 40.8, -0.01),
    "CLIP": (52.9, -0.002, 32.9, -0.017, 40.6, -0.011),
    "CLoVe": (57.9, 0.001, 29.6, -0.021, 40.4, -0.013),
})
# Not in ht_delta_table.tex: the "CLIP Fine-tuning" row of the ablation notebook's loss
# function group (HT_All 48.8, HT_Entity 68.0, HT_Relation 36.9; no Δ printed).
_T1_ROWS["CLIP-FT"] = {"ht_entity": 68.0, "ht_relation": 36.9, "ht_all": 48.8}

_T6_COLUMNS = tuple(Column(f"ht_{slug}", header, "acc")
                    for slug, header in zip(CONDITION_SLUGS, CONDITION_HEADERS, strict=True))
_T6_ROWS = _table(tuple(c.key for c in _T6_COLUMNS), {
    "CE-CLIP": (48.0, 31.5, 78.9, 23.5, 36.7, 21.3, 63.9, 57.3),
    "CLIC-LAION": (49.0, 33.1, 82.8, 20.5, 33.5, 13.7, 22.5, 58.4),
    "CLIC-RedCaps": (45.2, 27.1, 79.3, 22.7, 35.5, 15.7, 22.0, 60.3),
    "CLIP": (41.3, 27.1, 72.6, 25.5, 37.9, 21.0, 24.2, 59.4),
    "CLoVe": (43.4, 32.1, 80.3, 21.8, 32.1, 19.9, 25.8, 48.6),
    "CON-CLIP": (69.1, 48.0, 91.9, 45.9, 64.4, 34.2, 34.0, 72.4),
    "CS-CLIP": (68.9, 43.6, 92.2, 40.1, 66.6, 66.8, 64.1, 75.7),
    "DAC-LLM": (49.1, 34.1, 81.5, 31.9, 43.5, 24.7, 28.4, 61.6),
    "DAC-SAM": (46.7, 32.1, 78.7, 32.2, 43.5, 25.1, 27.8, 61.2),
    "DEGLA": (56.5, 40.5, 88.7, 26.5, 38.3, 20.9, 41.8, 61.4),
    "FSC-CLIP-CC3M": (67.7, 55.0, 94.8, 51.5, 63.7, 44.0, 43.1, 73.1),
    "FSC-CLIP-COCO": (65.3, 47.0, 93.3, 41.4, 58.6, 30.1, 41.3, 71.2),
    "FSC-CLIP-LAION": (57.7, 46.6, 89.9, 42.3, 51.8, 34.4, 38.6, 66.9),
    "LA-CLIP": (60.0, 45.8, 80.0, 44.9, 56.5, 38.6, 40.3, 62.0),
    "LabCLIP": (52.0, 35.3, 85.6, 28.1, 42.7, 21.4, 40.6, 61.5),
    "NegCLIP": (59.3, 41.9, 89.0, 38.9, 53.2, 28.8, 49.3, 71.0),
    "ReadCLIP": (58.9, 41.2, 88.8, 33.9, 48.8, 24.7, 70.7, 67.2),
    "SigLIP": (46.8, 34.8, 73.8, 38.1, 48.4, 26.2, 21.6, 69.9),
    "SigLIP2": (60.8, 41.8, 87.9, 43.9, 63.3, 31.3, 24.5, 72.6),
    "TSVLC": (47.6, 33.0, 79.9, 32.3, 44.5, 24.1, 27.9, 62.5),
    "TripletCLIP": (51.4, 37.1, 75.8, 35.1, 45.8, 25.3, 27.8, 57.3),
})

_T7_COLUMNS = (
    Column("winrate_entity", "Entity", "acc"), Column("winrate_relation", "Relation", "acc"),
    Column("winrate_gap", "Gap", "acc"), Column("winrate_all", "Overall", "acc"),
    *(Column(f"winrate_{slug}", header, "acc")
      for slug, header in zip(CONDITION_SLUGS, CONDITION_HEADERS, strict=True)),
    Column("consistency_all", "Consistency s(A+) > s(A)", "acc"),
)
_T7_ROWS = _table(tuple(c.key for c in _T7_COLUMNS), {
    "CS-CLIP": (90.3, 91.6, -1.3, 91.1, 89.4, 79.3, 94.9, 80.3, 89.8, 93.4, 93.6, 93.6, 81.6),
    "CE-CLIP": (89.3, 89.0, 0.4, 89.1, 87.6, 78.1, 94.7, 80.0, 88.8, 83.3, 93.9, 93.3, 88.4),
    "DEGLA": (88.2, 88.3, -0.2, 88.3, 85.4, 78.9, 93.9, 80.4, 87.2, 84.0, 93.2, 92.0, 85.4),
    "ReadCLIP": (87.9, 87.3, 0.6, 87.6, 85.4, 77.5, 93.8, 78.8, 87.8, 76.3, 96.0, 92.1, 80.5),
    "FSC-CLIP-CC3M": (88.1, 86.2, 2.0, 86.9, 85.9, 77.0, 94.0, 78.0, 87.4, 84.3, 85.7, 91.6, 66.8),
    "FSC-CLIP-COCO": (88.6, 85.9, 2.7, 86.9, 86.1, 78.0, 94.5, 79.0, 87.8, 77.2, 90.2, 91.8, 78.3),
    "FSC-CLIP-LAION": (87.2, 86.0, 1.1, 86.5, 84.8, 76.5, 93.0, 78.4, 86.5, 82.3, 88.0, 91.1, 75.6),
    "CLoVe": (87.8, 84.4, 3.4, 85.7, 85.6, 77.8, 93.3, 78.6, 87.2, 84.8, 80.3, 89.3, 88.4),
    "NegCLIP": (86.8, 84.1, 2.7, 85.1, 84.4, 75.5, 92.8, 77.0, 85.5, 73.6, 89.8, 90.7, 76.4),
    "LabCLIP": (87.2, 83.1, 4.1, 84.6, 84.4, 75.8, 93.5, 76.9, 86.3, 69.7, 89.1, 90.6, 81.5),
    "CLIC-LAION": (86.7, 79.0, 7.8, 81.9, 84.2, 75.1, 93.1, 74.7, 84.8, 70.6, 74.9, 91.0, 86.9),
    "CLIC-RedCaps": (86.5, 77.8, 8.7, 81.2, 84.3, 74.6, 92.7, 74.6, 85.0, 69.3, 72.0, 90.5, 86.5),
    "DAC-LLM": (84.7, 76.5, 8.2, 79.6, 83.2, 71.1, 90.7, 72.1, 83.3, 69.6, 70.4, 88.4, 79.9),
    "CLIP": (84.9, 75.8, 9.1, 79.3, 83.5, 71.7, 90.6, 72.2, 82.7, 68.0, 69.4, 88.8, 82.8),
    "DAC-SAM": (84.6, 75.3, 9.3, 78.9, 82.7, 71.7, 90.7, 72.1, 83.1, 68.5, 67.3, 88.1, 79.6),
    "TSVLC": (84.8, 75.1, 9.7, 78.8, 82.8, 72.5, 90.9, 73.5, 83.0, 64.9, 68.8, 89.1, 79.7),
    "SigLIP2": (89.3, 71.1, 18.1, 78.1, 89.2, 78.6, 92.9, 79.0, 88.6, 62.6, 46.7, 93.8, 76.4),
    "SigLIP": (88.2, 69.4, 18.8, 76.6, 87.2, 77.6, 92.7, 77.8, 86.8, 60.7, 44.3, 92.9, 77.5),
    "CON-CLIP": (85.0, 69.3, 15.7, 75.3, 84.1, 71.6, 90.2, 72.0, 84.1, 55.7, 54.2, 90.4, 67.4),
    "TripletCLIP": (77.3, 65.5, 11.7, 70.0, 74.7, 65.8, 83.5, 67.2, 74.5, 54.4, 57.8, 80.0, 76.1),
    "LA-CLIP": (73.9, 65.0, 8.8, 68.4, 70.5, 62.6, 80.8, 63.4, 72.0, 57.8, 58.7, 76.3, 64.3),
})

# Tables 16-17: ablation.csv's columns (csclip.ablation.report CSV_KEYS values).
_ABLATION_COLUMNS = (
    Column("i2t", "I2T", "acc"), Column("t2i", "T2I", "acc"), Column("group", "Group", "acc"),
    Column("ht_all", "HT All", "acc"), Column("ht_entity", "HT Ent", "acc"),
    Column("ht_relation", "HT Rel", "acc"), Column("zs", "ZS Avg", "acc"),
    Column("ret_i2t", "Retr I2T", "acc"), Column("ret_t2i", "Retr T2I", "acc"),
)
_ABLATION_ROWS: dict[str, tuple[str, tuple[float, ...]]] = {
    "units-1": ("N=1", (57.4, 39.1, 27.4, 69.8, 75.9, 66.0, 59.5, 70.7, 56.3)),
    "units-2": ("N=2 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),
    "units-3": ("N=3", (57.3, 38.7, 27.4, 69.0, 75.7, 64.9, 59.6, 70.6, 56.4)),
    "units-4": ("N=4", (57.5, 39.0, 27.2, 68.9, 74.6, 65.3, 58.9, 70.2, 56.5)),
    "relfrac-0": ("p=0.0 (Comp only)", (56.7, 39.7, 27.5, 64.2, 78.7, 55.2, 59.1, 70.6, 56.5)),
    "relfrac-0.25": ("p=0.25", (57.1, 39.3, 27.0, 68.5, 78.0, 62.7, 59.4, 70.8, 56.7)),
    "relfrac-0.5": ("p=0.5", (57.1, 39.2, 26.4, 70.8, 78.5, 66.1, 60.4, 71.5, 56.7)),
    "relfrac-0.75": ("p=0.75", (57.5, 39.5, 27.5, 70.7, 77.5, 66.5, 59.3, 70.1, 56.4)),
    "relfrac-1": ("p=1.0 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),
    "swapfrac-0": ("swap=0.0", (57.0, 39.5, 27.7, 70.1, 77.5, 65.4, 59.7, 69.4, 56.2)),
    "swapfrac-0.5": ("swap=0.5", (57.6, 38.5, 26.6, 69.9, 75.9, 66.2, 58.7, 69.9, 56.7)),
    "swapfrac-1": ("swap=1.0 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),
    "lr-1e-6": ("LR=1e-6", (56.6, 39.9, 27.2, 61.6, 71.7, 55.4, 61.7, 70.8, 55.7)),
    "lr-2e-6": ("LR=2e-6", (57.3, 39.0, 27.2, 63.8, 72.2, 58.6, 61.3, 71.4, 56.6)),
    "lr-5e-6": ("LR=5e-6 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),
    "lr-1e-5": ("LR=1e-5", (57.6, 40.2, 28.1, 71.8, 76.7, 68.8, 58.0, 70.0, 56.3)),
    "lr-2e-5": ("LR=2e-5", (57.7, 40.7, 28.1, 73.6, 78.2, 70.8, 56.5, 69.0, 56.0)),
    "wd-1e-3": ("WD=1e-3", (57.4, 39.4, 27.1, 68.3, 74.9, 64.3, 59.2, 70.3, 56.4)),
    "wd-5e-3": ("WD=5e-3", (57.4, 39.0, 27.2, 69.1, 75.2, 65.3, 59.4, 70.5, 56.1)),
    "wd-0.01": ("WD=1e-2 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),
    "wd-0.02": ("WD=2e-2", (57.5, 39.3, 27.4, 69.1, 74.7, 65.6, 59.8, 70.7, 56.2)),
    "wd-0.05": ("WD=5e-2", (57.3, 39.5, 27.6, 69.3, 74.8, 65.9, 59.2, 70.4, 56.6)),
    "bs-32": ("BS=32", (57.0, 38.7, 26.7, 70.0, 75.8, 66.3, 60.4, 69.8, 55.8)),
    "bs-64": ("BS=64", (57.3, 39.4, 27.0, 68.9, 74.3, 65.7, 59.9, 70.1, 56.1)),
    "bs-128": ("BS=128 (Ours)", (57.8, 39.8, 27.8, 69.3, 75.4, 65.5, 59.9, 71.7, 56.8)),

}
_DATA_AXES = ("units", "relfrac", "swapfrac")


def _ablation(stem: str, title: str, axes: tuple[str, ...]) -> PaperTable:
    ids = [i for i in _ABLATION_ROWS if i.split("-", 1)[0] in axes]
    keys = tuple(c.key for c in _ABLATION_COLUMNS)
    return PaperTable(stem, title, _ABLATION_COLUMNS,
                      {i: dict(zip(keys, _ABLATION_ROWS[i][1], strict=True)) for i in ids},
                      dict.fromkeys(keys, ABLATION_SUMMARY),
                      labels={i: _ABLATION_ROWS[i][0] for i in ids})


TABLES: dict[str, PaperTable] = {
    "table1": PaperTable(
        "table1", "Table 1: half-truth accuracy Acc_HT (%) and mean gap Δ", _T1_COLUMNS,
        _T1_ROWS, dict.fromkeys((c.key for c in _T1_COLUMNS), HT_DELTA),
        row_sources={"CLIP-FT": ABLATION_SUMMARY}),
    "table6": PaperTable(
        "table6", "Table 6: Acc_HT (%) per condition", _T6_COLUMNS, _T6_ROWS,
        dict.fromkeys((c.key for c in _T6_COLUMNS), HT_PER_CONDITION)),
    "table7": PaperTable(
        "table7", "Table 7: truthful completion vs half-truth, win rate s(A+) > s(A-) (%)",
        _T7_COLUMNS, _T7_ROWS,
        {**dict.fromkeys(("winrate_entity", "winrate_relation", "winrate_gap", "winrate_all"),
                         FT_SUMMARY),
         **{f"winrate_{slug}": FT_PER_CONDITION for slug in CONDITION_SLUGS},
         "consistency_all": CONSISTENCY_SUMMARY}),
    "table16": _ablation("table16", "Table 16: ablations of the training data (N, relation "
                         "fraction, swap fraction)", _DATA_AXES),
    "table17": _ablation("table17", "Table 17: ablations of the optimisation (learning "
                         "rate, weight decay, batch size)", ("lr", "wd", "bs")),
}

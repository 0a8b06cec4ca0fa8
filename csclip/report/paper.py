"""`csclip report --paper RUN...`: our evaluations and ablation sweeps beside the paper's
Tables 1, 6, 7, 16 and 17.

Each RUN is the output folder of `csclip evaluate` (its table1/table6/table7 CSVs; a
folder without its `.evaluation_complete` is refused, csclip.eval.report.check_evaluation) or
of `csclip ablate` (its ablation.csv, csclip.ablation.report). Every evaluated model is
matched to a row of the paper (CLIP, CLIP-FT, NegCLIP, CS-CLIP, SigLIP, ...) by what it is
(paper_row_of), or named with `--label`; every ablation row to one of the authors' rows
(csclip.ablation.grid.PAPER_ROWS) by its axis and value. The paper's numbers are the
authors' own outputs (csclip.report.paper_numbers, each with its file@commit).

Each table is written as markdown (each cell "ours / paper / ours - paper"), CSV (three
columns per paper column: ours, `<key>_paper`, `<key>_diff`) and a PNG (the differences
as a heat map, each cell annotated with ours and the paper's), plus paper_report.md with
all of them, how each model was matched and where each number comes from; all of it is
logged to one MLflow run when tracking is on. A cell our runs did not measure reads "—"
(an empty CSV cell), never 0; the paper's number still shows. A cell with no paper
number shows ours alone."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from csclip import storage, tracking
from csclip.ablation.grid import PAPER_BASE, PAPER_ROWS
from csclip.ablation.report import CSV_KEYS
from csclip.config.report import ReportConfig
from csclip.errors import ConfigError, DataError
from csclip.eval.report import EVALUATION_COMPLETE, check_evaluation
from csclip.report.paper_numbers import COMMIT, REPOSITORY, TABLES, PaperTable

log = logging.getLogger(__name__)

MISSING = "—"
# The evaluation's CSVs that feed Tables 1, 6 and 7 (csclip.eval.report.write_outputs).
EVALUATION_TABLES: tuple[str, ...] = ("table1", "table6", "table7")
ABLATION_TABLES: tuple[str, ...] = ("table16", "table17")
ABLATION_CSV = "ablation.csv"
# The axes of each ablation table (csclip.ablation.grid AXES names).
TABLE_AXES: dict[str, tuple[str, ...]] = {"table16": ("units", "relfrac", "swapfrac"),
                                          "table17": ("lr", "wd", "bs")}


# ---------------------------------------------------------------------------------------
# Reading the runs
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvaluatedModel:
    """One model of an evaluation folder: its label and identity as table1.csv gives them,
    and its metrics from table1/6/7.csv (None: not measured)."""

    run: str
    label: str
    model: str
    pretrained: str
    step: str
    metrics: dict[str, float | None]


@dataclass(frozen=True)
class AblationResult:
    """One row of an ablation.csv: its setting, axis, value, whether it is the base,
    status, and the Tables 16-17 columns (None: not measured)."""

    run: str
    setting: str
    axis: str
    value: str
    is_base: bool
    status: str
    values: dict[str, float | None]


# The most a RUN given as s3:// may hold: an evaluation's or a sweep's folder (tables,
# JSON, figures, the benchmark's Parquet) is a few MB to a few hundred; a prefix above it
# (a bucket's root) is refused before anything is copied.
REPORT_MAX_BYTES = 1 << 30


def local_copy(run: str) -> Path:
    """The local folder (or ablation.csv) to read for a RUN: the path itself, or for an
    s3:// URI a copy of its files (csclip.storage.local_dir: cached, fetched again only
    when the listing changed). ConfigError for a URI with nothing there."""
    if not storage.is_s3(run):
        return Path(run)
    uri = run.rstrip("/")
    is_csv = uri.endswith("/" + ABLATION_CSV)
    try:
        folder = storage.local_dir(uri.rsplit("/", 1)[0] if is_csv else uri, kind="reports",
                                   max_bytes=REPORT_MAX_BYTES)
    except DataError as err:
        raise ConfigError(f"--paper {run}: {err}") from None
    return folder / ABLATION_CSV if is_csv else folder


def run_kind(run: str, path: Path) -> str:
    """"evaluation" or "ablation" for a RUN argument (read at `path`, its local copy);
    ConfigError when it is neither, DataError for an evaluation that did not finish."""
    if not path.exists():
        raise ConfigError(f"--paper {run}: no such folder")
    if path.is_file() and path.name == ABLATION_CSV or (path / ABLATION_CSV).is_file():
        return "ablation"
    if path.is_dir() and any((path / name).exists() for name in
                             ("table1.csv", "halftruth.md", EVALUATION_COMPLETE)):
        check_evaluation(path, shown_as=run)  # named by the RUN, not by a cache folder
        return "evaluation"
    raise ConfigError(f"--paper {run}: neither the --out folder of `csclip evaluate` "
                      "(table1.csv, .evaluation_complete) nor the report of `csclip ablate` "
                      f"({ABLATION_CSV})")


def _number(text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV table by its header; a row with more cells than the header is a
    DataError naming the file and the line (csv.DictReader would file them under None)."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            rows = []
            for row in reader:
                if None in row:
                    raise DataError(f"{path}: line {reader.line_num} has "
                                    f"{len(row) - 1 + len(row[None])} cells, its header "
                                    f"{len(reader.fieldnames or [])}; rewrite the table with "
                                    "`csclip evaluate` (or `csclip ablate`)")
                rows.append(row)
            return rows
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataError(f"{path}: cannot read it as CSV ({err})") from None


def read_evaluation(run: str, folder: Path) -> list[EvaluatedModel]:
    """The models of a finished evaluation folder (`run`, read at `folder`, its local
    copy), with their Tables 1, 6, 7 metrics."""
    if not (folder / "table1.csv").is_file():
        raise DataError(f"--paper {run}: the evaluation holds no table1.csv")
    rows: dict[str, dict[str, str]] = {}
    for stem in EVALUATION_TABLES:
        path = folder / f"{stem}.csv"
        if path.is_file():
            for row in _read_csv(path):
                rows.setdefault(row.get("label", ""), {}).update(row)
    identity = ("label", "model", "pretrained", "step")
    return [EvaluatedModel(run, label, row.get("model", ""), row.get("pretrained", ""),
                           row.get("step", ""),
                           {k: _number(v) for k, v in row.items() if k not in identity})
            for label, row in rows.items()]


def read_ablation(run: str, path: Path) -> list[AblationResult]:
    """The rows of an ablation report (its folder, or the ablation.csv itself; read at
    `path`, its local copy)."""
    path = path if path.is_file() else path / ABLATION_CSV
    return [AblationResult(run, row.get("setting", ""), row.get("axis", ""),
                           row.get("value", ""), row.get("is_base") == "true",
                           row.get("status", ""),
                           {key: _number(row.get(key)) for key in CSV_KEYS.values()})
            for row in _read_csv(path)]


# ---------------------------------------------------------------------------------------
# Which paper row a model is
# ---------------------------------------------------------------------------------------

# A training run's method (loss.method) -> the paper's row.
METHOD_ROWS: dict[str, str] = {"csclip": "CS-CLIP", "clip": "CLIP-FT", "negclip": "NegCLIP"}
# An open_clip model with a pretrained tag -> the paper's row (names lower-cased).
TAG_ROWS: dict[tuple[str, str], str] = {
    ("vit-b-32", "openai"): "CLIP",
    ("vit-b-16-siglip", "webli"): "SigLIP",
    ("vit-b-16-siglip2", "webli"): "SigLIP2",
}
# A run directory as csclip.train names it: "<loss.method>-<12 hex digits>".
_RUN_DIR = re.compile(r"(csclip|clip|negclip)-[0-9a-f]{12}")
_WEIGHTS_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors", ".ckpt")


def paper_rows() -> list[str]:
    """The paper's model rows (Tables 1, 6, 7), in Table 1's order."""
    return list(dict.fromkeys(name for stem in EVALUATION_TABLES for name in TABLES[stem].rows))


def _normal(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def paper_row_of(model: str, pretrained: str) -> tuple[str | None, str]:
    """(the paper's row, how it was told) for an evaluated model: a training checkpoint by
    its run's loss.method (its config.json, else the run directory's name), an open_clip
    tag by TAG_ROWS, a weights file by the paper row its file name spells (the longest
    one, e.g. negclip.pth: NegCLIP); (None, why) when none applies."""
    if not pretrained:
        return None, "random weights"
    path = Path(pretrained)
    if "/" not in pretrained and "\\" not in pretrained and not path.exists():
        row = TAG_ROWS.get((model.lower(), pretrained.lower()))
        return row, f"open_clip {model} {pretrained}" if row else "an unknown pretrained tag"
    config = path / "config.json"
    if config.is_file():
        try:
            method = json.loads(config.read_text()).get("loss", {}).get("method")
        except (ValueError, AttributeError, OSError):
            method = None
        if method in METHOD_ROWS:
            return METHOD_ROWS[method], f"loss.method {method} ({config})"
    for part in reversed(pretrained.replace("\\", "/").rstrip("/").split("/")):
        match = _RUN_DIR.fullmatch(part)
        if match:
            return METHOD_ROWS[match.group(1)], f"run directory {part}"
    if path.suffix in _WEIGHTS_SUFFIXES or path.is_file():
        stem = _normal(path.stem)
        found = sorted((r for r in paper_rows() if _normal(r) in stem),
                       key=lambda r: len(_normal(r)), reverse=True)
        if found and (len(found) == 1 or len(_normal(found[0])) > len(_normal(found[1]))):
            return found[0], f"weights file {path.name}"
    return None, "neither a tag, a csclip checkpoint nor a weights file named after a row"


def parse_labels(tokens: Sequence[str]) -> dict[str, str]:
    """`--label KEY=NAME` tokens: KEY a RUN argument or a model's label in it."""
    labels: dict[str, str] = {}
    for token in tokens:
        key, sep, name = token.rpartition("=")
        if not sep or not key.strip() or not name.strip():
            raise ConfigError(f"--label {token!r}: write RUN=NAME (e.g. runs/eval/mine=CS-CLIP)")
        labels[key.strip()] = name.strip()
    return labels


def canonical_row(name: str) -> str:
    """A --label NAME as the paper spells it when it is one of its rows (cs-clip: CS-CLIP);
    any other name is kept (its row shows ours alone)."""
    return next((r for r in paper_rows() if _normal(r) == _normal(name)), name)


@dataclass(frozen=True)
class Matched:
    """An evaluated model and the paper row it is compared with (how: a line for the
    report)."""

    model: EvaluatedModel
    paper_row: str
    how: str


def match_models(models: Sequence[EvaluatedModel], labels: Mapping[str, str]) -> list[Matched]:
    """Each model's paper row: --label first (by its RUN or its label), else paper_row_of.
    ConfigError for a model no rule places (naming the --label to give) and for a
    --label that names nothing."""
    used: set[str] = set()
    matched = []
    for item in models:
        keys = [k for k in (item.label, item.run, str(Path(item.run).resolve())) if k in labels]
        if keys:
            used.add(keys[0])
            name = canonical_row(labels[keys[0]])
            matched.append(Matched(item, name, f"--label {keys[0]}={labels[keys[0]]}"))
            continue
        row, how = paper_row_of(item.model, item.pretrained)
        if row is None:
            several = sum(m.run == item.run for m in models) > 1
            key = item.label if several else item.run
            raise ConfigError(
                f"--paper {item.run}: which of the paper's rows is {item.label} ({how})? "
                f"name it: --label '{key}=NAME' (NAME: {', '.join(paper_rows()[:4])}, ... "
                "or any name, shown without paper numbers)")
        matched.append(Matched(item, row, how))
    unused = sorted(set(labels) - used)
    if unused:
        raise ConfigError(f"--label {unused[0]}=...: {unused[0]} is neither a RUN given to "
                          "--paper nor the label of a model in them")
    order = {name: i for i, name in enumerate(paper_rows())}
    return sorted(matched, key=lambda m: order.get(m.paper_row, len(order)))


def ablation_row_id(result: AblationResult, results: Sequence[AblationResult]) -> str | None:
    """The authors' row (csclip.ablation.grid PAPER_ROWS id) an ablation row is: its axis
    and value; learning rate and batch size also by their ratio to the sweep's base row
    of that axis (the paper's ratios on another base, docs/ablation.md). None otherwise."""
    value = _number(result.value)
    if value is None:
        return None
    candidates = [(r.id, float(r.values[0][1])) for r in PAPER_ROWS if r.group == result.axis]
    for row_id, paper_value in candidates:
        if math.isclose(value, paper_value, rel_tol=1e-6, abs_tol=1e-12):
            return row_id
    base = next((_number(r.value) for r in results if r.run == result.run
                 and r.axis == result.axis and r.is_base), None)
    if result.axis in ("lr", "bs") and base:
        scaled = value / base * float(PAPER_BASE[result.axis])
        for row_id, paper_value in candidates:
            if math.isclose(scaled, paper_value, rel_tol=1e-2):
                return row_id
    return None


# ---------------------------------------------------------------------------------------
# The comparison tables
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One row of a comparison: the paper's row (None: not one of its rows), our values
    (None: our runs have no such row) and the CSV's identity cells."""

    paper_row: str | None
    name: str  # the row's name in the markdown and the PNG
    ours: Mapping[str, float | None] | None
    identity: tuple[str, ...]


@dataclass(frozen=True)
class Comparison:
    """A paper table with our rows beside it."""

    paper: PaperTable
    identity_keys: tuple[str, ...]  # the CSV's first columns
    lines: tuple[Line, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    def cell(self, line: Line, key: str) -> tuple[float | None, float | None, float | None]:
        """(ours, paper, ours - paper) of one cell; None where not there."""
        ours = None if line.ours is None else line.ours.get(key)
        paper = self.paper.number(line.paper_row, key)
        diff = ours - paper if ours is not None and paper is not None else None
        return ours, paper, diff

    def markdown(self) -> str:
        columns = self.paper.columns
        lines = [f"### {self.paper.title}: ours beside the paper", "",
                 f"Each cell: ours / paper / ours − paper. {MISSING} = not measured by our "
                 "runs (never 0); a cell without a paper number shows ours alone.", "",
                 "| Row | " + " | ".join(c.header for c in columns) + " |",
                 "|---|" + "---|" * len(columns)]
        for line in self.lines:
            cells = [_text(*self.cell(line, c.key), c.kind) for c in columns]
            lines.append(f"| {line.name} | " + " | ".join(cells) + " |")
        lines += ["", *self.notes, *([""] if self.notes else []), self.sources()]
        return "\n".join(lines) + "\n"

    def sources(self) -> str:
        """Where the paper's numbers of this table come from (file@commit per column, and
        per row where a row comes from elsewhere)."""
        by_source: dict[str, list[str]] = {}
        rows = {line.paper_row for line in self.lines if line.paper_row}
        for column in self.paper.columns:
            if any(self.paper.number(r, column.key) is not None
                   and r not in self.paper.row_sources for r in rows):
                by_source.setdefault(self.paper.sources[column.key], []).append(column.header)
        lines = [f"Paper numbers ({REPOSITORY}):"]
        lines += [f"- {', '.join(headers)}: {source}" for source, headers in by_source.items()]
        lines += [f"- row {row}: {self.paper.row_sources[row]}"
                  for row in sorted(rows & set(self.paper.row_sources))]
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        keys = [c.key for c in self.paper.columns]
        writer.writerow([*self.identity_keys, "paper_row",
                         *(f"{k}{part}" for k in keys for part in ("", "_paper", "_diff"))])
        for line in self.lines:
            # The difference rounded to 1e-6: no float noise (-1.4000000000000057).
            cells = [("" if v is None else round(v, 6) if part == 2 else v) for k in keys
                     for part, v in enumerate(self.cell(line, k))]
            writer.writerow([*line.identity, line.paper_row or "", *cells])
        return out.getvalue()

    def mean_abs_diff(self) -> float | None:
        """The mean |ours - paper| over the percent cells that have both (None: none)."""
        diffs = [abs(d) for line in self.lines for c in self.paper.columns if c.kind == "acc"
                 if (d := self.cell(line, c.key)[2]) is not None]
        return sum(diffs) / len(diffs) if diffs else None


def _fmt(value: float, kind: str, signed: bool = False) -> str:
    spec = ".3f" if kind == "gap" else ".1f"
    return format(value, f"{'+' if signed else ''}{spec}")


def _text(ours: float | None, paper: float | None, diff: float | None, kind: str) -> str:
    if paper is None:
        return MISSING if ours is None else _fmt(ours, kind)
    if ours is None:
        return f"{MISSING} / {_fmt(paper, kind)} / {MISSING}"
    return f"{_fmt(ours, kind)} / {_fmt(paper, kind)} / {_fmt(diff or 0.0, kind, True)}"


def _ours(metrics: Mapping[str, float | None]) -> dict[str, float | None]:
    """Our Tables 1, 6, 7 values, with Table 7's Gap (entity - relation) as the paper's."""
    values = dict(metrics)
    entity, relation = values.get("winrate_entity"), values.get("winrate_relation")
    values["winrate_gap"] = entity - relation if entity is not None and relation is not None \
        else None
    return values


def evaluation_comparisons(matched: Sequence[Matched]) -> dict[str, Comparison]:
    """Tables 1, 6, 7: one row per evaluated model, in the paper's row order."""
    keys = ("run", "label", "model", "pretrained", "step")
    out = {}
    for stem in EVALUATION_TABLES:
        lines = []
        for m in matched:
            name = m.paper_row if m.paper_row == m.model.label else \
                f"{m.paper_row} (ours: {m.model.label})"
            lines.append(Line(m.paper_row if m.paper_row in paper_rows() else None, name,
                              _ours(m.model.metrics),
                              (m.model.run, m.model.label, m.model.model, m.model.pretrained,
                               m.model.step)))
        notes = tuple(f"{m.paper_row}: not a row of the paper's {stem}, ours alone"
                      for m in matched if m.paper_row not in TABLES[stem].rows)
        out[stem] = Comparison(TABLES[stem], keys, tuple(lines), notes)
    return out


def ablation_comparisons(results: Sequence[AblationResult]) -> dict[str, Comparison]:
    """Tables 16, 17: every row of the paper's table, with ours where a sweep ran it (a
    paper row no sweep ran shows the paper alone); rows of ours that are none of the
    paper's follow, ours alone."""
    ids = [(r, ablation_row_id(r, results)) for r in results]
    keys = ("run", "setting", "axis", "value", "status")
    out = {}
    for stem in ABLATION_TABLES:
        paper = TABLES[stem]
        lines: list[Line] = []
        for row_id in paper.rows:
            mine = [r for r, i in ids if i == row_id]
            label = paper.labels.get(row_id, row_id)
            lines += [Line(row_id, f"{label} (ours: {_setting(r)})", r.values,
                           (r.run, r.setting, r.axis, r.value, r.status)) for r in mine] or \
                [Line(row_id, f"{label} (not in our runs)", None, ("", "", "", "", ""))]
        lines += [Line(None, f"{_setting(r)} (not a paper row)", r.values,
                       (r.run, r.setting, r.axis, r.value, r.status))
                  for r, i in ids if i is None and r.axis in TABLE_AXES[stem]]
        out[stem] = Comparison(paper, keys, tuple(lines))
    return out


def _setting(result: AblationResult) -> str:
    """An ablation row's setting, with its status when it has no numbers (not run, failed)."""
    return result.setting if result.status in ("done", "") else \
        f"{result.setting}, {result.status}"


# ---------------------------------------------------------------------------------------
# The figure
# ---------------------------------------------------------------------------------------

# |ours - paper| at which a cell's colour saturates, per column kind.
_COLOUR_SCALE = {"acc": 10.0, "gap": 0.05}


def plot_comparison(comparison: Comparison, path: Path) -> Path:
    """A heat map of ours - paper (blue: above the paper, red: below, grey: no pair),
    each cell annotated with ours and the paper's number."""
    import matplotlib  # noqa: PLC0415  pyplot loads only for a plot, its Agg backend set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  after the backend is set
    import numpy as np  # noqa: PLC0415  only the plot needs it

    columns, lines = comparison.paper.columns, comparison.lines
    shade = np.full((len(lines), len(columns)), np.nan)
    fig, ax = plt.subplots(figsize=(1.2 * len(columns) + 3.5, 0.45 * len(lines) + 1.8))
    for i, line in enumerate(lines):
        for j, column in enumerate(columns):
            ours, paper, diff = comparison.cell(line, column.key)
            if diff is not None:
                shade[i, j] = max(-1.0, min(1.0, diff / _COLOUR_SCALE[column.kind]))
            text = "\n".join(_fmt(v, column.kind) if v is not None else MISSING
                             for v in (ours, paper))
            dark = abs(shade[i, j]) > 0.6  # NaN (no pair, grey) is False
            ax.text(j, i, text, ha="center", va="center", fontsize=6.5,
                    color="white" if dark else "black")
    colours = matplotlib.colormaps["RdBu"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(shade), cmap=colours, vmin=-1, vmax=1,
                      aspect="auto")
    ax.set_xticks(range(len(columns)), [c.header for c in columns], rotation=30, ha="right",
                  fontsize=8)
    ax.set_yticks(range(len(lines)), [line.name if len(line.name) <= 48 else
                                      line.name[:47] + "…" for line in lines], fontsize=7)
    ax.set_title(f"{comparison.paper.title}\ncell: ours (top), paper (bottom); colour: "
                 "ours − paper", fontsize=9)
    bar = fig.colorbar(image, ax=ax, fraction=0.03, ticks=[-1, -0.5, 0, 0.5, 1])
    scale = _COLOUR_SCALE["acc"]
    bar.ax.set_yticklabels([f"{t * scale:+g}" for t in (-1, -0.5, 0, 0.5, 1)], fontsize=7)
    bar.set_label(f"ours − paper, points (Δ columns: x{_COLOUR_SCALE['gap'] / scale:g})",
                  fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PaperReport:
    """What `csclip report --paper` wrote: the comparisons, the files, the MLflow run."""

    comparisons: dict[str, Comparison]
    files: dict[str, Path]
    markdown: str
    mlflow_run_id: str | None = None


def build_comparisons(runs: Sequence[str], labels: Mapping[str, str]
                      ) -> tuple[dict[str, Comparison], list[str]]:
    """The comparisons the RUNs feed (Tables 1, 6, 7 from evaluations, 16 and 17 from
    ablation reports) and the lines saying how each model was matched."""
    models: list[EvaluatedModel] = []
    results: list[AblationResult] = []
    for run in runs:
        local = local_copy(run)
        if run_kind(run, local) == "evaluation":
            models += read_evaluation(run, local)
        else:
            results += read_ablation(run, local)
    comparisons: dict[str, Comparison] = {}
    how: list[str] = []
    if models or labels:
        matched = match_models(models, labels)
        comparisons.update(evaluation_comparisons(matched))
        how = [f"- {m.model.label} ({m.model.run}) -> {m.paper_row}: {m.how}" for m in matched]
    if results:
        comparisons.update(ablation_comparisons(results))
        how.append(f"- ablation rows ({', '.join(sorted({r.run for r in results}))}) -> the "
                   "authors' rows by axis and value")
    if not comparisons:
        raise DataError("--paper: the RUNs hold no model and no ablation row")
    return comparisons, how


def write_report(comparisons: Mapping[str, Comparison], how: Sequence[str],
                 out_dir: str | Path) -> tuple[str, dict[str, Path]]:
    """<table>.md / .csv / .png for each comparison and paper_report.md with all of
    them; (the markdown, the files)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for stem, comparison in comparisons.items():
        (out / f"{stem}.md").write_text(comparison.markdown(), encoding="utf-8")
        (out / f"{stem}.csv").write_text(comparison.csv(), encoding="utf-8")
        plot_comparison(comparison, out / f"{stem}.png")
        files.update({f"{stem}.{ext}": out / f"{stem}.{ext}" for ext in ("md", "csv", "png")})
    markdown = (f"# Ours beside the paper\n\nThe paper's numbers: {REPOSITORY} at {COMMIT} "
                "(csclip/report/paper_numbers.py). How each model was matched to a paper row:"
                "\n\n" + "\n".join(how) + "\n\n"
                + "\n".join(c.markdown() for c in comparisons.values()))
    (out / "paper_report.md").write_text(markdown, encoding="utf-8")
    files["paper_report.md"] = out / "paper_report.md"
    return markdown, files


def log_report(config: ReportConfig, runs: Sequence[str], comparisons: Mapping[str, Comparison],
               files: Mapping[str, Path]) -> str:
    """One MLflow run: params (the RUNs, the tables, the authors' commit), a metric per
    table (mean |ours - paper| over its percent cells) and every file as an artifact."""
    mlflow_client = tracking.client(tracking.resolve_uri(config.tracking.uri))
    experiment = tracking.experiment_id(mlflow_client, config.tracking.experiment)
    run_id = mlflow_client.create_run(
        experiment, run_name=f"paper report: {', '.join(comparisons)}",
        tags={"csclip_role": "paper_report"}).info.run_id
    tracking.log_params(mlflow_client, run_id, {
        "runs": ",".join(runs), "tables": ",".join(comparisons),
        "paper_source": f"{REPOSITORY}@{COMMIT}", "out_dir": config.out_dir})
    tracking.log_metrics(mlflow_client, run_id, {
        f"{stem}_mean_abs_diff": value for stem, c in comparisons.items()
        if (value := c.mean_abs_diff()) is not None})
    for path in files.values():
        mlflow_client.log_artifact(run_id, str(path))
    mlflow_client.set_terminated(run_id)
    return run_id


def run_report(config: ReportConfig, runs: Sequence[str],
               labels: Mapping[str, str]) -> PaperReport:
    """`csclip report --paper RUN...`: read the runs, compare, write, log."""
    comparisons, how = build_comparisons(runs, labels)
    markdown, files = write_report(comparisons, how, config.out_dir)
    run_id = log_report(config, runs, comparisons, files) if config.tracking.enabled else None
    return PaperReport(comparisons, files, markdown, run_id)

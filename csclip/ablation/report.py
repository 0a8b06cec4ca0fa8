"""The sweep's report in the layout of the paper's Tables 16-17: the table (markdown and
CSV, missing measurements shown as missing, never 0), its plot, training-curve plots, and
the section of docs/results.md that a sweep writes."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from csclip.ablation.grid import AXES, Grid, Row, format_value
from csclip.storage import cache_root, upload_dir

# Paper column -> metric keys that can fill it, first found wins. A column none of whose
# keys was measured is shown as missing ("—"), never as 0.
TABLE_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # Compositional: the real-data suite's averages (suite_*: mean over the benchmarks run,
    # csclip.eval.suites.registry) when it ran, else the world's mirrored pairs (comp_*).
    ("I2T", ("suite_i2t", "comp_i2t", "compositional_i2t")),
    ("T2I", ("suite_t2i", "comp_t2i", "compositional_t2i")),
    ("Grp", ("suite_group", "comp_group", "compositional_group")),
    ("HT All", ("ht_all",)),
    ("HT Ent", ("ht_entity",)),
    ("HT Rel", ("ht_relation",)),
    # Zero-shot: the paper's seven CLIP_benchmark datasets (zs_paper_avg, suite
    # zeroshot_paper), else the mean top-1 over real datasets (zs_avg), else the world's.
    ("ZS", ("zs_paper_avg", "zs_avg", "zs_world_avg", "zeroshot_avg", "zs")),
    # Retrieval: the paper's mean of COCO and Flickr8k R@1 (ret_paper_*), else COCO
    # Karpathy test R@1, else the validation records' own.
    ("Ret I2T", ("ret_paper_i2t", "coco_ret_i2t", "ret_i2t", "retrieval_i2t", "ret_i2t_r1")),
    ("Ret T2I", ("ret_paper_t2i", "coco_ret_t2i", "ret_t2i", "retrieval_t2i", "ret_t2i_r1")),
)


MISSING = "—"
# The CSV's header of each paper column: snake_case, as the evaluation's CSVs and metric
# keys (the markdown keeps the paper's headers).
CSV_KEYS: dict[str, str] = {
    "I2T": "i2t", "T2I": "t2i", "Grp": "group", "HT All": "ht_all", "HT Ent": "ht_entity",
    "HT Rel": "ht_relation", "ZS": "zs", "Ret I2T": "ret_i2t", "Ret T2I": "ret_t2i",
}


def column_value(metrics: Mapping[str, Any] | None, keys: Sequence[str]) -> float | None:
    """The first finite metric among `keys` (our evaluation reports percentages, as the
    paper's tables do); None when none was measured."""
    for key in keys:
        value = (metrics or {}).get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return float(value)
    return None


@dataclass(frozen=True)
class AblationTable:
    """The sweep's results: one row per table row, paper columns as percentages."""

    rows: tuple[Row, ...]
    values: tuple[tuple[float | None, ...], ...]  # per row, per TABLE_COLUMNS entry
    status: tuple[str, ...]  # per row: "done" or why the row has no numbers
    caption: str = ""  # a line above the table (e.g. how the checkpoints were selected)

    def markdown(self) -> str:
        header = ["setting", *(name for name, _ in TABLE_COLUMNS)]
        lines = [self.caption, ""] if self.caption else []
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for row, values, status in zip(self.rows, self.values, self.status, strict=True):
            label = f"**{row.label}** (base)" if row.is_base else row.label
            if status != "done":
                label += f" ({status})"
            cells = [MISSING if v is None else f"{v:.1f}" for v in values]
            lines.append("| " + " | ".join([label, *cells]) + " |")
        return "\n".join(lines) + "\n"

    def csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["setting", "axis", "value", "trial", "is_base", "status",
                         *(CSV_KEYS[name] for name, _ in TABLE_COLUMNS)])
        for row, values, status in zip(self.rows, self.values, self.status, strict=True):
            # An empty cell is a missing measurement, never a zero.
            writer.writerow([row.label, row.axis, _csv_cell(row.value), row.setting.key,
                             _csv_cell(row.is_base), status,
                             *("" if v is None else f"{v:.2f}" for v in values)])
        return out.getvalue()


def _csv_cell(value: Any) -> str | int | float:
    """A CSV cell: booleans as true/false, None as empty, several values joined by ';'
    (no Python repr with spaces)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ";".join(str(_csv_cell(v)) for v in value)
    return value


def build_table(grid: Grid, metrics_by_setting: Mapping[str, Mapping[str, Any] | None],
                status_by_setting: Mapping[str, str] | None = None,
                caption: str = "") -> AblationTable:
    """Fill the grid's rows with each setting's metrics (missing settings stay empty)."""
    values, status = [], []
    for row in grid.rows:
        if row.unavailable:  # listed with its reason, never filled from another trial
            values.append(tuple(None for _ in TABLE_COLUMNS))
            status.append(f"not run: {row.unavailable}")
            continue
        metrics = metrics_by_setting.get(row.setting.key)
        values.append(tuple(column_value(metrics, keys) for _, keys in TABLE_COLUMNS))
        default = "done" if metrics is not None else "not run"
        status.append((status_by_setting or {}).get(row.setting.key, default))
    return AblationTable(grid.rows, tuple(values), tuple(status), caption)


HT_COLUMNS = ("HT All", "HT Ent", "HT Rel")


def plot_table(table: AblationTable, path: str | Path) -> Path:
    """A PNG with one panel per axis: half-truth accuracy (All / Ent / Rel) against the
    axis value, base marked. Values are categorical on x, labelled with actual values."""
    import matplotlib  # noqa: PLC0415  pyplot loads only for a plot, its Agg backend set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  after the backend is set

    axes_rows: dict[str, list[int]] = {}
    for i, row in enumerate(table.rows):
        if row.axis not in ("base", "grid"):
            axes_rows.setdefault(row.axis, []).append(i)
    if not axes_rows:  # full grid: one panel over all settings
        axes_rows = {"grid": list(range(len(table.rows)))}
    columns = [name for name, _ in TABLE_COLUMNS]
    fig, panels = plt.subplots(1, len(axes_rows), figsize=(4.2 * len(axes_rows), 3.6),
                               squeeze=False)
    for panel, (axis, indices) in zip(panels[0], axes_rows.items(), strict=True):
        xs = list(range(len(indices)))
        for name, marker in zip(HT_COLUMNS, "osd", strict=True):
            col = columns.index(name)
            ys = [table.values[i][col] for i in indices]
            panel.plot(xs, [math.nan if y is None else y for y in ys], marker=marker, label=name)
        for x, i in zip(xs, indices, strict=True):
            if table.rows[i].is_base:
                panel.axvline(x, color="grey", linestyle=":", linewidth=1)
        labels = [format_value(table.rows[i].value) if axis != "grid" else table.rows[i].label
                  for i in indices]
        panel.set_xticks(xs, labels, rotation=30 if axis == "grid" else 0, fontsize=8)
        panel.set_xlabel(f"{axis} ({AXES[axis].field})" if axis in AXES else "setting")
        panel.set_ylabel("half-truth accuracy (%)")
        panel.set_title(f"{axis}: dotted line = base", fontsize=9)
        panel.grid(alpha=0.3)
    panels[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    csv: Path
    png: Path


def write_report(table: AblationTable, out_dir: str | Path, title: str) -> ReportFiles:
    """Write ablation.md, ablation.csv and ablation.png into `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = out / "ablation.md", out / "ablation.csv"
    md_path.write_text(f"# {title}\n\n{TABLE_CAPTION}\n\n{table.markdown()}{sources(table)}")
    csv_path.write_text(table.csv())
    png_path = plot_table(table, out / "ablation.png")
    return ReportFiles(md_path, csv_path, png_path)


def sources(table: AblationTable) -> str:
    """Where each row comes from (the authors' rows name their file and commit), as a
    list under the table; empty for rows without a source."""
    lines = [f"- {row.label}: {row.source}" for row in table.rows if row.source]
    return "\nSources:\n\n" + "\n".join(lines) + "\n" if lines else ""


TABLE_CAPTION = ("Columns as in the paper's Tables 16-17: compositionality (I2T, T2I, Grp), "
                 "half-truth accuracy (HT All, Ent, Rel), downstream (ZS, Ret I2T, Ret T2I); "
                 f"percent. {MISSING} = not measured (no such suite for this data), never 0.")


def publish_report(table: AblationTable, uri: str, title: str) -> ReportFiles:
    """Write the report next to the sweep: in `uri` when local; for s3:// storage, into a
    local copy in the cache (csclip.storage.cache_root()/tune-reports, never the working
    directory, which is temporary in a Ray job) that is then uploaded to `uri`."""
    if "://" not in uri:
        return write_report(table, uri, title)

    local = cache_root() / "tune-reports" / uri.rstrip("/").rsplit("/", 1)[-1]
    files = write_report(table, local, title)
    upload_dir(local, uri)
    return files


def plot_curves(curves: Mapping[str, list[tuple[int, float]]], path: str | Path,
                title: str) -> Path:
    """Training curves (one panel per metric) as a PNG."""
    import matplotlib  # noqa: PLC0415  pyplot loads only for a plot, its Agg backend set first

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415  after the backend is set

    names = sorted(k for k, points in curves.items() if len(points) > 1)[:6] or sorted(curves)[:6]
    fig, panels = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3), squeeze=False)
    for panel, name in zip(panels[0], names, strict=True):
        steps, values = zip(*sorted(curves[name]), strict=True)
        panel.plot(steps, values)
        panel.set_title(name, fontsize=9)
        panel.set_xlabel("step")
        panel.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)

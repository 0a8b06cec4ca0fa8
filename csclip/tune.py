"""Ray Tune ablation sweeps (paper Tables 16-17): grid specs, the trial driver that trains
and evaluates one setting, MLflow parent/child runs, and the sweep's table and plot.

Ray, MLflow and the training stack are imported inside the functions that need them, so
grid parsing and report writing import nothing heavy.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from csclip.config import parse_override, validate_config
from csclip.errors import ConfigError

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------
# Axes and grid specs
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Axis:
    """One ablation axis: the TrainConfig field it sets and the paper's values (SPEC §3).

    relative: default values are multiples of the base config's value (explicit values
    given on the command line are always absolute).
    """

    name: str
    field: str
    label: str
    default_values: tuple[float | int, ...]
    relative: bool = False


# The lr axis is relative: 0.2x/0.4x/1x/2x of the base lr is exactly the paper's
# {1e-6, 2e-6, 5e-6, 1e-5} around its 5e-6 base (configs/coco.yaml), and stays meaningful
# for the synthetic world, whose tiny random-init model trains at a much larger lr.
# wd and bs are not enumerated in the paper's text; these values bracket its 0.01 / 128.
AXES: dict[str, Axis] = {
    "lr": Axis("lr", "optim.lr", "lr", (0.2, 0.4, 1.0, 2.0), relative=True),
    "units": Axis("units", "sampling.num_unit_slots", "N", (1, 2, 3, 4)),
    "relfrac": Axis("relfrac", "sampling.relation_prob", "rel", (0.0, 0.25, 0.5, 0.75, 1.0)),
    "swapfrac": Axis("swapfrac", "sampling.swap_prob", "swap", (0.0, 0.25, 0.5, 0.75, 1.0)),
    "wd": Axis("wd", "optim.weight_decay", "wd", (0.0, 0.01, 0.1, 0.2)),
    "bs": Axis("bs", "data.batch_size", "bs", (32, 64, 128, 256)),
}


@dataclass(frozen=True)
class AxisSpec:
    """An axis of a grid, with explicit values or None for the axis defaults."""

    axis: str
    values: tuple[Any, ...] | None = None


def parse_grid(tokens: Sequence[str]) -> tuple[AxisSpec, ...]:
    """Parse `--grid` tokens: `lr,units` (default values) and/or `lr=1e-6,5e-6 units=1,2`.

    Raises ConfigError naming the bad token for an unknown axis, a repeated axis or an
    empty value list. Values are read like `--set` values (YAML), and checked against the
    config later, in expand_grid.
    """
    specs: list[AxisSpec] = []
    for token in tokens:
        for part in _split_token(token):
            name, sep, raw = part.partition("=")
            name = name.strip()
            if name not in AXES:
                raise ConfigError(f"--grid {part!r}: unknown axis {name!r}; "
                                  f"choose from {', '.join(AXES)}")
            if any(s.axis == name for s in specs):
                raise ConfigError(f"--grid: axis {name!r} is given twice; give it once")
            if not sep:
                specs.append(AxisSpec(name))
                continue
            raws = [r.strip() for r in raw.split(",")]
            if not raw.strip() or any(not r for r in raws):
                raise ConfigError(f"--grid {part!r}: empty value; write e.g. {name}=1,2")
            specs.append(AxisSpec(name, tuple(parse_override(f"v={r}")[1] for r in raws)))
    if not specs:
        raise ConfigError("--grid is empty; name at least one axis, e.g. --grid lr,units")
    return tuple(specs)


def _split_token(token: str) -> list[str]:
    # "lr,units" names two axes; "lr=1e-6,5e-6" is one axis with two values.
    if "=" in token:
        return [token]
    return [name for name in token.split(",") if name.strip()]


# ---------------------------------------------------------------------------------------
# Settings: the grid expanded around a base config
# ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Setting:
    """One trial: the axis values that differ from the base config (empty = the base)."""

    values: tuple[tuple[str, Any], ...] = ()

    @property
    def key(self) -> str:
        return ",".join(f"{a}={format_value(v)}" for a, v in self.values) or "base"

    @property
    def slug(self) -> str:
        """A file- and run-name-safe form of the key."""
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", self.key.replace("=", "-"))


@dataclass(frozen=True)
class Row:
    """A table row: which axis and value it shows, and the setting that produced it."""

    label: str
    axis: str
    value: Any
    setting: Setting
    is_base: bool


@dataclass(frozen=True)
class Grid:
    """An expanded sweep: the unique settings to train and the table rows that show them."""

    axes: tuple[AxisSpec, ...]
    full: bool
    settings: tuple[Setting, ...]
    rows: tuple[Row, ...]
    base_values: dict[str, Any] = field(default_factory=dict)


def format_value(value: Any) -> str:
    """Short, paper-style rendering: 1e-05 -> 1e-5, 0.0005 -> 5e-4, 0.25 -> 0.25, 2 -> 2."""
    if isinstance(value, float):
        if 0 < abs(value) < 1e-2:
            mantissa, exponent = format(value, ".3e").split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return format(value, "g")
    return str(value)


def get_field(config: BaseModel, path: str) -> Any:
    """The value of a dotted field path ("optim.lr") of a config."""
    node: Any = config
    for part in path.split("."):
        if not hasattr(node, part):
            raise ConfigError(f"{type(config).__name__} has no field {path!r} "
                              "(the ablation axis needs it)")
        node = getattr(node, part)
    return node


def with_values(config: BaseModel, values: Mapping[str, Any], origin: str) -> BaseModel:
    """A copy of `config` with dotted fields set, validated again (so every range and
    cross-field rule of the config applies to grid points too)."""
    data = config.model_dump()
    for path, value in values.items():
        node = data
        *parents, last = path.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return validate_config(type(config), data, origin=origin)


def axis_values(spec: AxisSpec, base: BaseModel) -> tuple[Any, ...]:
    """The actual values of an axis: explicit, or its defaults (scaled if relative)."""
    axis = AXES[spec.axis]
    if spec.values is not None:
        return spec.values
    if axis.relative:
        base_value = get_field(base, axis.field)
        return tuple(float(f"{base_value * m:.6g}") for m in axis.default_values)
    return axis.default_values


def expand_grid(base: BaseModel, specs: Sequence[AxisSpec], full: bool = False) -> Grid:
    """Expand axis specs around `base` into settings and table rows.

    One-at-a-time (the paper's tables): each axis varies alone, the others stay at the
    base; the base setting is trained once and shared by every axis row that equals it.
    full=True: the cross product of all axes. Every setting is validated through the
    config model here, before any Ray work; a bad value raises ConfigError naming it.
    """
    base_values = {s.axis: get_field(base, AXES[s.axis].field) for s in specs}
    per_axis = {s.axis: axis_values(s, base) for s in specs}
    if full:
        combos: list[tuple[tuple[str, Any], ...]] = [()]
        for name, values in per_axis.items():
            combos = [c + ((name, v),) for c in combos for v in values]
    else:
        combos = [((name, v),) for name, values in per_axis.items() for v in values]
    settings: dict[str, Setting] = {"base": Setting()}
    rows: list[Row] = []
    for combo in combos:
        differs = tuple((a, v) for a, v in combo if not _same(v, base_values[a]))
        setting = Setting(differs)
        check_setting(base, setting)
        settings.setdefault(setting.key, setting)
        label = " ".join(f"{AXES[a].label} {format_value(v)}" for a, v in combo)
        axis_name = combo[0][0] if len(combo) == 1 else "grid"
        value = combo[0][1] if len(combo) == 1 else None
        rows.append(Row(label, axis_name, value, setting, not differs))
    if not any(r.is_base for r in rows):
        base_label = " ".join(f"{AXES[a].label} {format_value(v)}" for a, v in base_values.items())
        rows.insert(0, Row(f"base ({base_label})", "base", None, Setting(), True))
    return Grid(tuple(specs), full, tuple(settings.values()), tuple(rows), base_values)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    return a == b


def check_setting(base: BaseModel, setting: Setting) -> BaseModel:
    """The config of a setting, validated; ConfigError names the axis and value."""
    values = {AXES[a].field: v for a, v in setting.values}
    return with_values(base, values, origin=f"--grid {setting.key}")


def sweep_name(base: BaseModel, grid: Grid) -> str:
    """Deterministic experiment name: the axes plus a hash of the base config and the
    settings, so the same command finds (and resumes) the same sweep."""
    payload = json.dumps({"base": base.model_dump(mode="json"),
                          "settings": [s.key for s in grid.settings], "full": grid.full},
                         sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:8]
    axes = "-".join(s.axis for s in grid.axes)
    return f"ablate-{axes}{'-full' if grid.full else ''}-{digest}"


# ---------------------------------------------------------------------------------------
# The sweep's table (layout of Tables 16-17) and plot
# ---------------------------------------------------------------------------------------

# Paper column -> metric keys that can fill it, first found wins. A column none of whose
# keys was measured is shown as missing ("—"), never as 0.
TABLE_COLUMNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("I2T", ("comp_i2t", "compositional_i2t")),
    ("T2I", ("comp_t2i", "compositional_t2i")),
    ("Grp", ("comp_group", "compositional_group")),
    ("HT All", ("ht_all",)),
    ("HT Ent", ("ht_entity",)),
    ("HT Rel", ("ht_relation",)),
    ("ZS", ("zs_avg", "zeroshot_avg", "zs")),
    ("Ret I2T", ("ret_i2t", "retrieval_i2t", "ret_i2t_r1")),
    ("Ret T2I", ("ret_t2i", "retrieval_t2i", "ret_t2i_r1")),
)
MISSING = "—"


def column_value(metrics: Mapping[str, Any] | None, keys: Sequence[str]) -> float | None:
    """The first finite metric among `keys`, as a percentage; None when none was measured.

    Our metrics are fractions in [0, 1]; the paper's tables show percentages.
    """
    for key in keys:
        value = (metrics or {}).get(key)
        if isinstance(value, int | float) and math.isfinite(value):
            return 100.0 * float(value)
    return None


@dataclass(frozen=True)
class AblationTable:
    """The sweep's results: one row per table row, paper columns as percentages."""

    rows: tuple[Row, ...]
    values: tuple[tuple[float | None, ...], ...]  # per row, per TABLE_COLUMNS entry
    status: tuple[str, ...]  # per row: "done" or why the row has no numbers

    def markdown(self) -> str:
        header = ["setting", *(name for name, _ in TABLE_COLUMNS)]
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
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
                         *(name for name, _ in TABLE_COLUMNS)])
        for row, values, status in zip(self.rows, self.values, self.status, strict=True):
            # An empty cell is a missing measurement, never a zero.
            writer.writerow([row.label, row.axis, "" if row.value is None else row.value,
                             row.setting.key, row.is_base, status,
                             *("" if v is None else f"{v:.2f}" for v in values)])
        return out.getvalue()


def build_table(grid: Grid, metrics_by_setting: Mapping[str, Mapping[str, Any] | None],
                status_by_setting: Mapping[str, str] | None = None) -> AblationTable:
    """Fill the grid's rows with each setting's metrics (missing settings stay empty)."""
    values, status = [], []
    for row in grid.rows:
        metrics = metrics_by_setting.get(row.setting.key)
        values.append(tuple(column_value(metrics, keys) for _, keys in TABLE_COLUMNS))
        default = "done" if metrics is not None else "not run"
        status.append((status_by_setting or {}).get(row.setting.key, default))
    return AblationTable(grid.rows, tuple(values), tuple(status))


HT_COLUMNS = ("HT All", "HT Ent", "HT Rel")


def plot_table(table: AblationTable, path: str | Path) -> Path:
    """A PNG with one panel per axis: half-truth accuracy (All / Ent / Rel) against the
    axis value, base marked. Values are categorical on x, labelled with actual values."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    md_path.write_text(f"# {title}\n\n{TABLE_CAPTION}\n\n{table.markdown()}")
    csv_path.write_text(table.csv())
    png_path = plot_table(table, out / "ablation.png")
    return ReportFiles(md_path, csv_path, png_path)


TABLE_CAPTION = ("Columns as in the paper's Tables 16-17: compositionality (I2T, T2I, Grp), "
                 "half-truth accuracy (HT All, Ent, Rel), downstream (ZS, Ret I2T, Ret T2I); "
                 f"percent. {MISSING} = not measured (no such suite for this data), never 0.")


def update_marked_section(path: str | Path, marker: str, body: str) -> Path:
    """Replace the text between `<!-- BEGIN marker -->` and `<!-- END marker -->` in a
    shared markdown file, appending the markers if absent; other sections are untouched."""
    path = Path(path)
    begin, end = f"<!-- BEGIN {marker} -->", f"<!-- END {marker} -->"
    text = path.read_text() if path.exists() else "# Results\n"
    block = f"{begin}\n{body.rstrip()}\n{end}"
    if begin in text and end in text and text.index(begin) < text.index(end):
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    elif begin in text or end in text:
        raise ConfigError(f"{path}: unbalanced {marker!r} markers; keep both "
                          f"{begin} and {end}, begin first")
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
    return path

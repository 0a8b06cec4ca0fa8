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
        return slugify(self.key)


def slugify(key: str) -> str:
    """A file- and run-name-safe form of a setting key: "lr=1e-5,units=1" -> "lr-1e-5_units-1"."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key.replace("=", "-"))


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


# ---------------------------------------------------------------------------------------
# MLflow: one parent run per sweep, one child run per trial (MlflowClient only, so the
# fluent API's process-wide "active run" of the training code is never touched)
# ---------------------------------------------------------------------------------------

PARENT_TAG = "mlflow.parentRunId"


def _client(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _experiment_id(client, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def find_or_create_run(client, experiment_id: str, tags: Mapping[str, str], run_name: str) -> str:
    """The run carrying all `tags` (reused, so a resumed sweep adds no duplicate runs), or a
    new one with them. Its status is set to RUNNING."""
    query = " and ".join(f"tags.{k} = '{v}'" for k, v in tags.items() if k.startswith("csclip_"))
    found = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return run_id
    return client.create_run(experiment_id, run_name=run_name, tags=dict(tags)).info.run_id


def log_params(client, run_id: str, params: Mapping[str, Any]) -> None:
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 100):  # MLflow accepts at most 100 params per batch
        client.log_batch(run_id, params=items[start:start + 100])


def log_metrics(client, run_id: str, metrics: Mapping[str, Any], step: int = 0) -> None:
    import time

    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    items = [Metric(k, float(v), now, step) for k, v in metrics.items()
             if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)]
    for start in range(0, len(items), 1000):
        client.log_batch(run_id, metrics=items[start:start + 1000])


def copy_curves(client, source_run_id: str, target_run_id: str) -> dict[str, list[tuple[int, float]]]:
    """Copy every metric history of the training run into the trial's child run; returns
    the curves {metric: [(step, value), ...]} for the trial's plot."""
    from mlflow.entities import Metric

    curves: dict[str, list[tuple[int, float]]] = {}
    batch: list[Metric] = []
    for key in client.get_run(source_run_id).data.metrics:
        history = client.get_metric_history(source_run_id, key)
        curves[key] = [(m.step, m.value) for m in history]
        batch += [Metric(f"train/{key}", m.value, m.timestamp, m.step) for m in history]
    for start in range(0, len(batch), 1000):
        client.log_batch(target_run_id, metrics=batch[start:start + 1000])
    return curves


# ---------------------------------------------------------------------------------------
# The trial: train one setting with Ray Train, evaluate it, report to Tune and MLflow
# ---------------------------------------------------------------------------------------

class SweepContext(BaseModel):
    """What every trial of a sweep shares; given to trials with tune.with_parameters."""

    model_config = {"extra": "forbid", "frozen": True}

    sweep: str  # Tune experiment name
    base: dict  # the base TrainConfig, model_dump(mode="json"), paths absolute
    settings: dict[str, list]  # setting key -> [[axis, value], ...]
    parent_run_id: str
    tracking_uri: str
    mlflow_experiment: str
    eval_seed: int = 0
    marker_dir: str = ""
    # Test-only: settings whose first attempt fails after training, before evaluation, to
    # stand in for an interrupted sweep. A marker file makes the failure happen once.
    fail_once: tuple[str, ...] = ()

    def setting(self, key: str) -> Setting:
        return Setting(tuple((str(a), v) for a, v in self.settings[key]))


def trial_config(base: BaseModel, setting: Setting, sweep: str) -> BaseModel:
    """The setting's TrainConfig, its Train run named after the sweep and setting, so that
    a restarted trial resumes its own Train run from its last checkpoint."""
    config = check_setting(base, setting)
    return with_values(config, {"run.name": f"{sweep}-{setting.slug}"},
                       origin=f"trial {setting.key}")


def run_trial(params: dict, sweep: dict) -> None:
    """Tune trainable: fine-tune one setting (Ray Train, metrics forwarded to Tune), load
    its checkpoint, evaluate on the validation split, report the evaluation.

    params: Tune's trial config, {"setting": key}; sweep: SweepContext as a dict.
    """
    import time

    from ray import tune

    from csclip import train
    from csclip.config import flatten

    context = SweepContext.model_validate(sweep)
    setting = context.setting(params["setting"])
    base = validate_config(train.TrainConfig, context.base, origin="sweep base config")
    config = trial_config(base, setting, context.sweep)
    client = _client(context.tracking_uri)
    experiment_id = _experiment_id(client, context.mlflow_experiment)
    tags = {"csclip_sweep": context.sweep, "csclip_role": "trial",
            "csclip_setting": setting.key, PARENT_TAG: context.parent_run_id}
    run_id = find_or_create_run(client, experiment_id, tags, run_name=setting.key)
    started = time.time()
    try:
        log_params(client, run_id, {**{f"axis.{a}": v for a, v in setting.values},
                                    "setting": setting.key, **flatten(config)})
        client.set_tag(run_id, "csclip_trial_started", f"{started:.3f}")
        metrics, checkpoint_uri = _train_and_evaluate(config, setting, context, client,
                                                      experiment_id, run_id)
        client.set_terminated(run_id, "FINISHED")
    except BaseException:
        client.set_terminated(run_id, "FAILED")
        raise
    logger.info("trial %s done in %.0f s: ht_all=%s", setting.key, time.time() - started,
                metrics.get("ht_all"))
    tune.report({**metrics, "trial_started": started, "checkpoint_uri": checkpoint_uri,
                 "mlflow_child_run_id": run_id})


def _train_and_evaluate(config: BaseModel, setting: Setting, context: SweepContext, client,
                        experiment_id: str, run_id: str) -> tuple[dict[str, float], str]:
    """The trial's work, logged to its child run: metrics and the checkpoint URI."""
    import time

    from ray.tune.integration.ray_train import TuneReportCallback

    from csclip import train

    started = time.time()
    result = train.run(config, callbacks=[TuneReportCallback()])
    trained = time.time()
    _fail_once_for_tests(context, setting)
    report = evaluate_trial(config, result.checkpoint_uri, context.eval_seed)
    metrics = {k: float(v) for k, v in report.metrics.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    metrics["trial_train_seconds"] = trained - started
    metrics["trial_eval_seconds"] = time.time() - trained
    # A Train run that had already finished (a resumed trial) comes back without its
    # MLflow id: find its run by the name the training code tags it with.
    train_run_id = result.mlflow_run_id or _train_run_id(client, experiment_id, result.run_name)
    curves: dict[str, list[tuple[int, float]]] = {}
    if train_run_id:
        client.set_tag(run_id, "csclip_train_run_id", train_run_id)
        # Nest the training run under the trial, so the UI shows sweep > trial > train.
        client.set_tag(train_run_id, PARENT_TAG, run_id)
        curves = copy_curves(client, train_run_id, run_id)
    log_metrics(client, run_id, metrics)
    _log_trial_files(client, run_id, setting, report, curves)
    return metrics, result.checkpoint_uri


def _train_run_id(client, experiment_id: str, run_name: str) -> str | None:
    from csclip.tracking import RUN_NAME_TAG

    found = client.search_runs([experiment_id], max_results=1,
                               filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'")
    return found[0].info.run_id if found else None


def _fail_once_for_tests(context: SweepContext, setting: Setting) -> None:
    if setting.key not in context.fail_once:
        return
    marker = Path(context.marker_dir) / f"{setting.slug}.failed"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("failed once on purpose (test knob fail_once)\n")
        raise RuntimeError(f"trial {setting.key}: failing on purpose (fail_once test knob)")


def validation_records(config: BaseModel) -> list:
    """The validation split the trial is evaluated on (csclip.data.load_split)."""
    from csclip.data import load_split

    return load_split(config.data.units_uri, "val", config.data.world)


def evaluate_trial(config: BaseModel, checkpoint_uri: str, seed: int):
    """The HalfTruthReport (half-truth, image-side; whatever suites the evaluation has) of
    a trained checkpoint on the validation split."""
    from csclip.evaluate import evaluate_bundle
    from csclip.model import load_bundle

    bundle = load_bundle(checkpoint_uri)
    return evaluate_bundle(bundle, validation_records(config), seed=seed)


def _log_trial_files(client, run_id: str, setting: Setting, report,
                     curves: Mapping[str, list[tuple[int, float]]]) -> None:
    """The trial's own tables (its row in the Tables 16-17 layout; the evaluation's
    Tables 1/6/7 and image-side table), Figure 3 and its training curves, as artifacts of
    its child run."""
    import tempfile

    from csclip.evaluate import paper_tables, plot_figure3

    grid = Grid((), False, (setting,), (Row(setting.key, "trial", None, setting, False),))
    table = build_table(grid, {setting.key: report.metrics})
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        (out / "trial.md").write_text(f"# trial {setting.key}\n\n{TABLE_CAPTION}\n\n"
                                      f"{table.markdown()}")
        (out / "trial.csv").write_text(table.csv())
        (out / "metrics.json").write_text(json.dumps(report.metrics, indent=2, sort_keys=True))
        for stem, paper_table in paper_tables({setting.key: report}).items():
            paper_table.write(out, stem)
        plot_figure3({setting.key: report}, out / "figure3.png")
        if curves:
            plot_curves(curves, out / "curves.png", title=f"trial {setting.key}")
        for path in sorted(out.iterdir()):
            client.log_artifact(run_id, str(path))


def plot_curves(curves: Mapping[str, list[tuple[int, float]]], path: str | Path,
                title: str) -> Path:
    """Training curves (one panel per metric) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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


# ---------------------------------------------------------------------------------------
# The sweep: Tuner (new or restored), then the table, plot and parent-run artifacts
# ---------------------------------------------------------------------------------------

TRIAL_CPUS = 0.25  # the trial driver only waits on its Train run; workers hold the cores


def absolute_uri(uri: str) -> str:
    """Local paths and sqlite URIs made absolute (Tune runs trials in their own working
    directory, where a relative `mlflow.db` or `runs/` would be a different place)."""
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    if "://" in uri:
        return uri
    return str(Path(uri).resolve())


def resolve_paths(config: BaseModel) -> BaseModel:
    """The config with its local paths (tracking URI, storage, units table) absolute."""
    from csclip.tracking import resolve_uri

    # tracking.uri None means $MLFLOW_TRACKING_URI or the local default: pin it, so every
    # trial (on any node, in any working directory) logs to the same store.
    updates = {"tracking.uri": absolute_uri(resolve_uri(get_field(config, "tracking.uri")))}
    for path in ("run.storage_path", "data.units_uri"):
        try:
            value = get_field(config, path)
        except ConfigError:
            continue
        if isinstance(value, str) and value:
            updates[path] = absolute_uri(value)
    return with_values(config, updates, origin="config")


def max_concurrent_trials(cluster: Mapping[str, float], num_workers: int, use_gpu: bool,
                          cpus_per_worker: float = 1.0, trial_cpus: float = TRIAL_CPUS) -> int:
    """How many trials fit the cluster at once: by GPUs when training on GPUs (each trial's
    Train run takes num_workers GPUs), else by CPUs (driver + workers per trial)."""
    workers = max(1, num_workers)
    if use_gpu:
        return max(1, int(cluster.get("GPU", 0) // workers))
    per_trial = workers * cpus_per_worker + trial_cpus
    return max(1, int(cluster.get("CPU", 1) // per_trial))


@dataclass(frozen=True)
class SweepResult:
    """What a sweep produced. errors: setting key -> error, for trials that failed (rerun
    the same command to resume them)."""

    name: str
    path: str
    parent_run_id: str
    table: AblationTable
    report: ReportFiles
    num_trials: int
    resumed: bool
    errors: dict[str, str]
    seconds: float


def tune_storage(config: BaseModel) -> str:
    return f"{str(config.run.storage_path).rstrip('/')}/tune"


def run_sweep(base: BaseModel, grid: Grid, *, max_concurrent: int | None = None,
              trial_cpus: float = TRIAL_CPUS, eval_seed: int = 0, reevaluate: bool = False,
              fail_once: Sequence[str] = ()) -> SweepResult:
    """Run (or resume) a sweep: one Tune trial per setting of `grid`, each a Ray Train
    fine-tune plus evaluation; then the table, plot and MLflow parent run.

    The experiment name depends only on the base config and the grid, so rerunning the
    same command restores the experiment: finished trials are kept, failed or unfinished
    ones run again. reevaluate: evaluate every finished trial's checkpoint again with the
    current evaluation code (no retraining). Ray must be initialised by the caller.
    fail_once is for tests.
    """
    import time

    import ray
    from ray import tune

    from csclip.config import flatten

    started = time.time()
    name = sweep_name(base, grid)
    base = resolve_paths(base)
    storage = tune_storage(base)
    client = _client(base.tracking.uri)
    experiment_id = _experiment_id(client, base.tracking.experiment)
    parent_tags = {"csclip_sweep": name, "csclip_role": "sweep"}
    parent_id = find_or_create_run(client, experiment_id, parent_tags, run_name=name)
    log_params(client, parent_id, {
        "grid": " ".join(f"{s.axis}={','.join(map(format_value, axis_values(s, base)))}"
                         for s in grid.axes),
        "full_grid": grid.full, "num_trials": len(grid.settings),
        **{f"base.{k}": v for k, v in flatten(base).items()
           if k not in ("tracking.uri", "run.storage_path", "run.name")},
    })
    context = SweepContext(sweep=name, base=base.model_dump(mode="json"),
                           settings={s.key: [[a, v] for a, v in s.values] for s in grid.settings},
                           parent_run_id=parent_id,
                           tracking_uri=base.tracking.uri,
                           mlflow_experiment=base.tracking.experiment, eval_seed=eval_seed,
                           marker_dir=f"{storage}/{name}-markers", fail_once=tuple(fail_once))
    if max_concurrent is None:
        max_concurrent = max_concurrent_trials(ray.cluster_resources(), base.run.num_workers,
                                               base.run.use_gpu, base.run.cpus_per_worker,
                                               trial_cpus)
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, sweep=context.model_dump(mode="json")),
        {"cpu": trial_cpus})
    path = f"{storage}/{name}"
    resumed = tune.Tuner.can_restore(path)
    if resumed:
        logger.info("resuming sweep %s from %s", name, path)
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_errored=True)
    else:
        logger.info("sweep %s: %d trials, %d at a time, in %s", name, len(grid.settings),
                    max_concurrent, path)
        tuner = tune.Tuner(
            trainable,
            param_space={"setting": tune.grid_search([s.key for s in grid.settings])},
            tune_config=tune.TuneConfig(max_concurrent_trials=max_concurrent,
                                        trial_dirname_creator=trial_dirname),
            run_config=tune.RunConfig(name=name, storage_path=storage, verbose=1),
        )
    metrics, status, errors = collect_results(tuner.fit())
    report_uri = f"{storage}/{name}-report"
    if reevaluate:
        reevaluate_trials(base, grid, name, metrics, client, eval_seed, report_uri)
    metrics = {k: {**m, **_stored_evaluations(report_uri).get(k, {})} for k, m in metrics.items()}
    table = build_table(grid, metrics, status)
    report = publish_report(table, report_uri, title=f"Ablation {name}")
    for artifact in (report.markdown, report.csv, report.png):
        client.log_artifact(parent_id, str(artifact))
    log_metrics(client, parent_id, {"num_trials_done": len(metrics),
                                    "num_trials_failed": len(errors)})
    client.set_terminated(parent_id, "FAILED" if errors else "FINISHED")
    return SweepResult(name, path, parent_id, table, report, len(grid.settings), resumed,
                       errors, time.time() - started)


EVALUATIONS_FILE = "evaluations.json"  # re-evaluated metrics, by setting key


def reevaluate_trials(base: BaseModel, grid: Grid, sweep: str, metrics: Mapping[str, dict],
                      client, eval_seed: int, report_uri: str) -> None:
    """Evaluate each finished trial's checkpoint again (the evaluation grew a suite, or was
    fixed, after the trials trained). The new metrics go to the trial's child run (tag
    csclip_reevaluated) and to <report>/evaluations.json, which later reruns read too."""
    import time

    from csclip.storage import filesystem_for

    stored = _stored_evaluations(report_uri)
    settings = {s.key: s for s in grid.settings}
    for key, old in metrics.items():
        started = time.time()
        config = trial_config(base, settings[key], sweep)
        report = evaluate_trial(config, old["checkpoint_uri"], eval_seed)
        new = {k: float(v) for k, v in report.metrics.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
        stored[key] = new
        log_metrics(client, old["mlflow_child_run_id"], new, step=1)
        client.set_tag(old["mlflow_child_run_id"], "csclip_reevaluated", f"{started:.3f}")
        logger.info("re-evaluated %s in %.0f s: ht_all=%.1f", key, time.time() - started,
                    new.get("ht_all", math.nan))
    fs, path = filesystem_for(f"{report_uri}/{EVALUATIONS_FILE}")
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(json.dumps(stored, indent=1, sort_keys=True).encode())


def _stored_evaluations(report_uri: str) -> dict[str, dict]:
    from csclip.storage import exists, filesystem_for, read_bytes

    fs, path = filesystem_for(f"{report_uri}/{EVALUATIONS_FILE}")
    return json.loads(read_bytes(fs, path)) if exists(fs, path) else {}


def publish_report(table: AblationTable, uri: str, title: str) -> ReportFiles:
    """Write the report next to the sweep: in `uri` when local; for s3:// storage, into a
    local copy under runs/tune-reports/ that is then uploaded to `uri`."""
    if "://" not in uri:
        return write_report(table, uri, title)
    import pyarrow.fs as pafs

    from csclip.storage import filesystem_for

    local = Path("runs") / "tune-reports" / uri.rstrip("/").rsplit("/", 1)[-1]
    files = write_report(table, local, title)
    fs, path = filesystem_for(uri)
    fs.create_dir(path, recursive=True)
    pafs.copy_files(str(local.resolve()), path, destination_filesystem=fs)
    return files


def trial_dirname(trial) -> str:
    """Trial directories named after their setting (readable, and stable on restore)."""
    return f"trial-{slugify(trial.config['setting'])}"


def collect_results(results) -> tuple[dict[str, dict], dict[str, str], dict[str, str]]:
    """From a Tune ResultGrid: metrics of finished trials, a status per setting, and the
    error of each failed trial, all keyed by setting key."""
    metrics: dict[str, dict] = {}
    status: dict[str, str] = {}
    errors: dict[str, str] = {}
    for result in results:
        key = result.config["setting"]
        if result.error is not None:
            errors[key] = str(result.error).strip().splitlines()[-1][:300]
            status[key] = "failed"
        elif result.metrics and "ht_all" in result.metrics:
            metrics[key] = dict(result.metrics)
            status[key] = "done"
        else:
            status[key] = "no evaluation"
    return metrics, status, errors


def update_results_doc(path: str | Path, result: SweepResult, command: str) -> Path:
    """Put the sweep's table, with the command that made it, in the ablation section of a
    shared results file (docs/results.md); the PNG is copied next to it."""
    import shutil

    path = Path(path)
    image = path.parent / "img" / "ablation.png"
    image.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(result.report.png, image)
    failed = f" {len(result.errors)} trial(s) failed: rerun to resume." if result.errors else ""
    body = (f"## Ablations (Tables 16-17, synthetic world)\n\n"
            f"Made by `{command}` (sweep `{result.name}`, {result.num_trials} trials, "
            f"{result.seconds / 60:.1f} min wall clock{' after resuming' if result.resumed else ''})."
            f"{failed}\n\n{TABLE_CAPTION}\n\n{result.table.markdown()}\n"
            f"![half-truth accuracy per axis]({image.relative_to(path.parent)})\n")
    return update_marked_section(path, "ablation", body)

"""Ablation grids (the paper's Tables 16-17): axes with the paper's values, `--grid`
parsing, and the expansion of a grid into settings around a base config, every setting
validated through the config's own model before any trial runs."""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from csclip.config import parse_override, validate_config
from csclip.errors import ConfigError

if TYPE_CHECKING:  # torch: not for --help
    from csclip.config.train import TrainConfig


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
    # λ_rank of the authors' ranking loss (csclip.loss.ranking_loss): their launcher's
    # values (run_ablations.sh@16276c7, `for LAMBDA_RANK in 0.1 0.2 0.3 0.5 1.0`).
    "rank": Axis("rank", "loss.ranking_loss_weight", "rank", (0.1, 0.2, 0.3, 0.5, 1.0)),
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
    """A table row: which axis and value it shows, and the setting that produced it.

    source: where the row comes from (the paper grid's rows name the authors' file and
    commit); unavailable: why the row is listed but not trained (None: it is trained)."""

    label: str
    axis: str
    value: Any
    setting: Setting
    is_base: bool
    source: str = ""
    unavailable: str | None = None


@dataclass(frozen=True)
class Grid:
    """An expanded sweep: the unique settings to train and the table rows that show them."""

    axes: tuple[AxisSpec, ...]
    full: bool
    settings: tuple[Setting, ...]
    rows: tuple[Row, ...]
    base_values: dict[str, Any] = field(default_factory=dict)
    # A named grid ("paper"): its name stands for the axes in the sweep's name and params.
    label: str = ""

    def describe(self, base: TrainConfig) -> str:
        """The grid as the sweep's `grid` parameter: "units=1,2", or the named grid's rows."""
        if self.label:
            return f"{self.label}: " + ", ".join(s.key for s in self.settings)
        return " ".join(f"{s.axis}={','.join(map(format_value, axis_values(s, base)))}"
                        for s in self.axes)


def format_value(value: Any) -> str:
    """Short, paper-style rendering: 1e-05 -> 1e-5, 0.0005 -> 5e-4, 0.25 -> 0.25, 2 -> 2."""
    if isinstance(value, float):
        if 0 < abs(value) < 1e-2:
            mantissa, exponent = format(value, ".3e").split("e")
            return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
        return format(value, "g")
    return str(value)


def get_field(config: TrainConfig, path: str) -> Any:
    """The value of a dotted field path ("optim.lr") of a config."""
    node: Any = config
    for part in path.split("."):
        if not hasattr(node, part):
            raise ConfigError(f"{type(config).__name__} has no field {path!r} "
                              "(the ablation axis needs it)")
        node = getattr(node, part)
    return node


def with_values(config: TrainConfig, values: Mapping[str, Any], origin: str) -> TrainConfig:
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


def axis_values(spec: AxisSpec, base: TrainConfig) -> tuple[Any, ...]:
    """The actual values of an axis: explicit, or its defaults (scaled if relative)."""
    axis = AXES[spec.axis]
    if spec.values is not None:
        return spec.values
    if axis.relative:
        base_value = get_field(base, axis.field)
        return tuple(float(f"{base_value * m:.6g}") for m in axis.default_values)
    return axis.default_values


def expand_grid(base: TrainConfig, specs: Sequence[AxisSpec], full: bool = False) -> Grid:
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


def check_setting(base: TrainConfig, setting: Setting) -> TrainConfig:
    """The config of a setting, validated; ConfigError names the axis and value."""
    values = {AXES[a].field: v for a, v in setting.values}
    return with_values(base, values, origin=f"--grid {setting.key}")


def sweep_name(base: TrainConfig, grid: Grid, select: str = "final") -> str:
    """Deterministic experiment name: the axes plus a hash of the base config, the
    settings and the checkpoint selection, so the same command finds (and resumes) the
    same sweep."""
    content: dict[str, Any] = {"base": base.model_dump(mode="json"),
                               "settings": [s.key for s in grid.settings], "full": grid.full}
    if select != "final":  # the default keeps the names (and resumes) of earlier sweeps
        content["select"] = select
    payload = json.dumps(content, sort_keys=True)
    digest = hashlib.sha256(payload.encode()).hexdigest()[:8]
    axes = grid.label or "-".join(s.axis for s in grid.axes)
    return f"ablate-{axes}{'-full' if grid.full else ''}-{digest}"


# ---------------------------------------------------------------------------------------
# The authors' rows (`--grid paper`): the runs behind the paper's Tables 16-17
# ---------------------------------------------------------------------------------------

# Everything below is read from kargibora/CS-CLIP at commit 16276c7 (2026-02-11), the last
# commit that holds the ablation launcher, the ablation configs and the notebooks that make
# the tables (0bce1fb removed them; 3ee9d84, 2325a1c and HEAD do not have them).
AUTHORS_COMMIT = "16276c7"
LAUNCHER = f"run_ablations.sh@{AUTHORS_COMMIT}"


def _notebook(name: str) -> str:
    return f"experiments/ablations/ablation_{name}.ipynb@{AUTHORS_COMMIT}"


def _runs(name: str) -> str:
    return f"experiments/configs/ablations/abl_{name}.json@{AUTHORS_COMMIT}"


# The values of the authors' base run (train_structured.sh@16276c7 defaults, the
# `csclip-negclip-hard-new_cleaned` run every notebook compares against).
PAPER_BASE: dict[str, float | int] = {"lr": 5e-6, "bs": 128, "wd": 1e-2, "units": 2,
                                      "relfrac": 1.0, "swapfrac": 1.0, "rank": 0.0}

# Their swap-fraction runs (27-Dec; "lf1.0_lc0.5_lr0.2" in the run name, which
# train_structured.sh writes only for LAMBDA_RANK > 0) added the ranking loss with weight
# 0.2 and their default margin 0.1 (s(I, c) > s(I, u_k) + 0.1; csclip.loss.ranking_loss).
# The table's swap 1 row is their base run, without it (no "_lr" part in its name), so the
# rows carry it as they did: 0.2 on swap 0 and 0.5, none on swap 1.
PAPER_RANKING_WEIGHT = 0.2


@dataclass(frozen=True)
class PaperRow:
    """One row the authors trained: its values on their base (lr 5e-6, batch 128, wd 1e-2,
    N 2, relation and swap fraction 1, no ranking loss), where it comes from, and why it is
    not trained here when it is not (unavailable; no row of theirs is so today)."""

    id: str  # "lr-1e-6": what `--grid paper=<id>` selects
    group: str  # the axis the row varies (its table panel)
    values: tuple[tuple[str, float | int], ...]
    source: str
    unavailable: str | None = None

    @property
    def is_paper_base(self) -> bool:
        return all(_same(v, PAPER_BASE[a]) for a, v in self.values)


def _row(group: str, value: float | int, source: str, unavailable: str | None = None,
         **extra: float | int) -> PaperRow:
    values = ((group, value), *extra.items())
    return PaperRow(f"{group}-{format_value(value)}", group, values, source, unavailable)


_LR = f"{LAUNCHER} (LR in 1e-6 2e-6 5e-6 1e-5 2e-5); {_notebook('learning_rate')}; " \
      f"{_runs('learning_rate')}"
_BS = f"{LAUNCHER} (BS in 32 64 128, LR = 5e-6 x BS / 128 printed with '.1e'); " \
      f"{_notebook('batch_size')}; {_runs('learning_rate')}"
_WD = f"{LAUNCHER} (WD in 1e-3 5e-3 1e-2 2e-2 5e-2); {_notebook('weight_decay')}; " \
      f"{_runs('weight_decay')}"
_N = f"{LAUNCHER} (NUM_COMPONENT_CAPTIONS in 1 3 4); {_notebook('num_comp_captions')} " \
     "(its 17-Jan runs, without the ranking loss of the earlier 25-Dec runs in " \
     f"{_runs('num_comp_captions')})"
_REL = f"{LAUNCHER} (STRUCTURED_RELATION_PROB in 0 0.25 0.5 0.75 1, BINDING_NEGATIVE_PROB " \
       f"0); {_notebook('relation_prob')} (0: run ablation_components_only); {_runs('rel_prob')}"
_SWAP = f"{LAUNCHER} (SWAP_NEGATIVE_PROB in 0 0.25 0.5 0.75, INPLACE_REPLACEMENT_PROB 1); " \
        f"{_notebook('swap_prob')} (rows 0, 0.5 and the base run as 1; run names " \
        "'..._lc0.5_lr0.2_..._swap0.0' and '..._swap0.5': LAMBDA_RANK 0.2, " \
        f"train_structured.sh@{AUTHORS_COMMIT})"
_BASE = f"the base run csclip-negclip-hard-new_cleaned (19-Dec), every {_notebook('*')} row " \
        "'CS-CLIP (...)'"

# Group order and rows as in the authors' notebooks; the base value's row is the base run.
PAPER_ROWS: tuple[PaperRow, ...] = (
    _row("lr", 1e-6, _LR), _row("lr", 2e-6, _LR), _row("lr", 5e-6, _BASE),
    _row("lr", 1e-5, _LR), _row("lr", 2e-5, _LR),
    _row("bs", 32, _BS, lr=1.3e-6), _row("bs", 64, _BS, lr=2.5e-6),
    _row("bs", 128, _BASE, lr=5e-6),
    _row("wd", 1e-3, _WD), _row("wd", 5e-3, _WD), _row("wd", 1e-2, _BASE),
    _row("wd", 2e-2, _WD), _row("wd", 5e-2, _WD),
    _row("units", 1, _N), _row("units", 2, _BASE), _row("units", 3, _N), _row("units", 4, _N),
    _row("relfrac", 0.0, _REL), _row("relfrac", 0.25, _REL), _row("relfrac", 0.5, _REL),
    _row("relfrac", 0.75, _REL), _row("relfrac", 1.0, _BASE),
    # The paper's swap rows {0, 0.5, 1} (their notebook's; the 0.25 and 0.75 runs of
    # abl_swap_inplace_grid.json are not in its table).
    _row("swapfrac", 0.0, _SWAP, rank=PAPER_RANKING_WEIGHT),
    _row("swapfrac", 0.5, _SWAP, rank=PAPER_RANKING_WEIGHT),
    _row("swapfrac", 1.0, _BASE),
)
PAPER_GROUPS: tuple[str, ...] = tuple(dict.fromkeys(r.group for r in PAPER_ROWS))


def is_paper_grid(tokens: Sequence[str]) -> bool:
    """Whether `--grid` names the authors' rows (`paper` or `paper=<groups or row ids>`)."""
    return any(t.strip().split("=", 1)[0] == "paper" for t in tokens)


def parse_paper_grid(tokens: Sequence[str]) -> tuple[PaperRow, ...]:
    """The authors' rows `--grid` selects: `paper` (all), `paper=lr,bs` (groups),
    `paper=wd-1e-3,units-1` (rows by id), or a mix. Raises ConfigError naming a bad token."""
    if len(tokens) != 1:
        raise ConfigError(f"--grid {' '.join(tokens)}: 'paper' is a grid of its own; give "
                          "it alone, e.g. --grid paper or --grid paper=lr,wd-1e-3")
    _, sep, raw = tokens[0].partition("=")
    if not sep:
        return PAPER_ROWS
    wanted = [w.strip() for w in raw.split(",")]
    if not raw.strip() or any(not w for w in wanted):
        raise ConfigError(f"--grid {tokens[0]!r}: empty value; write e.g. paper=lr,wd-1e-3")
    ids = {r.id: r for r in PAPER_ROWS}
    chosen: dict[str, PaperRow] = {}
    for name in wanted:
        if name in PAPER_GROUPS:
            chosen.update((r.id, r) for r in PAPER_ROWS if r.group == name)
        elif name in ids:
            chosen[name] = ids[name]
        else:
            raise ConfigError(f"--grid {tokens[0]!r}: {name!r} is neither a group "
                              f"({', '.join(PAPER_GROUPS)}) nor a row id (e.g. lr-1e-6, "
                              "bs-32, swapfrac-0.5; `--help` lists them)")
    return tuple(r for r in PAPER_ROWS if r.id in chosen)


def paper_values(base: TrainConfig, row: PaperRow) -> tuple[tuple[str, Any], ...]:
    """A row's values on `base`. On the authors' base (configs/coco.yaml: lr 5e-6, batch
    128) they are theirs exactly. Learning rates are the paper's ratios to its 5e-6 (as
    the `lr` axis), so on another base they bracket its lr the same way; a batch-size row
    keeps the paper's ratio to 128 with the learning rate scaled linearly by their formula
    (`f"{lr * bs / base_bs:.1e}"`, so 32 gets 1.3e-6 on 5e-6, not 1.25e-6); weight decay,
    N and the fractions are absolute."""
    base_lr, base_bs = get_field(base, AXES["lr"].field), get_field(base, AXES["bs"].field)
    if row.group == "lr":
        return (("lr", float(f"{base_lr * row.values[0][1] / PAPER_BASE['lr']:.6g}")),)
    if row.group == "bs":
        batch = max(1, round(base_bs * row.values[0][1] / PAPER_BASE["bs"]))
        return (("bs", batch), ("lr", float(f"{base_lr * batch / base_bs:.1e}")))
    return row.values


def expand_paper_grid(base: TrainConfig, rows: Sequence[PaperRow] = PAPER_ROWS) -> Grid:
    """The authors' rows around `base`, one table row each (in their notebooks' order);
    the rows equal to `base` share its trial, rows csclip cannot train are kept in the
    table as unavailable (with the reason) and get no trial. Every trained setting is
    validated through the config model here, before any Ray work."""
    settings: dict[str, Setting] = {}
    out: list[Row] = []
    for row in rows:
        values = paper_values(base, row)
        differs = tuple((a, v) for a, v in values if not _same(v, get_field(base, AXES[a].field)))
        setting = Setting(differs)
        label = " ".join(f"{AXES[a].label} {format_value(v)}" for a, v in values)
        if row.unavailable is None:
            check_setting(base, setting)
            settings.setdefault(setting.key, setting)
        out.append(Row(label, row.group, values[0][1], setting,
                       not differs and row.unavailable is None, row.source,
                       row.unavailable))
    if not settings:
        raise ConfigError("--grid paper: every selected row is unavailable ("
                          f"{'; '.join(sorted({r.unavailable or '' for r in rows}))}); "
                          "select rows csclip can train")
    ordered = tuple(sorted(settings.values(), key=lambda s: s.key != "base"))
    return Grid((), False, ordered, tuple(out), {}, label="paper")


def paper_rows_help() -> str:
    """The authors' rows by group with their sources, for `--help`."""
    sources = {"lr": _LR, "bs": _BS, "wd": _WD, "units": _N, "relfrac": _REL, "swapfrac": _SWAP}
    lines = [f"the authors' rows (`--grid paper`, kargibora/CS-CLIP@{AUTHORS_COMMIT}; "
             "values on their base; docs/ablation.md):"]
    for group in PAPER_GROUPS:
        rows = [r for r in PAPER_ROWS if r.group == group]
        names = []
        for row in rows:
            extra = "".join(f" {a} {format_value(v)}" for a, v in row.values[1:])
            mark = " (base run)" if row.is_paper_base else " (NOT RUN)" if row.unavailable else ""
            names.append(f"{row.id}{extra}{mark}")
        lines.append(f"  {group}: {', '.join(names)}")
        lines.append(f"      source: {sources[group]}")
        for reason in dict.fromkeys(r.unavailable for r in rows if r.unavailable):
            lines.append(f"      NOT RUN: {reason}")
    lines.append(f"  base run: {_BASE}")
    return "\n".join(lines)

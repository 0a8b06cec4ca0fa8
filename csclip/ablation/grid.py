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
from typing import Any

from pydantic import BaseModel

from csclip.config import parse_override, validate_config
from csclip.errors import ConfigError


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

"""Typed configs from YAML with `--set a.b=value` overrides.

Each pipeline defines one pydantic model (extra keys forbidden, frozen); this module loads
YAML into it, applies overrides, and turns every validation failure into a ConfigError
that names the field, before any Ray work starts.
"""

from __future__ import annotations

import argparse
import difflib
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from csclip.errors import ConfigError

__all__ = ["REMOVED_FIELDS", "StrictModel", "add_config_arguments", "apply_overrides", "deep_merge", "flatten",
           "load_config", "parse_override", "read_yaml", "refuse_given", "refuse_renamed",
           "to_yaml", "unknown_setting_text", "validate_config", "with_section_defaults"]

ConfigT = TypeVar("ConfigT", bound=BaseModel)


# Fields taken out of the configs, by "<section>.<field>" (the last two parts of where an
# old config gives one, in any config that has the section): what to set instead. An old
# YAML or --set that gives one fails with this line rather than only "unknown setting".
REMOVED_FIELDS: dict[str, str] = {
    "run.best_mode": "leave it out: run.best_metric keeps the highest value (every report "
                     "key, gaps included, is better higher)",
    "run.compile_mode": "give the mode as run.compile (run.compile=max-autotune; true is "
                        "\"default\")",
    "run.ray_train_log_level": "leave it out: Ray Train's console shows warnings, its log "
                               "files under /tmp/ray/session_latest/logs every level",
    "suites.world_pairs": "suites.num_world_pairs=0 turns the world's pairs and replace "
                          "items off",
    "suites.num_replace_items": "suites.num_world_pairs counts both the mirrored pairs and "
                                "the replace items",
    "suites.world_zeroshot": "suites.num_zeroshot_items=0 turns the world's zero-shot off",
    "suites.seed": "benchmark.seed seeds the world suites' draws too",
    "benchmark.min_distractors": "leave it out: image-side items take 2-5 distractor images "
                                 "(SPEC §4)",
    "benchmark.max_distractors": "leave it out: image-side items take 2-5 distractor images "
                                 "(SPEC §4)",
    "scoring.ray_min_images": "leave it out: sets over 5000 new images encode on Ray Data "
                              "(csclip.eval.encoder.RAY_MIN_IMAGES); scoring.ray_concurrency "
                              "sets its actors",
    "swap_negatives.batch_size": "leave it out: spaCy parses 1000 captions a batch, as the "
                                 "authors' script (the shuffles are the same at any size)",
    "output.num_threads": "leave it out: csclip shards prepares 8 images at once",
    "data.prepare_images": "leave it out: a units table is written once as shards of its "
                           "images' uint8 pixels and every run on it reads those "
                           "(csclip.train.source_shards)",
    "data.image_cache_mb": "leave it out: the world and units tables are written once as "
                           "shards of uint8 pixels (csclip.train.source_shards), which every "
                           "epoch reads",
}


class StrictModel(BaseModel):
    """Base of every config section: unknown keys are errors, instances are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def refuse_renamed(data: object, section: str, renamed: dict[str, str]) -> object:
    """A `mode="before"` validator's body: raise ValueError naming the field that replaced
    an old one given in `data` (renamed: old key -> what to set instead), so an old config
    fails with one line that says what to write, not only "extra inputs"."""
    if isinstance(data, dict):
        for old, new in renamed.items():
            if old in data:
                raise ValueError(f"{section}.{old} is no longer a field: set {new}")
    return data


def refuse_given(data: object, fields: dict[str, str], prefix: str = "",
                 accepted: dict[str, object] | None = None) -> None:
    """Refuse the settings a command would overwrite or ignore: raise ConfigError for the
    first of `fields` (dotted path -> why it is not used; a section's path covers every
    field under it) that `data` gives (a config as read from YAML and --set, before
    validation), unless its value is the one the command uses anyway (`accepted`).
    One line: "<prefix><path>=<value>: <why>; leave it unset"."""
    accepted = accepted or {}
    for path, why in fields.items():
        node = data
        for key in path.split("."):
            if not isinstance(node, dict) or key not in node:
                break
            node = node[key]
        else:
            if isinstance(node, dict):  # a section: name the first field given in it
                given = flatten(node, path + ".")
                if not given:
                    continue
                path, node = next(iter(given.items()))
            if path in accepted and node == accepted[path]:
                continue
            raise ConfigError(f"{prefix}{path}={node!r}: {why}; leave it unset")


def parse_override(text: str) -> tuple[list[str], object]:
    """Parse `a.b.c=value` into (["a", "b", "c"], value), the value read as YAML
    (so `1e-5` is a float, `true` a bool, `[1, 2]` a list, `abc` a string)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.field=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({err})") from err
    # YAML reads "1e-5" as a string (it needs a dot); numbers are what users mean.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            pass
    return [part.strip() for part in key.split(".")], value


def apply_overrides(data: dict, overrides: Sequence[str]) -> dict:
    """Return a copy of `data` with each `a.b=value` override set."""
    result = _deep_copy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = result
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return result


def _deep_copy(data: dict) -> dict:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in data.items()}


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start}); save it as UTF-8") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({err})") from err
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    return data


def with_section_defaults(model: type[BaseModel], data: dict) -> dict:
    """`data` with every partly given section filled from that section's default.

    pydantic validates a partial dict for a nested section against the section's *class*
    defaults, so `--set pretrain.optim.max_steps=300` would silently reset the other fields
    of a default like `optim: OptimConfig = OptimConfig(lr=1e-3)` to OptimConfig's own.
    Merging the dict over the default instance keeps them.
    """
    result = dict(data)
    for name, value in data.items():
        info = model.model_fields.get(name)
        if info is None or not isinstance(value, dict):
            continue
        default = info.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            merged = deep_merge(default.model_dump(), value)
            result[name] = with_section_defaults(type(default), merged)
        elif isinstance(default, dict) and default:
            # A section given as a delta (csclip.demo's pretrain, finetune): the same.
            result[name] = deep_merge(default, value)
    return result


def deep_merge(base: dict, update: dict) -> dict:
    """`update` merged over `base`, nested dicts key by key (neither is changed)."""
    merged = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def validate_config(model: type[ConfigT], data: dict, origin: str = "config",
                    prefix: str = "") -> ConfigT:
    """Validate `data` into `model` (partly given sections keep their other defaults),
    raising ConfigError naming each bad field (`prefix` before its path)."""
    try:
        return model.model_validate(with_section_defaults(model, data))
    except ValidationError as err:
        problems = []
        for item in err.errors():
            where = (prefix + ".".join(str(p) for p in item["loc"])).rstrip(".") or "(top level)"
            removed = ".".join(str(p) for p in item["loc"][-2:])
            if item["type"] == "extra_forbidden" and removed in REMOVED_FIELDS:
                problems.append(f"{where} is no longer a field: {REMOVED_FIELDS[removed]}")
                continue
            if item["type"] == "extra_forbidden":
                fields = _fields_at(model, item["loc"][:-1])
                near = difflib.get_close_matches(str(item["loc"][-1]), fields, n=3, cutoff=0.6)
                parent = where.rpartition(".")[0]
                problems.append(unknown_setting_text(
                    where, [f"{parent}.{m}" if parent else m for m in near]))
                continue
            problems.append(f"invalid {where}: {item['msg']}" + (
                f" (got {item['input']!r})" if not isinstance(item.get("input"), dict) else ""))
        raise ConfigError(f"{origin}: " + "; ".join(problems)) from err


def unknown_setting_text(path: str, near: Sequence[str]) -> str:
    """ "unknown setting a.b (did you mean a.c?)": a setting no field has, its near misses."""
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    return f"unknown setting {path}{hint}"


def _fields_at(model: type[BaseModel], loc: Sequence[object]) -> list[str]:
    """The field names of the section of `model` at `loc` (empty where it is no model)."""
    for part in loc:
        info = model.model_fields.get(str(part))
        if info is None:
            return []
        sections = [a for a in (typing.get_args(info.annotation) or (info.annotation,))
                    if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(sections) != 1:
            return []
        model = sections[0]
    return list(model.model_fields)


def load_config(model: type[ConfigT], path: str | Path | None = None,
                overrides: Sequence[str] = ()) -> ConfigT:
    """Load `model` from YAML at `path` (or defaults) with `a.b=value` overrides."""
    data = read_yaml(path) if path is not None else {}
    data = apply_overrides(data, overrides)
    return validate_config(model, data, origin=str(path) if path else "config")


def add_config_arguments(parser: argparse.ArgumentParser, default_config: str | None) -> None:
    """--config, --set and --print-config, as every entry point takes them."""
    parser.add_argument("--config", default=default_config,
                        help=f"YAML config file (default: {default_config})")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="a.b=value", help="override one config field; repeatable")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config (defaults, file and --set) as YAML "
                             "and exit; runs store the same text as config.yaml")


def to_yaml(config: BaseModel) -> str:
    """The resolved config as YAML, every field given: what --print-config prints and what
    a run stores beside its outputs (torchtune's `tune cat`, open_clip's params.txt).
    Loading it back gives an equal config."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False,
                          default_flow_style=False, allow_unicode=True)


def flatten(config: BaseModel | dict, prefix: str = "") -> dict[str, object]:
    """Flatten a config to {"a.b": value} for MLflow params and tables."""
    data = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
    flat: dict[str, object] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        else:
            flat[name] = value
    return flat

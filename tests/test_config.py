"""Typed configs: YAML + `--set` overrides, errors that name the field."""

from __future__ import annotations

import pytest
from pydantic import Field

from csclip.config import StrictModel, apply_overrides, flatten, load_config, parse_override
from csclip.errors import ConfigError


class OptimSection(StrictModel):
    lr: float = Field(5e-6, gt=0)
    betas: tuple[float, float] = (0.9, 0.98)


class ExampleConfig(StrictModel):
    optim: OptimSection = OptimSection()
    name: str = "run"


def test_override_values_are_read_as_yaml_numbers_and_lists():
    assert parse_override("optim.lr=1e-5") == (["optim", "lr"], 1e-5)
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])
    assert parse_override("a=true") == (["a"], True)
    assert parse_override("a=abc") == (["a"], "abc")


def test_overrides_apply_on_top_of_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  lr: 1.0e-4\nname: base\n")
    cfg = load_config(ExampleConfig, path, ["optim.lr=2e-6", "name=other"])
    assert cfg.optim.lr == 2e-6 and cfg.name == "other" and cfg.optim.betas == (0.9, 0.98)
    assert flatten(cfg) == {"optim.lr": 2e-6, "optim.betas": [0.9, 0.98], "name": "other"}


@pytest.mark.parametrize(("overrides", "message"), [
    (["optim.lr=abc"], "optim.lr"),
    (["optim.lr=-1"], "optim.lr"),
    (["optim.lrr=1"], "optim.lrr"),
    (["optimm.lr=1"], "optimm"),
    (["nonsense"], "section.field=value"),
    (["name.x=1"], "name: Input should be a valid string"),
])
def test_bad_fields_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(ExampleConfig, None, overrides)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(ExampleConfig, tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(ExampleConfig, bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(ExampleConfig, scalar)


def test_apply_overrides_leaves_the_input_untouched():
    data = {"optim": {"lr": 1}}
    apply_overrides(data, ["optim.lr=2"])
    assert data == {"optim": {"lr": 1}}


def test_override_into_a_value_from_yaml_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: base\n")
    with pytest.raises(ConfigError, match="'name' is a value"):
        load_config(ExampleConfig, path, ["name.x=1"])


class TunedRun(StrictModel):
    # A section whose default differs from its class defaults.
    optim: OptimSection = OptimSection(lr=1e-3, betas=(0.8, 0.9))
    inner: ExampleConfig = ExampleConfig(optim=OptimSection(lr=2e-3), name="inner")


def test_set_on_a_nested_field_keeps_the_other_defaults_of_that_section():
    config = load_config(TunedRun, None, ["optim.betas=[0.5, 0.6]", "inner.optim.betas=[0.1, 0.2]"])
    assert config.optim == OptimSection(lr=1e-3, betas=(0.5, 0.6))
    assert config.inner.optim == OptimSection(lr=2e-3, betas=(0.1, 0.2))
    assert config.inner.name == "inner"


def test_a_bad_field_inside_a_defaulted_section_is_still_named():
    with pytest.raises(ConfigError, match="inner.optim.lr"):
        load_config(TunedRun, None, ["inner.optim.lr=-1"])

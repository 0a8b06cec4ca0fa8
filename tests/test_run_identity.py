"""Run identity: the run name hashes one declared list of fields (csclip.train.loop), and
the names of a few representative runs are pinned here, so that a change to what a name
hashes (which renames every earlier run and loses its cache and resume) is made on
purpose: change IDENTITY_FIELDS and these literals together, and say so."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from csclip.config import load_config
from csclip.config.train import TrainConfig
from csclip.train import run_name
from csclip.train.identity import HOW_IT_RUNS_FIELDS, IDENTITY_FIELDS, IDENTITY_FIELDS_WHEN_SET

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# The names these configs had when the identity became a declared list (commit e48006e
# computed the same ones).
PINNED = {
    "TrainConfig()": "csclip-8f131e8b0e21",
    "default.yaml": "csclip-991ad367ad9e",
    "coco.yaml": "csclip-72936caf8679",
    "coco_authors.yaml": "csclip-6ac8ee21657e",
    "paper.yaml": "csclip-3af98837dd68",  # was csclip-fdcb696ea452 before data.val_ratio 0.001
}
# The demo's stages (csclip demo without arguments); checkpoint URIs stand in for the
# stages' outputs.
PINNED_DEMO = {
    "warm_start": "layout-aef724e62166",
    "pretrain": "clip-ab86b52856f8",
    "pretrain without warm start": "clip-0aab64ff57e4",
    "CS-CLIP": "csclip-190569c38758",
    "CLIP-FT": "clip-d85cec9f0ef1",
}


@pytest.mark.parametrize("source", PINNED)
def test_run_names_are_pinned(source):
    config = TrainConfig() if source == "TrainConfig()" else load_config(TrainConfig, CONFIGS / source)
    assert run_name(config) == PINNED[source]


def test_demo_run_names_are_pinned(monkeypatch):
    from csclip.entry import demo as demo_entry

    monkeypatch.chdir(CONFIGS.parent)  # the demo's default config path is relative
    demo = demo_entry.demo_config(demo_entry.build_parser().parse_args([]))
    names = {
        "warm_start": run_name(demo.warm_start_config()),
        "pretrain": run_name(demo.pretrain_config("runs/pretrain/layout-x/final")),
        "pretrain without warm start": run_name(demo.pretrain_config()),
        "CS-CLIP": run_name(demo.finetune_config("csclip", "runs/pretrain/clip-x/final")),
        "CLIP-FT": run_name(demo.finetune_config("clip", "runs/pretrain/clip-x/final")),
    }
    assert names == PINNED_DEMO


def _leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        section = info.annotation if isinstance(info.annotation, type) else None
        if section is not None and issubclass(section, BaseModel):
            paths += _leaves(section, f"{prefix}{name}.")
        else:
            paths.append(f"{prefix}{name}")
    return paths


def test_every_field_is_identity_or_how_it_runs():
    """A new TrainConfig field must be classified: what is trained (in the name) or how it
    runs (not)."""
    lists = {"IDENTITY_FIELDS": IDENTITY_FIELDS, "IDENTITY_FIELDS_WHEN_SET": IDENTITY_FIELDS_WHEN_SET,
             "HOW_IT_RUNS_FIELDS": HOW_IT_RUNS_FIELDS}
    unclassified, twice = [], []
    for leaf in _leaves(TrainConfig):
        owners = [name for name, paths in lists.items() for path in paths
                  if leaf == path or leaf.startswith(path + ".")]
        if not owners:
            unclassified.append(leaf)
        elif len(owners) > 1:
            twice.append((leaf, owners))
    assert not unclassified, f"add each to IDENTITY_FIELDS or HOW_IT_RUNS_FIELDS: {unclassified}"
    assert not twice
    # and every listed path is a field
    leaves = _leaves(TrainConfig)
    for path in IDENTITY_FIELDS + IDENTITY_FIELDS_WHEN_SET + HOW_IT_RUNS_FIELDS:
        assert any(leaf == path or leaf.startswith(path + ".") for leaf in leaves), path


def test_how_it_runs_fields_keep_the_name_and_identity_fields_change_it():
    base = TrainConfig()
    changed = {"run": {"storage_path": "elsewhere", "compile": True, "log_every": 7},
               "tracking": {"enabled": False}, "optim": {"accum_freq": 2}}
    same = TrainConfig.model_validate({**base.model_dump(), **{
        k: {**base.model_dump()[k], **v} for k, v in changed.items()}})
    assert run_name(same) == run_name(base)
    other = base.model_copy(update={"data": base.data.model_copy(update={"split": "val"})})
    assert run_name(other) != run_name(base)
    named = base.model_copy(update={"run": base.run.model_copy(update={"name": "mine"})})
    assert run_name(named) == "mine"

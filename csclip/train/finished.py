"""A run's storage and its result: where runs go (storage_root), the export of the last
checkpoint to <storage>/<name>/final, and the checks that a run of this config finished
already (its TrainResult, without training) or left checkpoints of another config in its
place. csclip.train.loop imports this module, never the other way.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from csclip.config.train import TrainConfig
from csclip.errors import CsclipError
from csclip.model import CONFIG_FILE, SPEC_FILE, WEIGHTS_FILE
from csclip.storage import (
    exists,
    export_problem,
    filesystem_for,
    read_bytes,
    resolve_output,
    upload_dir,
)
from csclip.train.identity import run_identity, run_name

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.json"
FINAL_DIR = "final"


@dataclass(frozen=True)
class TrainResult:
    """What a finished run produced. checkpoint_uri: a directory that `load_bundle` reads."""

    run_name: str
    checkpoint_uri: str
    metrics: dict = field(default_factory=dict)
    mlflow_run_id: str | None = None


def storage_root(config: TrainConfig) -> str:
    """run.storage_path, absolute (refused when relative inside a Ray job)."""
    return resolve_output(config.run.storage_path, "run.storage_path")


def final_uri(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}/{FINAL_DIR}"


def export_final(checkpoint, root: str, name: str) -> str:
    """Copy the last checkpoint's weights, spec, config and metrics (not the optimizer
    state) to <storage>/<name>/final: a stable path that open_clip and load_bundle read."""
    if checkpoint is None:
        raise CsclipError(f"run {name} finished without a checkpoint; check run.checkpoint_every")
    uri = final_uri(root, name)
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint.to_directory(tmp)
        staging = Path(tmp, FINAL_DIR)
        staging.mkdir()
        for file in (WEIGHTS_FILE, SPEC_FILE, CONFIG_FILE, METRICS_FILE):
            if Path(tmp, file).exists():
                shutil.copy(Path(tmp, file), staging / file)
        upload_dir(staging, uri)
    return uri


def read_metrics(final_uri: str) -> dict:
    fs, path = filesystem_for(final_uri)
    file = f"{path}/{METRICS_FILE}"
    return json.loads(read_bytes(fs, file)) if exists(fs, file) else {}


def finished_result(config: TrainConfig) -> TrainResult | None:
    """The result of an already finished run of `config`, or None.

    Raises CsclipError when `run.name` names a finished run with a different config.
    """
    name = run_name(config)
    uri = final_uri(storage_root(config), name)
    fs, path = filesystem_for(uri)
    # final/ is finished when its manifest (written last) matches its files: an export
    # killed mid-way is not, and the rerun resumes from the last checkpoint and exports again.
    if not exists(fs, path):
        return None
    problem = export_problem(fs, path)
    if problem is not None:
        logger.info("run %s: %s is not a finished export (%s); training resumes", name, uri,
                    problem)
        return None
    if _saved_identity(fs, f"{path}/{CONFIG_FILE}") != run_identity(config):
        raise CsclipError(f"run.name {name!r} already finished with a different config at {uri}; "
                          "choose another run.name or remove that directory")
    return TrainResult(name, uri, read_metrics(uri), None)


def check_unfinished_run(config: TrainConfig) -> None:
    """Refuse to reuse a run's storage for another config: when `<storage>/<name>/` holds
    checkpoints of an unfinished run, resuming is only right for the config that wrote
    them (the how-to-run fields aside). Raises CsclipError naming the run and the fixes."""
    name = run_name(config)
    uri = f"{storage_root(config).rstrip('/')}/{name}"
    fs, path = filesystem_for(uri)
    if not exists(fs, path):
        return
    infos = fs.get_file_info(pafs.FileSelector(path, recursive=False, allow_not_found=True))
    saved = sorted(i.path for i in infos if i.type == pafs.FileType.Directory
                   and i.base_name.startswith("checkpoint_")
                   and exists(fs, f"{i.path}/{CONFIG_FILE}"))
    if saved and _saved_identity(fs, f"{saved[-1]}/{CONFIG_FILE}") != run_identity(config):
        raise CsclipError(f"run.name {name!r}: {uri} holds an unfinished run of a different "
                          "config; rerun that config to resume it, or choose another run.name")


# Fields that were once in RunSection and live elsewhere now (a saved config may hold them).
_RETIRED_RUN_FIELDS = ("fail_after_step",)


def _saved_identity(fs, file: str) -> str:
    data = json.loads(read_bytes(fs, file))
    for key in _RETIRED_RUN_FIELDS:
        data.get("run", {}).pop(key, None)
    return run_identity(TrainConfig.model_validate(data))

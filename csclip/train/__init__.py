"""The training program (Ray Train on top of the library): config, loop, step, stream
(Ray Data), sampling (SPEC §3), optim, image foils, checkpoints, evaluation during
training. Evaluation never imports it; the demo, the ablation and the entry points do.

The names below load their module (and torch) on first use, not on `import
csclip.train`: Ray Train's dataset actors (its DatasetManager, Ray Data's SplitCoordinator
of every epoch) unpickle the map functions of csclip.train.stream and never need torch,
whose slow import each of them would pay on the way to a run's first step. The configs
(TrainConfig, RunSection, ...) live in csclip.config.train.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csclip.train.finished import TrainResult, finished_result, storage_root
    from csclip.train.identity import run_name
    from csclip.train.loop import run

__all__ = ["TrainResult", "finished_result", "run", "run_name", "storage_root"]

# Each name of __all__ and the module that owns it.
_OWNERS = {"TrainResult": "csclip.train.finished", "finished_result": "csclip.train.finished",
           "storage_root": "csclip.train.finished", "run_name": "csclip.train.identity",
           "run": "csclip.train.loop"}


def __getattr__(name: str):
    if name in _OWNERS:
        return getattr(importlib.import_module(_OWNERS[name]), name)
    raise AttributeError(f"module 'csclip.train' has no attribute {name!r}")

"""The training program (Ray Train on top of the library): config, loop, step, stream
(Ray Data), sampling (SPEC §3), optim, image foils, checkpoints, evaluation during
training. Evaluation never imports it; the demo, the ablation and the entry points do.

The names below load csclip.train.loop (and torch) on first use, not on `import
csclip.train`: Ray Train's dataset actors (its DatasetManager, Ray Data's SplitCoordinator
of every epoch) unpickle the map functions of csclip.train.stream and never need torch,
whose slow import each of them would pay on the way to a run's first step.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from csclip.config.train import RunSection, TrainConfig
    from csclip.train.loop import TrainResult, finished_result, run, run_name, storage_root

__all__ = ["TrainResult", "finished_result", "run", "run_name", "storage_root"]


def __getattr__(name: str):
    if name in __all__:
        return getattr(importlib.import_module("csclip.train.loop"), name)
    raise AttributeError(f"module 'csclip.train' has no attribute {name!r}")

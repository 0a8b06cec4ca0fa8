"""The training program (Ray Train on top of the library): config, loop, step, stream
(Ray Data), sampling (SPEC §3), optim, image foils, checkpoints, evaluation during
training. Evaluation never imports it; the demo, the ablation and the entry points do."""

from csclip.train.loop import (
    RunSection,
    TrainConfig,
    TrainResult,
    finished_result,
    run,
    run_name,
    storage_root,
)

__all__ = ["RunSection", "TrainConfig", "TrainResult", "finished_result", "run", "run_name",
           "storage_root"]

"""Ray Data's scheduling loop paced in a Train worker, so that the step gets the GIL.

One Train worker runs each epoch's Ray Data execution in its own process
(csclip.train.loop: one worker needs no split), in a StreamingExecutor thread beside the
training thread. While an epoch's blocks wait for the step to take them, Ray Data 2.60's
scheduling loop hardly waits: in the demo's stages it ran pass after pass, each a good
deal of Python (resource budgets, metrics, progress), so the loop held the
GIL for a large share of the time the step wanted it. A small model's step is mostly
Python dispatch and waits for the GIL on every op: two threads doing that much Python
stretched a CLIP-FT step by more than half (outside Ray, the same step;
docs/performance.md).

Here every StreamingExecutor of the worker's process leaves at least MIN_PERIOD_S between
the starts of two passes. A pass still dispatches every task it can and reads every ready
output, so an epoch's data comes as before, each block at most MIN_PERIOD_S later; the
next epoch opens ahead of its need (csclip.train.lookahead). The rows and their order
do not change (tests/test_pace.py). Written against Ray 2.60 (pyproject pins it); another
Ray without the loop method leaves the executor as it is, with a warning.

It replaces a private method, StreamingExecutor._scheduling_loop_step
(ray/data/_internal/execution/streaming_executor.py), because Ray 2.60 has no public
setting for the loop's pace: no DataContext field or RAY_DATA_* variable sets it, and its
only wait is ray.wait's timeout in process_completed_tasks (a module constant,
WAIT_FOR_TASK_COMPLETION_TIMEOUT_S, 0.1 s), which applies only while tasks run; with the
blocks waiting for the step the loop does not wait at all. benchmarks/bench_pace.py (60
steps of CLIP-FT on the world, paced and unpaced alternating in one process, 2 repeats
each): paced training was quicker in both repeats, with the same loss
(docs/performance.md, "Ray Data's scheduling loop beside the step").
"""

from __future__ import annotations

import logging
import time

from ray.data._internal.execution.streaming_executor import StreamingExecutor

logger = logging.getLogger(__name__)

MIN_PERIOD_S = 0.02


def pace_ray_data(min_period_s: float = MIN_PERIOD_S) -> bool:
    """Pace the scheduling loop of every StreamingExecutor of this process (idempotent;
    a later call sets the period). Returns False where Ray Data has no such loop."""
    step = getattr(StreamingExecutor, "_scheduling_loop_step", None)
    if step is None:
        logger.warning("Ray Data's StreamingExecutor has no _scheduling_loop_step: its "
                       "scheduling loop runs unpaced (csclip.train.pace)")
        return False
    original = getattr(step, "_csclip_original", step)

    def paced_step(self, topology) -> bool:
        last = getattr(self, "_csclip_last_pass", None)
        if last is not None:
            wait = min_period_s - (time.perf_counter() - last)
            if wait > 0:
                time.sleep(wait)  # releases the GIL for the training thread
        self._csclip_last_pass = time.perf_counter()
        return original(self, topology)

    paced_step._csclip_original = original
    paced_step._csclip_period = min_period_s
    StreamingExecutor._scheduling_loop_step = paced_step
    return True

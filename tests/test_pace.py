"""csclip.train.pace: Ray Data's scheduling loop paced, the rows and their order unchanged."""

import time

import numpy as np
import pytest

from csclip.train.pace import pace_ray_data
from csclip.train.stream import deterministic

pytestmark = pytest.mark.usefixtures("ray_session")


def _epoch() -> tuple[list[int], int]:
    """The ids of a shuffled, mapped epoch as a slow step reads them, and how many
    scheduling-loop passes its executor made."""
    import ray
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    passes = []
    step = StreamingExecutor._scheduling_loop_step

    def counted(self, topology):
        passes.append(1)
        return step(self, topology)

    StreamingExecutor._scheduling_loop_step = counted
    try:
        # In order, as a training epoch is (csclip.train.stream.deterministic): otherwise
        # the blocks come out as their tasks finish, and two epochs differ by chance.
        ds = deterministic(ray.data.range(2048, override_num_blocks=16)).random_shuffle(seed=3)
        ds = ds.map_batches(lambda batch: {"id": batch["id"],
                                           "x": np.ones((len(batch["id"]), 3000), np.uint8)})
        ids = []
        for batch in ds.iter_batches(batch_size=64, drop_last=True):
            ids.extend(batch["id"].tolist())
            time.sleep(0.01)  # the step
    finally:
        StreamingExecutor._scheduling_loop_step = step
    return ids, len(passes)


def unpace_ray_data() -> None:
    """Give StreamingExecutor its own loop back."""
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    step = StreamingExecutor._scheduling_loop_step
    StreamingExecutor._scheduling_loop_step = getattr(step, "_csclip_original", step)


def test_paced_loop_gives_the_same_rows_in_fewer_passes():
    plain, plain_passes = _epoch()
    assert pace_ray_data(0.05)
    try:
        started = time.perf_counter()
        paced, paced_passes = _epoch()
        seconds = time.perf_counter() - started
    finally:
        unpace_ray_data()
    assert paced == plain and sorted(plain) == list(range(2048))
    # at most one pass per period (and the first), however many the plain loop made
    assert paced_passes <= seconds / 0.05 + 2, (paced_passes, seconds, plain_passes)


def test_pacing_is_idempotent_and_undone():
    from ray.data._internal.execution.streaming_executor import StreamingExecutor

    own = StreamingExecutor._scheduling_loop_step
    assert pace_ray_data(0.02) and pace_ray_data(0.03)
    try:
        paced = StreamingExecutor._scheduling_loop_step
        assert paced is not own and paced._csclip_original is own
        assert paced._csclip_period == 0.03
    finally:
        unpace_ray_data()
    assert StreamingExecutor._scheduling_loop_step is own

"""glibc's allocator reuses what a data thread frees (no page faults per image) in a process
started with csclip.entry.ray_init.MALLOC_ENV, as every Ray worker of a run is; a user's own
thresholds are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from csclip.entry.ray_init import MALLOC_ENV, worker_env_vars

ROOT = Path(__file__).resolve().parents[1]

# Decodes and resizes COCO-sized JPEGs and stacks them four at a time, as a Ray Data task
# does, in one long-lived thread (a map task's thread), and prints the page faults per
# image of each pass after the first (whose arena grows to what an image needs in any
# case). One thread for every pass: a thread started after another was joined can find
# that one's arena not yet released (Python's join returns before the OS thread exits)
# and take a fresh arena, whose first growth faults whatever the thresholds.
SCRIPT = textwrap.dedent("""
    import json, queue, resource, sys, threading
    import numpy as np
    from PIL import Image
    from csclip.train.stream import decode_image

    paths = sys.argv[1:]

    def faults_per_image():
        start = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        images = []
        for path in paths:
            image = decode_image({"image_path": path}).resize((298, 224), Image.BICUBIC)
            images.append(np.asarray(image))
            if len(images) == 4:
                np.stack(images).copy()  # a block, as the map task's output
                images = []
        return (resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - start) / len(paths)

    jobs, results = queue.Queue(), queue.Queue()

    def data_thread():
        while (job := jobs.get()) is not None:
            results.put(job())

    threading.Thread(target=data_thread, daemon=True).start()
    jobs.put(faults_per_image)
    results.get()  # the arena's first growth faults in any case
    passes = []
    for _ in range(3):
        jobs.put(faults_per_image)
        passes.append(results.get())
    jobs.put(None)
    print(json.dumps(passes))
""")


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("jpegs")
    rng = np.random.default_rng(0)
    paths = []
    for index in range(12):
        size = (640, 480) if index % 2 == 0 else (480, 640)
        pixels = rng.integers(0, 256, (size[1] // 8, size[0] // 8, 3), dtype=np.uint8)
        path = folder / f"{index}.jpg"
        Image.fromarray(pixels).resize(size, Image.BILINEAR).save(path, "JPEG", quality=90)
        paths.append(str(path))
    return paths


def _faults(paths: list[str], env: dict[str, str]) -> list[float]:
    """Page faults per image of three passes in a fresh process with `env` (and no other
    MALLOC_ setting)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    environment.update(env, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT, *paths], capture_output=True,
                            text=True, env=environment, check=True, timeout=120)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc variables")
def test_a_data_thread_reuses_what_it_freed_with_the_workers_environment(jpegs):
    # Without the variables each image's buffers went back to the kernel and were faulted
    # in again (53 pages an image here, ~330 in a Ray Data task's larger blocks); with
    # them, none.
    assert min(_faults(jpegs, {})) > 20
    assert max(_faults(jpegs, MALLOC_ENV)) < 2


def test_the_workers_get_the_thresholds_unless_the_user_sets_one(monkeypatch):
    for name in MALLOC_ENV:
        monkeypatch.delenv(name, raising=False)
    assert worker_env_vars() == MALLOC_ENV
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "131072")
    assert worker_env_vars() == {}  # the user's thresholds rule, inherited or their job's

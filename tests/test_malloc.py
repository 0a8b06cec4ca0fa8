"""csclip.train.malloc: glibc's allocator reuses what a data thread frees (no page faults
per image), unless the user's environment sets its thresholds."""

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

ROOT = Path(__file__).resolve().parents[1]

# Decodes and resizes COCO-sized JPEGs and stacks them four at a time, as a Ray Data task
# does, in one long-lived thread (a map task's thread), before and after reuse_freed_memory,
# and prints the page faults per image of each pass. One thread for every pass: a thread
# started after another was joined can find that one's arena not yet released (Python's
# join returns before the OS thread exits) and take a fresh arena, whose first growth
# faults whatever the thresholds (CI saw 88 faults an image after the call that way).
SCRIPT = textwrap.dedent("""
    import json, queue, resource, sys, threading
    import numpy as np
    from PIL import Image
    from csclip.train.malloc import reuse_freed_memory
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

    def in_data_thread(job):
        jobs.put(job)
        return results.get()

    in_data_thread(faults_per_image)  # the arena's first growth faults in any case
    before = [in_data_thread(faults_per_image) for _ in range(3)]
    done = in_data_thread(reuse_freed_memory)
    in_data_thread(faults_per_image)  # the arena grows once to what an image needs
    after = [in_data_thread(faults_per_image) for _ in range(3)]
    jobs.put(None)
    print(json.dumps({"done": done, "before": before, "after": after}))
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


def _run(paths: list[str], **env: str) -> dict:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    environment.update(env, PYTHONPATH=str(ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT, *paths], capture_output=True,
                            text=True, env=environment, check=True, timeout=120)
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_a_data_thread_reuses_what_it_freed(jpegs):
    result = _run(jpegs)
    assert result["done"]
    # Each image's buffers went back to the kernel and were faulted in again (53 pages an
    # image here, ~330 in a Ray Data task's larger blocks), then none.
    assert min(result["before"]) > 20
    assert max(result["after"]) < 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_users_own_malloc_settings_are_kept(jpegs):
    result = _run(jpegs, MALLOC_TRIM_THRESHOLD_="131072")
    assert not result["done"]
    assert min(result["after"]) > 20  # nothing changed: the user's thresholds rule

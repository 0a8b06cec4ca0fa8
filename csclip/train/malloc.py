"""glibc's malloc told to reuse freed memory in the processes that decode and ship images.

Ray Data runs a map function in a thread of its worker, whose allocations come from one of
glibc's per-thread arenas, and such an arena hands memory it frees back to the kernel: every
image's buffers (a decoded 640x480 JPEG is 1.2 MB, its resize 0.6 MB) were faulted in again
for the next image: hundreds of page faults an image in a Ray Data task at 224 px, fewer in
a plain thread and in the main thread, whose mmap threshold glibc raises as it goes.
With the threshold fixed at 32 MB (glibc's largest on 64-bit) and the trim threshold at
256 MB, freed memory is reused: no faults, and less of the map function's CPU per image
(docs/performance.md). Allocations of 32 MB and more are still mapped
and unmapped as before, and what an arena keeps is memory the process used anyway.

A process whose environment sets glibc's own MALLOC_MMAP_THRESHOLD_ or
MALLOC_TRIM_THRESHOLD_ keeps its settings; elsewhere than glibc nothing changes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 256 * 2**20
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache
def reuse_freed_memory() -> bool:
    """Set the thresholds once per process; True when they are set, False where the user's
    environment sets them or the C library has no glibc mallopt (nothing changed)."""
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # no libc found, or one without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; musl's stub returns 0 and changes nothing.
    done = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
    done = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and done
    logger.debug("glibc malloc thresholds %s in pid %d", "set" if done else "not set", os.getpid())
    return done

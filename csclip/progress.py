"""Progress of a loop over data outside Ray Data (encoding, building a benchmark, replaying
stored answers): a tqdm bar on a terminal, log lines elsewhere.

A bar drawn into a log file (`ray job submit`, `nohup ... > log`) is one line of carriage
returns that grows for the whole loop; there a line through the `csclip.progress` logger
every LOG_EVERY_FRACTION of the loop, or every LOG_EVERY_S seconds when it moves slower
(or has no known total), reads as the job's progress. Loops shorter than SHOW_AFTER_S say
nothing either way. Both go to stderr, never stdout, so a command's results stay clean and
an error stays its one `error:` line.

CSCLIP_PROGRESS picks the mode: `bar`, `log`, `off`, or `auto` (the default: a bar when
stderr is a terminal, else log lines).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from tqdm.auto import tqdm

log = logging.getLogger(__name__)

ENV_VAR = "CSCLIP_PROGRESS"
MODES = ("auto", "bar", "log", "off")
SHOW_AFTER_S = 2.0  # a loop done sooner shows no bar and logs no line
LOG_EVERY_FRACTION = 0.1  # log mode: a line at every tenth of the total...
LOG_EVERY_S = 30.0  # ...or after this long without one
LOG_MIN_GAP_S = 1.0  # never two lines within this (a fast loop crossing several tenths)

T = TypeVar("T")


class Progress(Protocol[T]):
    """What callers use of a progress object: iterate it, or update it by hand."""

    def __iter__(self) -> Iterator[T]: ...

    def update(self, n: int = 1) -> Any: ...

    def close(self) -> None: ...

    def __enter__(self) -> Progress[T]: ...

    def __exit__(self, *exc: object) -> Any: ...


def mode() -> str:
    """The progress mode in effect: CSCLIP_PROGRESS, with `auto` resolved by whether
    stderr is a terminal. An unknown value counts as `auto` (progress is never worth
    refusing a run for)."""
    chosen = os.environ.get(ENV_VAR, "auto").strip().lower()
    if chosen in ("1", "true", "on"):
        chosen = "bar"
    elif chosen in ("0", "false", "no", "none"):
        chosen = "off"
    if chosen not in MODES or chosen == "auto":
        stream = sys.stderr
        chosen = "bar" if stream is not None and stream.isatty() else "log"
    return chosen


def progress(iterable: Iterable[T] | None = None, desc: str = "", total: int | None = None,
             unit: str = "item", enabled: bool = True) -> Progress[T]:
    """`iterable` wrapped to show its progress (mode()): iterate the result as the
    iterable, or, without one, call `.update(n)` and `.close()` (or use it as a context
    manager). total: the number of items (default len(iterable) where it has one);
    enabled=False shows nothing (a loop that is one part of a larger one)."""
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    chosen = mode() if enabled else "off"
    if chosen == "log":
        return LogProgress(iterable, desc, total, unit)

    return tqdm(iterable, desc=desc, total=total, unit=unit, file=sys.stderr,
                delay=SHOW_AFTER_S, dynamic_ncols=True, disable=chosen == "off")


class LogProgress(Generic[T]):
    """Progress as log lines (see the module docstring): `desc: n/total (p%) in Xs, ETA Ys`,
    and one closing line when any line was logged."""

    def __init__(self, iterable: Iterable[T] | None, desc: str, total: int | None,
                 unit: str = "item", clock=time.monotonic) -> None:
        self.iterable = iterable
        self.desc = desc
        self.total = total
        self.unit = unit
        self.clock = clock
        self.n = 0
        self.start = clock()
        self._last_line: float | None = None  # clock() at the last line logged
        self._last_tenth = 0  # the tenth of the total reached at that line
        self._closed = False

    def __iter__(self) -> Iterator[T]:
        if self.iterable is None:
            raise TypeError("LogProgress without an iterable: call update() instead")
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def __enter__(self) -> LogProgress[T]:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None:  # the error says what happened; no closing line
            self._closed = True
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        elapsed = now - self.start
        if elapsed < SHOW_AFTER_S:
            return
        since = now - (self._last_line if self._last_line is not None else self.start)
        tenth = self._tenth()
        if since < LOG_MIN_GAP_S and self._last_line is not None:
            return
        if tenth > self._last_tenth or since >= LOG_EVERY_S:
            self._log(elapsed)
            self._last_line, self._last_tenth = now, tenth

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._last_line is not None:  # a loop that said nothing stays silent
            self._log(self.clock() - self.start, done=True)

    def _tenth(self) -> int:
        if not self.total:
            return 0
        return math.floor(self.n / self.total / LOG_EVERY_FRACTION + 1e-9)

    def _log(self, elapsed: float, done: bool = False) -> None:
        log.info("%s", self.line(elapsed, done))

    def line(self, elapsed: float, done: bool = False) -> str:
        """`encode images: 512/5000 images (10%) in 12s, 42.7 images/s, ETA 1m45s`."""
        rate = self.n / elapsed if elapsed > 0 else 0.0
        count = f"{self.n}/{self.total}" if self.total else f"{self.n}"
        percent = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        text = (f"{self.desc}: {count} {self.unit}s{percent} in {_duration(elapsed)}, "
                f"{rate:.1f} {self.unit}s/s")
        if done:
            return text + (", ended early" if self.total and self.n < self.total else ", done")
        if self.total and rate > 0 and self.n < self.total:
            text += f", ETA {_duration((self.total - self.n) / rate)}"
        return text


def _duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"

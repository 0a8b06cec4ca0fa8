"""The next epoch's stream started before the current epoch ends.

Each epoch is its own Ray Data execution (csclip.train.shards.shard_datasets), whose
first rows wait for a group of shards to be read and sampled. Opened when the
last batch of the epoch before is taken, an epoch's first batch waits for the shuffle,
the first map task and the iterator's start: in the demo's warm start every report
interval that holds an epoch boundary waited for data, and the intervals without one
did not (docs/performance.md). Here the next epoch is opened a few
batches before the current one ends and its first batch is drawn in a thread, so that
wait overlaps the last steps. The batches are the same, in the same order: each epoch's
content is a function of the config (csclip.train.stream.deterministic); only the time
its execution starts moves.

Pure Python (no Ray, no torch): `epochs_ahead` takes the function that opens an epoch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

# The next epoch opens when this many of the current epoch's batches are left (at least;
# a twentieth of a long epoch): by then the current epoch's rows are produced (its
# batches come from the local shuffle buffer and the prefetch queue), so the two
# executions hardly share the CPUs, and the window still covers the world's shuffle
# barrier (shorter than 8 of the demo's steps).
LEFT_WHEN_OPENED = 8

_END = object()


def ahead_of_end(steps_per_epoch: int) -> int:
    """How many batches before an epoch's end the next epoch opens."""
    return max(LEFT_WHEN_OPENED, steps_per_epoch // 20)


class NextEpoch:
    """An epoch's batch iterator whose first batch is drawn in a thread from the start.

    `batches()` gives that batch and the rest, in order; an error of the first draw is
    raised there. `close()` waits for the draw and closes the iterator (an epoch that
    is not trained: the run ended or failed before it)."""

    def __init__(self, handle: Any, batches: Iterator) -> None:
        self.handle = handle  # what opened it (the worker's shard), for the caller
        self._batches = batches
        self._first: Any = _END
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._draw, name="csclip-next-epoch",
                                        daemon=True)
        self._thread.start()

    def _draw(self) -> None:
        try:
            self._first = next(self._batches)
        except StopIteration:
            pass
        except BaseException as err:  # raised in the training thread, where it is read
            self._error = err

    def batches(self) -> Iterator:
        self._thread.join()
        if self._error is not None:
            raise self._error
        try:
            if self._first is not _END:
                first, self._first = self._first, _END
                yield first
                yield from self._batches
        finally:
            self.close()

    def close(self) -> None:
        self._thread.join()
        _close(self._batches)


def epochs_ahead(open_epoch: Callable[[int], tuple[Any, Iterator]], first: int,
                 num_epochs: int, steps_per_epoch: int, skip: int = 0,
                 opened: NextEpoch | None = None) -> Iterator[tuple[int, Any, Iterator]]:
    """(epoch, handle, batches) for epochs first .. num_epochs - 1, as `open_epoch(epoch)`
    gives (handle, iterator), with the first `skip` batches of the first epoch skipped
    (trained on before a restart). The next epoch is opened, and its first batch drawn
    in a thread, when ahead_of_end(steps_per_epoch) of the current epoch's batches are
    left (at once when fewer are). `opened`: epoch `first`, opened already (a fresh run
    opens epoch 0 while its model is built). The caller iterates each epoch's batches to
    the end before asking for the next; closing this generator closes an epoch opened
    ahead.
    """
    opened: list[NextEpoch] = [opened] if opened is not None else []  # the next epoch
    try:
        for epoch in range(first, num_epochs):
            if opened:
                upcoming = opened.pop()
                handle, batches = upcoming.handle, upcoming.batches()
            else:
                handle, batches = open_epoch(epoch)
            left = steps_per_epoch
            if epoch == first:
                for _ in range(skip):
                    next(batches)
                left -= skip

            def open_next(epoch: int = epoch) -> None:
                opened.append(NextEpoch(*open_epoch(epoch + 1)))

            yield epoch, handle, _opening_next(batches, left - ahead_of_end(steps_per_epoch),
                                               open_next if epoch + 1 < num_epochs else None)
    finally:
        for upcoming in opened:  # opened, never trained on: the run ended or failed
            upcoming.close()


def _opening_next(batches: Iterator, before: int, open_next: Callable[[], None] | None
                  ) -> Iterator:
    """`batches`, with open_next() called before batch number `before` (0-based) is
    given, or after the last when the epoch has no such batch."""
    try:
        for index, batch in enumerate(batches):
            if index == max(before, 0) and open_next is not None:
                open_next()
                open_next = None
            yield batch
    finally:  # closed early (the run's last step came first): stop its prefetching
        _close(batches)
    if open_next is not None:  # a shorter epoch than planned: the loop says so
        open_next()


def _close(batches: Iterator) -> None:
    """Close a batch iterator that can be closed (Ray's generators stop prefetching)."""
    close = getattr(batches, "close", None)
    if close is not None:
        close()

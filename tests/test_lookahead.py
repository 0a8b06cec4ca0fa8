"""csclip.train.lookahead: the next epoch opens before the current one ends, and its
batches are the ones it would have given opened at the boundary."""

from __future__ import annotations

import threading

import pytest

from csclip.train.lookahead import LEFT_WHEN_OPENED, ahead_of_end, epochs_ahead


class Epoch:
    """A fake epoch's batch iterator: records where its first batch was drawn and whether
    it was closed; `gate` holds the first draw until set."""

    def __init__(self, epoch: int, size: int, gate: threading.Event | None = None,
                 error: Exception | None = None):
        self.batches = iter([(epoch, index) for index in range(size)])
        self.epoch, self.gate, self.error = epoch, gate, error
        self.drawn = threading.Event()
        self.first_thread: str | None = None
        self.closed = False

    def __iter__(self):
        return self

    def __next__(self):
        if self.first_thread is None:
            self.first_thread = threading.current_thread().name
            if self.gate is not None:
                assert self.gate.wait(10)
            self.drawn.set()
            if self.error is not None:
                raise self.error
        return next(self.batches)

    def close(self):
        self.closed = True


class Opener:
    def __init__(self, size: int, per_epoch: dict | None = None):
        self.size, self.per_epoch, self.epochs, self.log = size, per_epoch or {}, {}, []

    def __call__(self, epoch: int):
        self.epochs[epoch] = Epoch(epoch, self.size, **self.per_epoch.get(epoch, {}))
        self.log.append(("open", epoch))
        return f"shard-{epoch}", self.epochs[epoch]


def consume(generator, opener: Opener) -> list:
    seen = []
    for epoch, handle, batches in generator:
        assert handle == f"shard-{epoch}"
        for batch in batches:
            opener.log.append(("batch", batch))
            seen.append(batch)
    return seen


def test_the_same_batches_in_order_with_the_restart_skip():
    opener = Opener(20)
    seen = consume(epochs_ahead(opener, first=1, num_epochs=4, steps_per_epoch=20, skip=5),
                   opener)
    assert seen == [(1, i) for i in range(5, 20)] + [(e, i) for e in (2, 3) for i in range(20)]
    assert sorted(opener.epochs) == [1, 2, 3]  # nothing past the last epoch


def test_the_next_epoch_opens_when_its_margin_of_batches_is_left():
    opener = Opener(20)
    consume(epochs_ahead(opener, first=0, num_epochs=2, steps_per_epoch=20), opener)
    opened_at = opener.log.index(("open", 1))
    before = [entry for entry in opener.log[:opened_at] if entry[0] == "batch"]
    assert len(before) == 20 - LEFT_WHEN_OPENED  # then 8 batches of epoch 0 are left
    assert ahead_of_end(20) == LEFT_WHEN_OPENED and ahead_of_end(2000) == 100


def test_the_first_batch_is_drawn_in_a_thread_while_the_epoch_before_trains():
    gate = threading.Event()
    opener = Opener(12, {1: {"gate": gate}})
    generator = epochs_ahead(opener, first=0, num_epochs=2, steps_per_epoch=12)
    _, _, batches = next(generator)
    for index, _batch in enumerate(batches):
        if index == 11:  # the last batch of epoch 0: epoch 1 is drawing its first
            assert 1 in opener.epochs
            gate.set()
            assert opener.epochs[1].drawn.wait(10)
    assert opener.epochs[1].first_thread == "csclip-next-epoch"
    _, _, batches = next(generator)
    assert list(batches) == [(1, i) for i in range(12)]


def test_a_resumed_epoch_past_the_margin_opens_the_next_at_once():
    opener = Opener(20)
    generator = epochs_ahead(opener, first=0, num_epochs=2, steps_per_epoch=20, skip=15)
    _, _, batches = next(generator)
    assert next(batches) == (0, 15)
    assert ("open", 1) in opener.log


def test_an_error_of_the_first_draw_is_raised_in_the_training_thread():
    opener = Opener(10, {1: {"error": OSError("object store lost")}})
    with pytest.raises(OSError, match="object store lost"):
        consume(epochs_ahead(opener, first=0, num_epochs=2, steps_per_epoch=10), opener)


def test_a_run_that_stops_closes_the_epoch_it_opened_ahead():
    opener = Opener(10)
    generator = epochs_ahead(opener, first=0, num_epochs=3, steps_per_epoch=10)
    _, _, batches = next(generator)
    for _ in range(9):  # the next epoch is open after batch 2
        next(batches)
    batches.close()
    generator.close()  # a failed step: the loop's generator is closed
    assert opener.epochs[0].closed and opener.epochs[1].closed
    assert 2 not in opener.epochs


def test_a_first_epoch_opened_before_the_loop_is_the_one_trained():
    """A fresh run opens epoch 0 while its model is built (loop.train_loop_per_worker):
    its first batch is drawn in the thread, epoch 0 is not opened again, and the batches
    are the same."""
    from csclip.train.lookahead import NextEpoch

    gate = threading.Event()
    opener = Opener(12, {0: {"gate": gate}})
    early = NextEpoch(*opener(0))  # the model is being built: the draw waits on the gate
    gate.set()
    assert opener.epochs[0].drawn.wait(10)
    seen = consume(epochs_ahead(opener, first=0, num_epochs=2, steps_per_epoch=12,
                                opened=early), opener)
    assert seen == [(e, i) for e in (0, 1) for i in range(12)]
    assert opener.log.count(("open", 0)) == 1
    assert opener.epochs[0].first_thread == "csclip-next-epoch"

    stopped = NextEpoch(*Opener(12)(0))  # the model failed to build: the caller closes it
    stopped.close()
    assert stopped._batches.closed

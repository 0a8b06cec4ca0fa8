"""A line per finished trial of a sweep, as it lands: its setting and the table's measured
columns (csclip.ablation.report.TABLE_COLUMNS), so the results read in the console and the
job's log long before the table is written. Pure (no Ray): csclip.ablation.callback mixes
TrialLines into a Tune Callback."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from csclip.ablation.report import TABLE_COLUMNS, column_value

logger = logging.getLogger(__name__)

FINISHED_STATUSES = ("TERMINATED", "ERROR")  # Tune's Trial.status of a trial that is over


def trial_line(setting: str, metrics: Mapping[str, Any] | None, finished: int, total: int) -> str:
    """`ablate: trial 2/4 done: lr=1e-05: HT All 62.3, HT Ent 70.1, ... (train 95 s, eval
    31 s)`: the columns measured, in the table's order and names (percentages)."""
    values = [(name, column_value(metrics, keys)) for name, keys in TABLE_COLUMNS]
    measured = ", ".join(f"{name} {value:.1f}" for name, value in values if value is not None)
    timing = [f"{label} {metrics[key]:.0f} s" for label, key in
              (("train", "trial_train_seconds"), ("eval", "trial_eval_seconds"))
              if isinstance((metrics or {}).get(key), int | float)]
    line = f"ablate: trial {finished}/{total} done: {setting}: {measured or 'no evaluation metrics'}"
    return line + (f" ({', '.join(timing)})" if timing else "")


def failed_line(setting: str, error: str, finished: int, total: int) -> str:
    return f"ablate: trial {finished}/{total} failed: {setting}: {error}"


class TrialLines:
    """Tune callback methods that log one line per finished trial (on_trial_complete,
    on_trial_error). `emit` takes the line (default: this module's logger, at INFO)."""

    def __init__(self, emit: Callable[[str], None] | None = None,
                 num_trials: int | None = None) -> None:
        self.emit = emit  # None: resolved per line (the callback is pickled with the Tuner)
        # The sweep's size: Tune makes a grid's trials as slots free up, so the trials it
        # passes may be fewer than the sweep's (1 of 1 done in a sweep of 2).
        self.num_trials = num_trials

    def on_trial_complete(self, iteration: int, trials: Sequence, trial, **info) -> None:
        finished, total = _counts(trials, trial, self.num_trials)
        self._emit(trial_line(_setting(trial), trial.last_result, finished, total))

    def on_trial_error(self, iteration: int, trials: Sequence, trial, **info) -> None:
        finished, total = _counts(trials, trial, self.num_trials)
        self._emit(failed_line(_setting(trial), _error(trial), finished, total))

    def _emit(self, line: str) -> None:
        (self.emit or logger.info)(line)


def _setting(trial) -> str:
    return str((trial.config or {}).get("setting", trial))


def _counts(trials: Sequence, trial, num_trials: int | None = None) -> tuple[int, int]:
    """Trials over (this one counted whether Tune set its status yet or not), of all
    (`num_trials`, the sweep's size, where known)."""
    finished = sum(1 for t in trials if t is trial or t.status in FINISHED_STATUSES)
    return finished, max(num_trials or 0, len(trials), finished)


def _error(trial) -> str:
    """The last line of the trial's error (the sweep's report keeps the rest): Tune's
    local error file, written before the callbacks run (get_error() reads the copy in
    storage, which is synced later)."""
    error = None
    try:
        local = getattr(trial, "error_file", None)
        if local and Path(local).is_file():
            error = Path(local).read_text(errors="replace")
        else:
            error = trial.get_error()
    except Exception:  # an error that cannot be read must not stop the sweep's lines
        error = None
    lines = [line.strip() for line in str(error or "").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "see Tune's log of the trial"

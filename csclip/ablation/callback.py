"""The Tune Callback of a sweep (imports Ray; the lines are csclip.ablation.console's)."""

from __future__ import annotations

from ray.tune import Callback

from csclip.ablation.console import TrialLines


class TrialLinesCallback(TrialLines, Callback):
    """A line per finished trial, as it lands (csclip.ablation.console.TrialLines)."""

"""Metrics (strict comparisons: a tie is a failure): Acc_HT, Δ, win rate, consistency,
bootstrap CIs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from csclip.eval.halftruth.items import ALL_CONDITIONS, GROUPS, HalfTruthItem


@dataclass(frozen=True)
class ItemScores:
    """Cosine similarities of each item's image with its three texts, shape (num_items,)."""

    anchor: np.ndarray
    completion: np.ndarray
    half_truth: np.ndarray

    def __post_init__(self) -> None:
        arrays = [
            np.asarray(a, dtype=np.float64) for a in (self.anchor, self.completion, self.half_truth)
        ]
        if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
            raise ValueError(f"ItemScores: shapes differ {[a.shape for a in arrays]}")
        for name, array in zip(("anchor", "completion", "half_truth"), arrays, strict=True):
            object.__setattr__(self, name, array)


def bootstrap_ci(
    values: np.ndarray, num_resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean of `values` (resampling items with replacement)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or num_resamples <= 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples)
    # Chunks keep the (resamples, n) index matrix near 4M entries for large benchmarks.
    chunk = max(1, 4_000_000 // values.size)
    for start in range(0, num_resamples, chunk):
        stop = min(num_resamples, start + chunk)
        means[start:stop] = values[rng.integers(0, values.size, (stop - start, values.size))].mean(
            1
        )
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(low), float(high)


def half_truth_metrics(
    items: Sequence[HalfTruthItem], scores: ItemScores, num_bootstrap: int = 1000, seed: int = 0
) -> dict[str, float]:
    """SPEC §4 metrics, micro-averaged over items; accuracies in percent.

    Keys, for scope in all (the paper's eight conditions) / entity / relation / each
    condition slug (neg included, outside every average):
      ht_<scope>            Acc_HT = 100 * mean[s(A) > s(A-)]
      ht_gap_<scope>        Δ = mean[s(A) - s(A-)]   (`ht_gap` for all)
      winrate_<scope>       100 * mean[s(A+) > s(A-)]   (Table 7)
      consistency_<scope>   100 * mean[s(A+) > s(A)]
      <metric>_ci_low / _ci_high   bootstrap 95% CI of ht, ht_gap and winrate
      num_items_<scope>
    A scope without items has only num_items_<scope> = 0.
    """
    if len(items) != scores.anchor.shape[0]:
        raise ValueError(f"{len(items)} items but {scores.anchor.shape[0]} scores")
    conditions = np.array([item.condition for item in items])
    groups = np.array([item.group for item in items])
    correct = (scores.anchor > scores.half_truth).astype(np.float64) * 100
    gap = scores.anchor - scores.half_truth
    wins = (scores.completion > scores.half_truth).astype(np.float64) * 100
    consistent = (scores.completion > scores.anchor).astype(np.float64) * 100
    # "all" is the paper's eight conditions: Neg (group "negation") only on its own.
    scopes = [("all", np.isin(groups, GROUPS))]
    scopes += [(g, groups == g) for g in GROUPS] + [
        (c.slug, conditions == c.slug) for c in ALL_CONDITIONS
    ]
    metrics: dict[str, float] = {}
    for offset, (scope, mask) in enumerate(scopes):
        metrics[f"num_items_{scope}"] = float(mask.sum())
        if not mask.any():
            continue
        gap_key = "ht_gap" if scope == "all" else f"ht_gap_{scope}"
        for index, (key, values) in enumerate(
            ((f"ht_{scope}", correct[mask]), (gap_key, gap[mask]), (f"winrate_{scope}", wins[mask]))
        ):
            metrics[key] = float(values.mean())
            low, high = bootstrap_ci(values, num_bootstrap, seed=seed + 10 * offset + index)
            metrics[f"{key}_ci_low"], metrics[f"{key}_ci_high"] = low, high
        metrics[f"consistency_{scope}"] = float(consistent[mask].mean())
    return metrics

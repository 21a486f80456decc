"""The statistics of `bench power` (docs/POWER.md): synthetic experiments resampled from the
per-block log ratios of runs with no effect, judged by the harness's own interval and
verdict (stats.t_quantile, stats.decide). Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd

from harness.analysis.stats import FASTER, SLOWER, Rule, decide, t_quantile

POWER = 0.8  # a slowdown is "detectable" when this share of experiments call it slower
MIN_POOL = 8  # null ratios needed to resample them rather than use a normal of their spread
LARGEST = 10.0  # slowdowns searched up to +1000% time


def cv(values: Sequence[float] | pd.Series) -> float | None:
    """Coefficient of variation: sample standard deviation over mean (None for < 2 values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() == 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def null_pool(aa: np.ndarray, planted: Sequence[np.ndarray] = ()) -> np.ndarray:
    """Per-block log ratios with no effect in them: the A/A ratios as they are, and each planted
    run's ratios less their mean, scaled by sqrt(k / (k - 1)) so their spread is unbiased."""
    parts = [np.asarray(aa, dtype=float)]
    for ratios in planted:
        r = np.asarray(ratios, dtype=float)
        if len(r) >= 2:
            parts.append((r - r.mean()) * math.sqrt(len(r) / (len(r) - 1)))
    pool = np.concatenate(parts)
    return pool[np.isfinite(pool)]


def resample(pool: np.ndarray, blocks: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """`draws` synthetic null experiments of `blocks` log ratios each: drawn from the pool with
    replacement, each with a random sign (A and B are exchangeable when nothing changed). A
    pool of fewer than MIN_POOL ratios is too coarse to resample (two values give identical
    blocks half the time): then the draws are normal with the pool's root mean square."""
    pool = np.asarray(pool, dtype=float)
    if len(pool) < MIN_POOL:
        return rng.normal(0.0, float(np.sqrt(np.mean(pool**2))), size=(draws, blocks))
    picks = rng.choice(pool, size=(draws, blocks), replace=True)
    return picks * rng.choice([-1.0, 1.0], size=(draws, blocks))


def verdicts(
    draws: np.ndarray, slowdown: float, higher_is_better: bool, rule: Rule = Rule()
) -> list[str]:
    """The verdict of each experiment (row of log ratios) with B slowed by `slowdown` (+x time
    per unit of work: tok/s / (1 + x), ms * (1 + x)): the t-interval of stats.paired_change."""
    shift = math.log1p(slowdown) * (-1.0 if higher_is_better else 1.0)
    x = np.asarray(draws, dtype=float) + shift
    n = x.shape[1]
    mean, half = x.mean(axis=1), t_quantile(rule.level, n - 1) * x.std(axis=1, ddof=1) / n**0.5
    return [
        decide(lo, hi, higher_is_better, rule)
        for lo, hi in zip(mean - half, mean + half, strict=True)
    ]


def false_positive_rate(draws: np.ndarray, higher_is_better: bool, rule: Rule = Rule()) -> float:
    """Share of no-change experiments called "faster" or "slower"."""
    found = verdicts(draws, 0.0, higher_is_better, rule)
    return sum(v in (FASTER, SLOWER) for v in found) / len(found)


def detection_rate(
    draws: np.ndarray, slowdown: float, higher_is_better: bool, rule: Rule = Rule()
) -> float:
    """Share of experiments with B slowed by `slowdown` called "slower"."""
    found = verdicts(draws, slowdown, higher_is_better, rule)
    return sum(v == SLOWER for v in found) / len(found)


def min_detectable_slowdown(
    draws: np.ndarray, higher_is_better: bool, rule: Rule = Rule(), power: float = POWER
) -> float | None:
    """The smallest slowdown called "slower" in `power` of the experiments (bisection on a log
    scale; the same draws at every step, so the rate only grows with the slowdown); None when
    even +LARGEST is not."""
    if detection_rate(draws, LARGEST, higher_is_better, rule) < power:
        return None
    low, high = 1e-4, LARGEST
    if detection_rate(draws, low, higher_is_better, rule) >= power:
        return low
    for _ in range(30):
        mid = math.sqrt(low * high)
        low, high = (
            (low, mid)
            if detection_rate(draws, mid, higher_is_better, rule) >= power
            else (mid, high)
        )
    return high

"""The statistics of `bench power` (docs/POWER.md): synthetic experiments whose server noise is
drawn from what the block + arm model left of real runs, judged by the harness's own
interval and verdict (stats.judge, the computation of stats.paired_change). Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.stats import FASTER, SLOWER, Design, Rule, judge, residuals, usable

POWER = 0.8  # a slowdown is "detectable" when this share of experiments call it slower
PLANTED = 0.10  # the slowdown whose detection rate and coverage are quoted (+10% time)
MIN_POOL = 8  # residuals needed to resample them rather than use a normal of their spread
LARGEST = 10.0  # slowdowns searched up to +1000% time


def cv(values: Sequence[float] | pd.Series) -> float | None:
    """Coefficient of variation: sample standard deviation over mean (None for < 2 values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() == 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def run_residuals(values: pd.DataFrame) -> np.ndarray:
    """One run's server noise: the block + arm model's residuals of its per-server log values
    (columns letter, block, value), whatever arm B's effect (a planted delay is fitted out).
    Empty when the run has no residual degrees of freedom."""
    rows = usable(values, "A", "B")
    design = Design(rows["block"].to_numpy(), (rows["letter"] == "B").to_numpy())
    if not len(rows) or design.df < 1:
        return np.empty(0)
    return residuals(np.log(rows["value"].to_numpy(float)), design)


def experiments(
    pool: np.ndarray, design: Design, draws: int, rng: np.random.Generator
) -> np.ndarray:
    """[draws, servers] server noise for synthetic runs laid out as `design`: drawn from the
    pool with replacement, each with a random sign (with no change, A and B are exchangeable).
    A pool of fewer than MIN_POOL residuals is too coarse to resample: then the noise is
    normal with the pool's root mean square."""
    pool = np.asarray(pool, dtype=float)
    shape = (draws, len(design.blocks))
    if len(pool) < MIN_POOL:
        return rng.normal(0.0, float(np.sqrt(np.mean(pool**2))), size=shape)
    return rng.choice(pool, size=shape, replace=True) * rng.choice([-1.0, 1.0], size=shape)


@dataclass(frozen=True)
class Experiments:
    """Synthetic runs laid out as `design`, their server noise `noise` ([draws, servers]),
    judged by the harness's interval and verdict for a figure of this direction."""

    noise: np.ndarray
    design: Design
    higher_is_better: bool
    rule: Rule = Rule()

    def judged(self, slowdown: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        """With B slowed by `slowdown` (+x time per unit of work: tok/s / (1 + x),
        ms * (1 + x)): each run's verdict and interval (log units), and the true change."""
        truth = math.log1p(slowdown) * (-1.0 if self.higher_is_better else 1.0)
        logs = self.noise + truth * self.design.is_b
        _, low, high, found = judge(logs, self.design, self.higher_is_better, self.rule)
        return found, low, high, truth

    def verdicts(self, slowdown: float) -> np.ndarray:
        return self.judged(slowdown)[0]

    def false_positive_rate(self) -> float:
        """Share of no-change runs called "faster" or "slower"."""
        return float(np.isin(self.verdicts(0.0), [FASTER, SLOWER]).mean())

    def detection_rate(self, slowdown: float) -> float:
        """Share of runs with B slowed by `slowdown` called "slower"."""
        return float((self.verdicts(slowdown) == SLOWER).mean())

    def coverage(self, slowdown: float) -> float:
        """Share of runs with B slowed by `slowdown` whose interval holds the truth."""
        _, low, high, truth = self.judged(slowdown)
        return float(((low <= truth) & (truth <= high)).mean())

    def min_detectable_slowdown(self, power: float = POWER) -> float | None:
        """The smallest slowdown called "slower" in `power` of the runs (bisection on a log
        scale; the same draws at every step, so the rate only grows with the slowdown); None
        when even +LARGEST is not."""
        if self.detection_rate(LARGEST) < power:
            return None
        low, high = 1e-4, LARGEST
        if self.detection_rate(low) >= power:
            return low
        for _ in range(30):
            mid = math.sqrt(low * high)
            low, high = (low, mid) if self.detection_rate(mid) >= power else (mid, high)
        return high

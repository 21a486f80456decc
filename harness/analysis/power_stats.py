"""The statistics of `bench power` (docs/POWER.md): synthetic runs made of whole real blocks,
judged by the harness's own interval and verdict (block_model.judge, the computation of
stats.paired_change), every rate with an interval. Pure functions.

The pool is the real blocks with no change in them: each A B B A / B A A B block's four
servers (log values) in their positions, so a synthetic run keeps what a block shares, the
drift within it and any effect of a server's position. A synthetic run of n blocks draws n
blocks from the pool with replacement and gives them the schedule's letters (with no change
the two arms are exchangeable); a slowdown is added to arm B's servers.

Each rate is quoted with an interval over the pool and over the draws: the pool is resampled
(whole blocks, with replacement) BOOTSTRAPS times, each resample judged on PER_BOOTSTRAP
synthetic runs, and the interval is the central LEVEL of the resamples' rates (a percentile
bootstrap, widened for a small pool, `interval`); it holds both how few blocks the pool has
and the binomial error of the draws. The rate itself is over `draws` runs of the pool as it is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.block_model import Design, judge, schedule
from harness.analysis.stats import usable
from harness.analysis.verdict import FASTER, SLOWER, Rule

POWER = 0.8  # a slowdown is "detectable" when this share of runs call it slower
PLANTED = 0.10  # the slowdown whose detection rate and coverage are quoted (+10% time)
MIN_POOL = 2  # whole blocks needed to resample; fewer: no rates
FEW_BLOCKS = 8  # a pool of fewer blocks gives intervals that hold the truth too rarely
LARGEST = 10.0  # slowdowns searched up to +1000% time
BLOCK_SIZE = 4  # bench power runs A B B A / B A A B blocks
BOOTSTRAPS = 200  # resamples of the pool behind each interval
PER_BOOTSTRAP = 100  # synthetic runs judged per resample
LEVEL = 0.95  # the rates' intervals
STEPS = 18  # bisection steps of the smallest slowdown found (log scale, 1e-4 .. LARGEST)


@dataclass(frozen=True)
class Rate:
    """A share of synthetic runs (or a slowdown) and its interval over the pool and the draws;
    None where none was found (a slowdown beyond LARGEST)."""

    value: float | None
    low: float | None
    high: float | None


def cv(values: Sequence[float] | pd.Series) -> float | None:
    """Coefficient of variation: sample standard deviation over mean (None for < 2 values)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) < 2 or x.mean() == 0:
        return None
    return float(x.std(ddof=1) / x.mean())


def null_blocks(values: pd.DataFrame) -> np.ndarray:
    """[blocks, 4] one run's complete blocks (columns letter, block, slot, value; both arms'
    four servers usable) as log values in position order, with no change in them: arm B's
    effect fitted over the run is taken out, and each block's arm contrast scaled by
    sqrt(K / (K - 1)) for the K blocks it was fitted on, so that a block's noise keeps its
    variance. A planted run's blocks; an A/A run's have no effect to take out (`aa_blocks`).
    Empty with fewer than two complete blocks (nothing to fit the effect on apart from them)."""
    logs, is_b = _complete(values)
    if len(logs) < 2:
        return np.empty((0, BLOCK_SIZE))
    contrast = _contrast(logs, is_b)
    wanted = (contrast - contrast.mean()) * math.sqrt(len(logs) / (len(logs) - 1))
    return logs + (wanted - contrast)[:, None] * is_b


def aa_blocks(values: pd.DataFrame) -> np.ndarray:
    """[blocks, 4] an A/A run's complete blocks as log values in position order, as run."""
    return _complete(values)[0]


def _complete(values: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    rows = usable(values, "A", "B").sort_values("slot")
    whole = rows.groupby("block")["slot"].transform("size") == BLOCK_SIZE
    rows = rows[whole]
    count = len(rows) // BLOCK_SIZE
    logs = np.log(rows["value"].to_numpy(float)).reshape(count, BLOCK_SIZE)
    is_b = (rows["letter"] == "B").to_numpy().reshape(count, BLOCK_SIZE)
    return logs, is_b


def _contrast(logs: np.ndarray, is_b: np.ndarray) -> np.ndarray:
    """Each block's mean of B's servers less the mean of A's."""
    return (logs * is_b).sum(1) / is_b.sum(1) - (logs * ~is_b).sum(1) / (~is_b).sum(1)


def synthetic(pool: np.ndarray, blocks: int, shape: tuple[int, ...], rng) -> np.ndarray:
    """[*shape, 4 * blocks] log values of synthetic runs: `blocks` whole blocks of `pool`
    ([m, 4]) drawn with replacement, in schedule order."""
    picks = rng.integers(len(pool), size=(*shape, blocks))
    return pool[picks].reshape(*shape, blocks * BLOCK_SIZE)


def resampled(pool: np.ndarray, blocks: int, boots: int, draws: int, rng) -> np.ndarray:
    """[boots, draws, 4 * blocks]: for each of `boots` resamples of the pool (its m blocks
    drawn with replacement), `draws` synthetic runs of `blocks` blocks from that resample.

    A resample's noise is reflected about the pool's: its servers' deviations from their
    block's mean are scaled by the pool's within-block variance over the resample's, so a
    resample that came out quieter than the pool stands for a machine noisier than the pool
    by as much (a basic bootstrap of the noise's scale). A percentile bootstrap of a variance
    from few blocks sits on the quiet side of the truth: intervals of the detection rate from
    6 blocks held the true rate 81% of the time, reflected 92% (docs/POWER.md)."""
    chosen = rng.integers(len(pool), size=(boots, len(pool)))
    centre = pool.mean(axis=1, keepdims=True)
    squares = ((pool - centre) ** 2).sum(axis=1)
    scale = squares.mean() / np.maximum(squares[chosen].mean(axis=1), 1e-300)
    picks = rng.integers(len(pool), size=(boots, draws * blocks))
    which = np.take_along_axis(chosen, picks, axis=1).reshape(boots, draws, blocks)
    values = centre[which] + (pool - centre)[which] * scale[:, None, None, None]
    return values.reshape(boots, draws, blocks * BLOCK_SIZE)


def interval(value: float | None, replicates: np.ndarray, pool: int, share: bool) -> Rate:
    """`value` with the central LEVEL of its bootstrap `replicates`, widened about the value
    by sqrt(m / (m - 1)) for a pool of m blocks (a resample of m blocks varies less than the
    pool does: the bootstrap's variance is (m - 1) / m of the truth's); a `share` is kept in
    0..1, a slowdown above 0."""
    finite = replicates[np.isfinite(replicates)]
    if value is None or not len(finite):
        return Rate(value, None, None)
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(replicates, [tail, 1 - tail])
    widen = math.sqrt(pool / (pool - 1)) if pool > 1 else 1.0
    low = max(float(value - (value - low) * widen), 0.0) if np.isfinite(low) else None
    high = float(value + (high - value) * widen) if np.isfinite(high) else None
    return Rate(value, low, min(high, 1.0) if share and high is not None else high)


@dataclass(frozen=True)
class Experiments:
    """Synthetic runs laid out as `blocks` ABBA / BAAB blocks from `pool`, for a figure of
    this direction: `runs` ([draws, n]) from the pool itself, `boots` ([boots, draws, n])
    from its resamples. Every rate comes back as a Rate."""

    pool: np.ndarray
    runs: np.ndarray
    boots: np.ndarray
    design: Design
    higher_is_better: bool
    rule: Rule = Rule()

    @classmethod
    def of(
        cls,
        pool: np.ndarray,
        blocks: int,
        higher_is_better: bool,
        draws: int,
        rng,
        boots: int = BOOTSTRAPS,
        per_boot: int = PER_BOOTSTRAP,
    ) -> Experiments:
        design = Design.of(schedule(blocks, abba=True), BLOCK_SIZE)
        runs = synthetic(pool, blocks, (draws,), rng)
        again = resampled(pool, blocks, boots, per_boot, rng)
        return cls(pool, runs, again, design, higher_is_better)

    def judged(self, noise: np.ndarray, slowdown) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """With B slowed by `slowdown` (+x time per unit of work: tok/s / (1 + x), ms * (1 + x);
        a scalar, or one per leading row of `noise`): each run's verdict and whether its
        interval holds the truth."""
        sign = -1.0 if self.higher_is_better else 1.0
        truth = np.log1p(np.asarray(slowdown, dtype=float)) * sign
        truth = truth.reshape(truth.shape + (1,) * (noise.ndim - truth.ndim))
        logs = noise + truth * self.design.is_b
        _, low, high, verdicts = judge(logs, self.design, self.higher_is_better, self.rule)
        truth = truth[..., 0]
        return verdicts, (low <= truth) & (truth <= high), truth

    def _rate(self, share) -> Rate:
        value = float(share(self.runs).mean())
        replicates = share(self.boots).mean(axis=-1)
        return interval(value, replicates, len(self.pool), share=True)

    def false_positive_rate(self) -> Rate:
        """Share of no-change runs called "faster" or "slower"."""
        return self._rate(lambda noise: np.isin(self.judged(noise, 0.0)[0], [FASTER, SLOWER]))

    def detection_rate(self, slowdown: float) -> Rate:
        """Share of runs with B slowed by `slowdown` called "slower"."""
        return self._rate(lambda noise: self.judged(noise, slowdown)[0] == SLOWER)

    def coverage(self, slowdown: float) -> Rate:
        """Share of runs with B slowed by `slowdown` whose interval holds the truth."""
        return self._rate(lambda noise: self.judged(noise, slowdown)[1])

    def min_detectable_slowdown(self, power: float = POWER) -> Rate:
        """The smallest slowdown called "slower" in `power` of the runs (bisection on a log
        scale, the same draws at every step), for the pool and for each resample; None where
        even +LARGEST is not."""
        value = self._smallest(self.runs[None], power)[0]
        replicates = self._smallest(self.boots, power)
        found = None if math.isinf(value) else float(value)
        return interval(found, replicates, len(self.pool), share=False)

    def _smallest(self, noise: np.ndarray, power: float) -> np.ndarray:
        """[rows] the smallest slowdown found in `power` of each row's runs (inf: none)."""
        rows = noise.shape[0]

        def found(slowdown: np.ndarray) -> np.ndarray:
            return (self.judged(noise, slowdown)[0] == SLOWER).mean(axis=-1) >= power

        low, high = np.full(rows, 1e-4), np.full(rows, LARGEST)
        reachable, easy = found(high), found(low)
        for _ in range(STEPS):
            mid = np.sqrt(low * high)
            ok = found(mid)
            low, high = np.where(ok, low, mid), np.where(ok, mid, high)
        return np.where(easy, 1e-4, np.where(reachable, high, np.inf))

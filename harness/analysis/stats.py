"""The paired comparison of two arms (docs/STATISTICS.md).

The unit of replication is the server (one slot of the schedule), never the request. Within
each block the arms' servers are averaged and compared as a log ratio, so drift between
blocks cancels; the per-block log ratios give a t-interval for B/A with n_blocks - 1
degrees of freedom. Pure functions; nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd

FASTER, SLOWER, NO_CHANGE, NOT_ENOUGH = "faster", "slower", "no change", "not enough data"
BLOCKS, WITHIN_BLOCK, NONE = "blocks", "within-block (weaker)", "none"
MAX_BLOCKS = 1000


@dataclass(frozen=True)
class Rule:
    """How a confidence interval becomes a verdict (docs/STATISTICS.md, "Verdict")."""

    level: float = 0.95  # two-sided confidence level
    min_effect: float = 0.01  # a change whose whole CI lies within +-1% is "no change"
    resolution: float = 0.05  # a CI covering 1 must be at most +-5% wide to say "no change"


@dataclass(frozen=True)
class Change:
    """B relative to A for one figure: ratio B/A with its confidence interval."""

    ratio: float | None  # point estimate of B/A (geometric mean of the per-block ratios)
    low: float | None  # CI bounds for B/A
    high: float | None
    blocks: int  # blocks with both arms present
    method: str  # BLOCKS, WITHIN_BLOCK or NONE
    df: int  # degrees of freedom of the t-interval
    verdict: str
    blocks_needed: int | None = None  # total blocks suggested when the CI is too wide


def t_quantile(level: float, df: int) -> float:
    """t such that P(|T| < t) = level for Student's t with integer `df` (bisection)."""
    low, high = 0.0, 1.0
    while _t_central_mass(high, df) < level:
        high *= 2.0
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if _t_central_mass(mid, df) < level else (low, mid)
    return (low + high) / 2


def _t_central_mass(t: float, df: int) -> float:
    """P(|T| < t), exact for integer df (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    power, term, total = (1, math.cos(theta), 0.0) if df % 2 else (0, 1.0, 0.0)
    while power <= df - 2:
        total += term
        term *= (power + 1) / (power + 2) * c2
        power += 2
    if df % 2:
        return 2 / math.pi * (theta + math.sin(theta) * total)
    return math.sin(theta) * total


def block_log_ratios(values: pd.DataFrame, a: str, b: str) -> pd.Series:
    """log(mean B / mean A) per block, over blocks holding positive values of both arms.

    `values` has columns letter, block, value: one row per server."""
    usable = values[values["letter"].isin([a, b]) & (values["value"] > 0)]
    means = usable.groupby(["block", "letter"])["value"].mean().unstack("letter")
    if a not in means or b not in means:
        return pd.Series(dtype=float)
    return np.log(means[b] / means[a]).dropna()


def paired_change(
    values: pd.DataFrame, a: str, b: str, higher_is_better: bool, rule: Rule = Rule()
) -> Change:
    """The change of B against A from per-server values, with its verdict."""
    ratios = block_log_ratios(values, a, b)
    if len(ratios) >= 2:
        spread = float(ratios.std(ddof=1))
        return _change(float(ratios.mean()), spread, len(ratios), BLOCKS, higher_is_better, rule)
    if len(ratios) == 1:
        return _within_block(values, a, b, int(ratios.index[0]), higher_is_better, rule)
    return Change(None, None, None, 0, NONE, 0, NOT_ENOUGH)


def _within_block(
    values: pd.DataFrame, a: str, b: str, block: int, higher_is_better: bool, rule: Rule
) -> Change:
    """One block: the servers of each arm are the replicates (pooled-variance t). Weaker: it
    cannot see drift between slots, and ABBA gives it only 2 degrees of freedom."""
    rows = values[(values["block"] == block) & (values["value"] > 0)]
    logs_a = np.log(rows.loc[rows["letter"] == a, "value"].to_numpy(float))
    logs_b = np.log(rows.loc[rows["letter"] == b, "value"].to_numpy(float))
    df = len(logs_a) + len(logs_b) - 2
    if df < 1:
        return Change(None, None, None, 1, NONE, 0, NOT_ENOUGH, _blocks_needed(None, rule))
    squares = ((logs_a - logs_a.mean()) ** 2).sum() + ((logs_b - logs_b.mean()) ** 2).sum()
    # spread of one block's log ratio, so that se = spread / sqrt(1 block)
    spread = math.sqrt(squares / df * (1 / len(logs_a) + 1 / len(logs_b)))
    mean = float(logs_b.mean() - logs_a.mean())
    return _change(mean, spread, 1, WITHIN_BLOCK, higher_is_better, rule, df=df)


def _change(
    mean: float,
    spread: float,
    blocks: int,
    method: str,
    higher_is_better: bool,
    rule: Rule,
    df: int | None = None,
) -> Change:
    df = blocks - 1 if df is None else df
    half = t_quantile(rule.level, df) * spread / math.sqrt(blocks)
    low, high = mean - half, mean + half
    verdict = decide(low, high, higher_is_better, rule)
    needed = _blocks_needed(spread, rule) if verdict == NOT_ENOUGH else None
    return Change(
        math.exp(mean), math.exp(low), math.exp(high), blocks, method, df, verdict, needed
    )


def decide(log_low: float, log_high: float, higher_is_better: bool, rule: Rule) -> str:
    """The verdict from a CI for log(B/A), in this order:
    1. the whole CI within +-log(1 + min_effect): "no change" (any change is negligible);
    2. the whole CI on the better side of 0: "faster"; on the worse side: "slower";
    3. the CI covers 0 and its half-width is at most log(1 + resolution): "no change";
    4. otherwise "not enough data"."""
    sign = 1.0 if higher_is_better else -1.0
    low, high = sorted((sign * log_low, sign * log_high))
    if max(abs(low), abs(high)) <= math.log1p(rule.min_effect):
        return NO_CHANGE
    if low > 0:
        return FASTER
    if high < 0:
        return SLOWER
    if (high - low) / 2 <= math.log1p(rule.resolution):
        return NO_CHANGE
    return NOT_ENOUGH


def _blocks_needed(spread: float | None, rule: Rule) -> int | None:
    """Fewest blocks whose t-interval half-width, at the observed spread of the per-block log
    ratio, is at most log(1 + resolution): then any outcome is a decisive verdict."""
    if spread is None or not math.isfinite(spread):
        return None
    target = math.log1p(rule.resolution)
    z = NormalDist().inv_cdf((1 + rule.level) / 2)  # t > z, so fewer blocks never suffice
    for blocks in range(max(2, math.ceil((z * spread / target) ** 2)), MAX_BLOCKS + 1):
        if t_quantile(rule.level, blocks - 1) * spread / math.sqrt(blocks) <= target:
            return blocks
    return MAX_BLOCKS

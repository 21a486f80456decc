"""The verdict words, and the rule that turns an interval into one (docs/STATISTICS.md,
"Verdict").

A `Change` is B/A for one figure with its interval; `decide` reads its verdict, significance
first; a `Rule` holds the confidence level, the margin of "no change" and the size of a
slowdown that fails a run. Pure functions; nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

FASTER, SLOWER, NO_CHANGE, NOT_ENOUGH = "faster", "slower", "no change", "not enough data"
NO_VERDICT = "no verdict"  # a descriptive change: nothing to replicate it against
VERDICTS = (FASTER, SLOWER, NO_CHANGE, NOT_ENOUGH, NO_VERDICT)
BLOCKS = "blocks"  # the block + arm model over two or more blocks
ONE_BLOCK = "one block (no verdict)"  # the same model on one block: its interval, no verdict
RUNS = "runs"  # recorded runs compared, each run one replicate
DESCRIPTIVE = "descriptive"  # one run a side: a change with no interval
NONE = "none"


# The equivalence margin: "no change" needs the whole interval inside +-MARGIN. It is set by
# what the harness resolves: an A/A run on the H200 (2 ABBA blocks, c=64) reads an interval
# of about +-0.5%, a quiet CPU's a few percent; 2% is what a change must stay under to be
# called none where the harness can tell (docs/STATISTICS.md, "Verdict").
MARGIN = 0.02
# The exit code trips when the headline is slower by at least FAIL_AT (its point estimate): a
# significant slowdown smaller than that is reported, and exits 0. 1%: below what one
# merge's noise in production usually means, above what a precise run calls significant
# by chance of a few servers' placement (docs/STATISTICS.md, "Exit code").
FAIL_AT = 0.01
# Each interval's two-sided confidence level (--confidence): an A/A run reads "faster" or
# "slower" on the headline at most 1 - LEVEL of the time.
LEVEL = 0.95


@dataclass(frozen=True)
class Rule:
    """How a confidence interval becomes a verdict (docs/STATISTICS.md, "Verdict")."""

    level: float = LEVEL  # two-sided confidence level of each interval
    margin: float = MARGIN  # "no change": the interval covers 0 and lies inside +-margin
    fail_at: float = FAIL_AT  # the headline slower by at least this fails the run (exit 1)
    looks: int = 1  # the analyses a run's error rate is split over (--blocks auto)
    look: int = 1  # which of them this is

    def family(self, size: int) -> Rule:
        """The rule for each of `size` figures judged together: Bonferroni, so that all of
        them hold their intervals at once with probability at least `level`."""
        return replace(self, level=1 - (1 - self.level) / max(size, 1))

    def sequential(self, looks: int, look: int) -> Rule:
        """The rule for analysis `look` (1-based) of up to `looks` of one growing run (--blocks
        auto adds blocks until the headline is decided): the error rate 1 - level split over
        the looks, half to the first and the other half evenly over the rest (a weighted
        Bonferroni split, so the chance of a false verdict at any look stays at most 1 -
        level; the first look, where a clear change is decided, keeps most of its power).
        `level` becomes this look's; `looks` and `look` record why."""
        alpha = 1 - self.level
        if looks <= 1:
            share = alpha
        elif look <= 1:
            share = alpha / 2
        else:
            share = alpha / 2 / (looks - 1)
        return replace(self, level=1 - share, looks=max(looks, 1), look=min(look, looks))


@dataclass(frozen=True)
class Change:
    """B relative to A for one figure: ratio B/A with its confidence interval."""

    ratio: float | None  # point estimate of B/A
    low: float | None  # CI bounds for B/A (None without an interval)
    high: float | None
    blocks: int  # blocks with both arms present (runs, between recorded runs)
    method: str  # BLOCKS, ONE_BLOCK, RUNS, DESCRIPTIVE or NONE
    df: int  # degrees of freedom of the t-interval
    verdict: str
    blocks_needed: int | None = None  # blocks in all for a decisive verdict at this noise
    level: float = 0.95  # the confidence level of this interval


def level_text(level: float) -> str:
    """A confidence level (or an error rate) as a percentage with the digits it needs: 95%,
    97.5%, 99.9%, 0.1%."""
    for digits in range(4):
        if abs(round(level * 100, digits) - level * 100) < 1e-9:
            return f"{level * 100:.{digits}f}%"
    return f"{level:.4%}"


def worse_by(change: Change, higher_is_better: bool) -> float | None:
    """How much worse B is than A by the change's point estimate, as a fraction (0.03: 3%
    slower; negative where B is better); None without an estimate."""
    if change.ratio is None or not math.isfinite(change.ratio):
        return None
    return 1 - change.ratio if higher_is_better else change.ratio - 1


def decide(log_low: float, log_high: float, higher_is_better: bool, rule: Rule) -> str:
    """The verdict from a CI for log(B/A), significance first:
    1. the whole CI on the better side of 0: "faster"; on the worse side: "slower", however
       small the change (its size is shown beside it; `Rule.fail_at` says which size fails);
    2. the CI covers 0 and lies within +-log(1 + margin): "no change" (any change is smaller
       than the margin);
    3. otherwise (the CI covers 0 and reaches past the margin): "not enough data"."""
    return str(decide_many(np.array([log_low]), np.array([log_high]), higher_is_better, rule)[0])


def decide_many(
    log_low: np.ndarray, log_high: np.ndarray, higher_is_better: bool, rule: Rule
) -> np.ndarray:
    """`decide` for arrays of intervals (simulations judge thousands at once)."""
    sign = 1.0 if higher_is_better else -1.0
    low = np.minimum(sign * log_low, sign * log_high)
    high = np.maximum(sign * log_low, sign * log_high)
    inside = np.maximum(np.abs(low), np.abs(high)) <= math.log1p(rule.margin)
    return np.select(
        [low > 0, high < 0, inside], [FASTER, SLOWER, NO_CHANGE], default=NOT_ENOUGH
    ).astype(object)

"""The block + arm model of one run (docs/STATISTICS.md).

The schedule lays the arms' letters out in blocks; a `Design` says where each server sits;
`fit` takes log values on a block effect and an arm effect, so drift between blocks cancels;
`judge` gives the interval and verdict of thousands of synthetic runs at once; and
`_blocks_needed` says how many blocks would likely decide a change. Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import NOT_ENOUGH, Rule, decide_many

MAX_BLOCKS = 1000
# The fewest blocks (with both arms) that give a verdict. In one block each arm holds fixed
# positions (A B B A: A the first and the last server), so whatever a server's position does
# to it (slower first and last servers, say) cannot be told from a change of code; the next
# block, in turned order, cancels it (docs/STATISTICS.md, "One block").
MIN_BLOCKS = 2


def schedule(blocks: int, abba: bool) -> list[str]:
    """The letters of `blocks` blocks, in order. Blocks alternate: A B B A then B A A B with
    `abba`, A B then B A without. Within an A B B A block a steady drift falls on both arms
    alike; alternating the order cancels, over each pair of blocks, what one order cannot:
    a drift within an A B block, and any effect of a server's position in its block."""
    orders = (["A", "B", "B", "A"], ["B", "A", "A", "B"]) if abba else (["A", "B"], ["B", "A"])
    return [letter for block in range(blocks) for letter in orders[block % 2]]


@dataclass(frozen=True)
class Design:
    """Where each server sits: its block and whether it is arm B's. The same for every draw of
    a simulation, so one design serves thousands of synthetic runs."""

    blocks: np.ndarray  # int [n]
    is_b: np.ndarray  # bool [n]

    @classmethod
    def of(cls, letters: list[str], block_size: int) -> Design:
        """The design of a schedule: slot i is in block i // block_size."""
        blocks = np.arange(len(letters)) // block_size
        return cls(blocks, np.array([letter == "B" for letter in letters]))

    @property
    def block_count(self) -> int:
        return len(np.unique(self.blocks))

    @property
    def decides(self) -> bool:
        """Whether this layout may give a verdict: MIN_BLOCKS blocks or more."""
        return self.block_count >= MIN_BLOCKS

    @property
    def df(self) -> int:
        """Residual degrees of freedom of the block + arm model."""
        return len(self.blocks) - self.block_count - 1

    def centred(self) -> np.ndarray:
        """The matrix that removes each block's mean (within-block deviations)."""
        same = self.blocks[:, None] == self.blocks[None, :]
        return np.eye(len(self.blocks)) - same / same.sum(axis=1, keepdims=True)

    @property
    def information(self) -> float:
        """sum of the arm indicator's within-block squares: var(estimate) = sigma^2 / this."""
        x = self.centred() @ self.is_b.astype(float)
        return float(x @ x)


def fit(logs: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of log value on a block effect and an arm effect. `logs` is [n] or
    [draws, n]; returns the arm effect log(B/A) and its standard error (each [] or [draws]).

    Within-block deviations remove the block effects (Frisch-Waugh), so the arm effect is the
    regression of deviations on deviations, and the residual variance has `design.df` degrees
    of freedom."""
    effect, left = _solve(logs, design)
    variance = (left**2).sum(axis=-1) / design.df
    return effect, np.sqrt(variance / design.information)


def residuals(logs: np.ndarray, design: Design) -> np.ndarray:
    """What the block + arm model leaves of each server's log value, scaled by
    sqrt(n / df) so that their mean square estimates a server's noise variance."""
    _, left = _solve(logs, design)
    return left * math.sqrt(len(design.blocks) / design.df)


def _solve(logs: np.ndarray, design: Design) -> tuple[np.ndarray, np.ndarray]:
    centre = design.centred()
    x = centre @ design.is_b.astype(float)
    y = np.asarray(logs, dtype=float) @ centre.T
    effect = y @ x / float(x @ x)
    return effect, y - np.multiply.outer(effect, x)


def judge(
    logs: np.ndarray, design: Design, higher_is_better: bool, rule: Rule
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Interval and verdict of the block + arm model for each row of `logs` ([draws, n] log
    values laid out as `design`): (effect, low, high, verdict), the effect and bounds in log
    units. What `paired_change` computes, for thousands of synthetic runs at once: below
    MIN_BLOCKS blocks every verdict is "not enough data"."""
    effect, se = fit(logs, design)
    half = t_quantile(rule.level, design.df) * se
    low, high = effect - half, effect + half
    if not design.decides:
        return effect, low, high, np.full(np.shape(low), NOT_ENOUGH, dtype=object)
    return effect, low, high, decide_many(low, high, higher_is_better, rule)


def _blocks_needed(
    spread: float | None, design: Design, rule: Rule, effect: float | None = None
) -> int | None:
    """Fewest blocks (of this run's layout, MIN_BLOCKS at least) that would likely decide a
    change of size `effect` (log units; the run's own estimate) at a server's residual spread
    `spread`: blocks whose interval half-width h is at most max(effect, margin - effect), so
    that an interval around the estimate either excludes 0 (h < effect) or lies inside the
    margin (effect + h <= margin). Without an effect, the worst case: h at most half the
    margin, where every outcome is decisive."""
    if spread is None or not math.isfinite(spread) or not len(design.blocks):
        return None
    blocks = design.block_count
    per_block_info = design.information / blocks if blocks else 0.0
    per_block_servers = len(design.blocks) / blocks if blocks else 0.0
    if per_block_info <= 0:
        return None
    edge = math.log1p(rule.margin)
    target = edge / 2
    if effect is not None and math.isfinite(effect):
        target = max(effect, edge - effect)
    if target <= 0:
        return None
    z = NormalDist().inv_cdf((1 + rule.level) / 2)  # t > z: fewer blocks never suffice
    fewest = max(MIN_BLOCKS, math.floor((z * spread / target) ** 2 / per_block_info))
    for count in range(fewest, MAX_BLOCKS + 1):
        df = round(count * per_block_servers) - count - 1
        if df < 1:
            continue
        if t_quantile(rule.level, df) * spread / math.sqrt(count * per_block_info) <= target:
            return count
    return MAX_BLOCKS

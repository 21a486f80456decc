"""The change of arm B against arm A, its interval and its verdict (docs/STATISTICS.md).

Within one run the unit of replication is the server (one slot of the schedule), never the
request: every server's value enters a block + arm model on log values, so drift between
blocks cancels and the servers within a block all count (df = servers - blocks - 1). A verdict
needs MIN_BLOCKS blocks: one block gives its change and interval, never a verdict. Between
recorded runs the unit is the run (`run_change`). Pure functions; nothing here prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from statistics import NormalDist

import numpy as np
import pandas as pd

FASTER, SLOWER, NO_CHANGE, NOT_ENOUGH = "faster", "slower", "no change", "not enough data"
NO_VERDICT = "no verdict"  # a descriptive change: nothing to replicate it against
VERDICTS = (FASTER, SLOWER, NO_CHANGE, NOT_ENOUGH, NO_VERDICT)
BLOCKS = "blocks"  # the block + arm model over two or more blocks
ONE_BLOCK = "one block (no verdict)"  # the same model on one block: its interval, no verdict
RUNS = "runs"  # recorded runs compared, each run one replicate
DESCRIPTIVE = "descriptive"  # one run a side: a change with no interval
NONE = "none"
MAX_BLOCKS = 1000
# The fewest blocks (with both arms) that give a verdict. In one block each arm holds fixed
# positions (A B B A: A the first and the last server), so whatever a server's position does
# to it (slower first and last servers, say) cannot be told from a change of code; the next
# block, in turned order, cancels it (docs/STATISTICS.md, "One block").
MIN_BLOCKS = 2
# What a comparison's replicates are: a run's servers in blocks, or recorded runs.
IN_BLOCKS, BETWEEN_RUNS = "servers in blocks", "runs"


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


@dataclass(frozen=True)
class Rule:
    """How a confidence interval becomes a verdict (docs/STATISTICS.md, "Verdict")."""

    level: float = 0.95  # two-sided confidence level of each interval
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


def usable(values: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """The servers that enter the model: finite positive values of either arm, in blocks that
    hold both arms. `values` has columns letter, block, value: one row per server. (A server
    whose headline is not finite and positive has failed: compare.py names it in a doubt and
    leaves it out of every figure before this.)"""
    rows = values[values["letter"].isin([a, b]) & valid(values["value"])]
    both = rows.groupby("block")["letter"].transform("nunique") == 2
    return rows[both]


def valid(values: pd.Series) -> pd.Series:
    """Which values a ratio can be taken of: finite and positive (NaN, inf, 0 and negative are
    not)."""
    numbers = pd.to_numeric(values, errors="coerce").astype(float)
    return pd.Series(np.isfinite(numbers) & (numbers > 0), index=values.index)


def worse_by(change: Change, higher_is_better: bool) -> float | None:
    """How much worse B is than A by the change's point estimate, as a fraction (0.03: 3%
    slower; negative where B is better); None without an estimate."""
    if change.ratio is None or not math.isfinite(change.ratio):
        return None
    return 1 - change.ratio if higher_is_better else change.ratio - 1


def paired_change(
    values: pd.DataFrame,
    a: str,
    b: str,
    higher_is_better: bool,
    rule: Rule = Rule(),
    plan: bool = True,
) -> Change:
    """The change of B against A within one run, from per-server values, with its verdict.
    One block gets its change and interval but "not enough data" (MIN_BLOCKS). With `plan`, a
    "not enough data" change says how many blocks would decide it."""
    rows = usable(values, a, b)
    design = Design(rows["block"].to_numpy(), (rows["letter"] == b).to_numpy())
    blocks = design.block_count
    if not blocks or design.df < 1:
        return Change(None, None, None, blocks, NONE, 0, NOT_ENOUGH, None, rule.level)
    effect, se = fit(np.log(rows["value"].to_numpy(float)), design)
    method = BLOCKS if design.decides else ONE_BLOCK
    change = _change(float(effect), float(se), design.df, blocks, method, higher_is_better, rule)
    if not design.decides:
        change = replace(change, verdict=NOT_ENOUGH)
    if change.verdict != NOT_ENOUGH or not plan:
        return change
    spread = float(se) * math.sqrt(design.information)  # one server's residual sd
    needed = _blocks_needed(spread, design, rule, abs(float(effect)))
    return replace(change, blocks_needed=needed)


def run_change(
    values: pd.DataFrame,
    a: str,
    b: str,
    higher_is_better: bool,
    rule: Rule = Rule(),
    plan: bool = False,
) -> Change:
    """The change of B against A between recorded runs: `block` names the run. Each run is
    one replicate (the mean of its servers' log values); with two or more runs a side, a
    two-sample t-interval on n_A + n_B - 2 degrees of freedom; with one run a side, the
    change alone, with no interval and no verdict (a run-to-run difference cannot be told
    from a change of code without replicates of the runs). `plan` is paired_change's; runs
    are not planned in blocks."""
    rows = values[values["letter"].isin([a, b]) & valid(values["value"])]
    runs = np.log(rows["value"].astype(float)).groupby([rows["letter"], rows["block"]]).mean()
    logs_a = runs.get(a, pd.Series(dtype=float)).to_numpy(float)
    logs_b = runs.get(b, pd.Series(dtype=float)).to_numpy(float)
    if not len(logs_a) or not len(logs_b):
        return Change(None, None, None, 0, NONE, 0, NOT_ENOUGH, level=rule.level)
    count = len(logs_a) + len(logs_b)
    if min(len(logs_a), len(logs_b)) < 2:
        ratio = math.exp(float(logs_b.mean() - logs_a.mean()))
        return Change(ratio, None, None, count, DESCRIPTIVE, 0, NO_VERDICT, level=rule.level)
    effect, se = two_sample(logs_a, logs_b)
    return _change(float(effect), float(se), count - 2, count, RUNS, higher_is_better, rule)


def two_sample(logs_a: np.ndarray, logs_b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean of B less mean of A and its pooled-variance standard error, along the last axis
    ([runs] or [draws, runs]); n_A + n_B - 2 degrees of freedom."""
    n_a, n_b = logs_a.shape[-1], logs_b.shape[-1]
    mean_a, mean_b = logs_a.mean(axis=-1), logs_b.mean(axis=-1)
    squares = ((logs_a - mean_a[..., None]) ** 2).sum(axis=-1)
    squares = squares + ((logs_b - mean_b[..., None]) ** 2).sum(axis=-1)
    se = np.sqrt(squares / (n_a + n_b - 2) * (1 / n_a + 1 / n_b))
    return mean_b - mean_a, se


def _change(
    effect: float,
    se: float,
    df: int,
    blocks: int,
    method: str,
    higher_is_better: bool,
    rule: Rule,
) -> Change:
    half = t_quantile(rule.level, df) * se
    low, high = effect - half, effect + half
    verdict = decide(low, high, higher_is_better, rule)
    exp = math.exp
    return Change(exp(effect), exp(low), exp(high), blocks, method, df, verdict, None, rule.level)


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

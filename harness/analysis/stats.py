"""The change of arm B against arm A, its interval and its verdict (docs/STATISTICS.md).

Within one run the unit of replication is the server (one slot of the schedule), never the
request: every server's value enters a block + arm model on log values, so drift between
blocks cancels and the servers within a block all count (df = servers - blocks - 1). A verdict
needs MIN_BLOCKS blocks: one block gives its change and interval, never a verdict. Between
recorded runs the unit is the run (`run_change`). Pure functions; nothing here prints. The
verdict's words and rule are verdict.py's; the block + arm model is block_model.py's.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd

from harness.analysis.block_model import Design, _blocks_needed, fit
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import (
    BLOCKS,
    DESCRIPTIVE,
    NO_VERDICT,
    NONE,
    NOT_ENOUGH,
    ONE_BLOCK,
    RUNS,
    Change,
    Rule,
    decide,
)

# What a comparison's replicates are: a run's servers in blocks, or recorded runs.
IN_BLOCKS, BETWEEN_RUNS = "servers in blocks", "runs"


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
    return Change(
        _ratio(effect), _ratio(low), _ratio(high), blocks, method, df, verdict, None, rule.level
    )


# A log-ratio bound past this reads as a ratio of e^700 (1e304) or its inverse: finite, so
# summary.json stays JSON and the tables print ">+999%". A wide t (few degrees of freedom at a
# high --confidence: t = 637 at 1 df and 99.9%) times a CPU run's spread reaches e^709, where
# math.exp overflows.
LOG_BOUND = 700.0


def _ratio(log_ratio: float) -> float:
    return math.exp(min(max(log_ratio, -LOG_BOUND), LOG_BOUND))

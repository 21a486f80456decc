"""The block + arm model, the verdict and the run-level comparison: known answers on synthetic
per-server values (docs/STATISTICS.md). Error rates over thousands of synthetic runs are in
test_verdict_simulation.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.block_model import MIN_BLOCKS, Design, fit, schedule
from harness.analysis.stats import paired_change, run_change
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import (
    BLOCKS,
    DESCRIPTIVE,
    FASTER,
    NO_CHANGE,
    NO_VERDICT,
    NOT_ENOUGH,
    ONE_BLOCK,
    RUNS,
    SLOWER,
    Rule,
    decide,
)
from harness.show.format import change_text

ABBA = "ABBA"


def servers(
    blocks: int, ratio: float, noise: float, seed: int, base: float = 20000.0, order: str = ABBA
) -> pd.DataFrame:
    """Per-server values: arm B is `ratio` times arm A, each server with lognormal noise
    `noise`, and each block with its own drift (which the block effects must cancel)."""
    rng = np.random.default_rng(seed)
    rows = []
    for block in range(blocks):
        drift = rng.normal(0.0, 0.05)
        for slot, letter in enumerate(order):
            level = base * (ratio if letter == "B" else 1.0) * math.exp(drift)
            value = level * math.exp(rng.normal(0.0, noise))
            rows.append({"letter": letter, "block": block, "slot": slot, "value": value})
    return pd.DataFrame(rows)


@pytest.mark.parametrize(
    ("level", "df", "expected"),
    [(0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 3, 3.1824), (0.95, 10, 2.2281),
     (0.95, 30, 2.0423), (0.90, 5, 2.0150), (0.99, 4, 4.6041)],
)  # fmt: skip
def test_t_quantile_matches_published_tables(level, df, expected):
    assert t_quantile(level, df) == pytest.approx(expected, abs=1e-4)


def ols(values: pd.DataFrame) -> tuple[float, float, int]:
    """The block + arm model by brute force: a dummy per block and one for arm B, solved by
    numpy's least squares; (effect, standard error, residual df)."""
    blocks = sorted(values["block"].unique())
    x = np.column_stack(
        [(values["block"] == b).to_numpy(float) for b in blocks]
        + [(values["letter"] == "B").to_numpy(float)]
    )
    y = np.log(values["value"].to_numpy(float))
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    df = len(y) - x.shape[1]
    sigma2 = ((y - x @ coef) ** 2).sum() / df
    cov = sigma2 * np.linalg.inv(x.T @ x)
    return float(coef[-1]), float(math.sqrt(cov[-1, -1])), df


@pytest.mark.parametrize("blocks", [1, 2, 3, 6])
def test_the_model_is_least_squares_on_block_and_arm(blocks):
    values = servers(blocks, 0.93, 0.03, seed=blocks)
    effect, se, df = ols(values)
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.df == df == 4 * blocks - blocks - 1
    assert math.log(change.ratio) == pytest.approx(effect)
    half = t_quantile(0.95, df) * se
    assert math.log(change.low) == pytest.approx(effect - half)
    assert math.log(change.high) == pytest.approx(effect + half)


def test_every_server_counts_two_blocks_have_more_degrees_of_freedom_than_one():
    """Defect 4: the block-level interval gave two blocks 1 degree of freedom, one block 2."""
    one = paired_change(servers(1, 1.0, 0.03, seed=1), "A", "B", True)
    two = paired_change(servers(2, 1.0, 0.03, seed=1), "A", "B", True)
    assert (one.df, two.df) == (2, 5)
    assert (one.method, two.method) == (ONE_BLOCK, BLOCKS)


def test_balanced_blocks_estimate_the_mean_of_the_blocks_log_ratios():
    values = servers(3, 0.9, 0.02, seed=4)
    logs = values.assign(log=np.log(values["value"]))
    means = logs.groupby(["block", "letter"])["log"].mean().unstack("letter")
    change = paired_change(values, "A", "B", True)
    assert math.log(change.ratio) == pytest.approx((means["B"] - means["A"]).mean())


def test_a_failed_server_leaves_an_unbalanced_block_still_fitted():
    values = servers(3, 0.9, 0.02, seed=8)
    values.loc[values.index[5], "value"] = float("nan")  # block 1's first B failed
    effect, se, df = ols(values.dropna())
    change = paired_change(values, "A", "B", True)
    assert change.df == df == 11 - 3 - 1 and change.blocks == 3
    assert math.log(change.ratio) == pytest.approx(effect)


def test_ten_percent_less_throughput_is_slower_and_ci_covers_truth():
    change = paired_change(servers(4, 0.90, 0.01, seed=7), "A", "B", higher_is_better=True)
    assert change.verdict == SLOWER
    assert change.method == BLOCKS and change.blocks == 4 and change.df == 11
    assert change.low <= 0.90 <= change.high


def test_ten_percent_more_latency_is_slower_and_less_is_faster():
    worse = paired_change(servers(4, 1.10, 0.01, seed=3), "A", "B", higher_is_better=False)
    better = paired_change(servers(4, 1 / 1.10, 0.01, seed=3), "A", "B", higher_is_better=False)
    assert (worse.verdict, better.verdict) == (SLOWER, FASTER)


def test_block_effects_cancel_drift_between_blocks():
    # offsets of 5% between blocks, 0.2% server noise: unpaired, they would blur the change
    change = paired_change(servers(4, 1.08, 0.002, seed=11), "A", "B", higher_is_better=True)
    assert change.verdict == FASTER
    assert change.ratio == pytest.approx(1.08, abs=0.003)
    assert change.high / change.low < 1.01


def test_one_abba_block_is_the_two_sample_interval_with_no_verdict():
    """INVARIANTS 50: one block's change and interval are given, never a verdict, however
    clear (a position effect would look the same), with the blocks that would decide it."""
    values = servers(1, 0.90, 0.005, seed=5)
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.method == ONE_BLOCK and change.blocks == 1 and change.df == 2
    logs = np.log(values["value"].to_numpy())
    a, b = logs[[0, 3]], logs[[1, 2]]
    pooled_sd = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    half = 4.302653 * pooled_sd * math.sqrt(1 / 2 + 1 / 2)
    assert math.log(change.ratio) == pytest.approx(b.mean() - a.mean())
    assert math.log(change.high / change.ratio) == pytest.approx(half, rel=1e-5)
    assert change.high < 0.95  # the interval alone would say "slower"
    assert change.verdict == NOT_ENOUGH and change.blocks_needed == MIN_BLOCKS
    two = paired_change(servers(2, 0.90, 0.005, seed=5), "A", "B", higher_is_better=True)
    assert (two.method, two.verdict) == (BLOCKS, SLOWER)


def test_one_ab_block_is_not_enough_data():
    values = servers(1, 0.90, 0.01, seed=5, order="AB")
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.verdict == NOT_ENOUGH and change.ratio is None and change.df == 0


def test_ab_blocks_give_blocks_less_one_degrees_of_freedom():
    change = paired_change(servers(6, 0.90, 0.01, seed=2, order="AB"), "A", "B", True)
    assert change.method == BLOCKS and change.blocks == 6 and change.df == 5
    assert change.verdict == SLOWER


def test_an_interval_past_a_floats_range_stays_finite_and_undecided():
    """Two A B blocks (1 df) at --confidence 0.999 (t = 637) on servers a factor of 5 apart:
    the log bounds pass +-709, where exp overflows (a tiny CPU run crashed with exit 3 there).
    The bounds stop at e^+-700, finite for JSON, and the tables print them as past the scale."""
    values = servers(2, 1.0, 0.0, seed=0, order="AB")
    values.loc[values.index[0], "value"] *= 5.0
    values.loc[values.index[3], "value"] *= 5.0  # block 0: B/A = 1/5, block 1: 5
    change = paired_change(values, "A", "B", True, Rule(level=0.999))
    assert change.df == 1 and change.verdict == NOT_ENOUGH
    assert 0 < change.low < 1e-300 and 1e300 < change.high < math.inf
    assert math.log(change.high) == pytest.approx(700.0)
    assert change_text(change).endswith("(<-99.9..>+999%)")


def test_zero_variance():
    same = servers(3, 1.0, 0.0, seed=0)
    same["value"] = 100.0
    change = paired_change(same, "A", "B", higher_is_better=True)
    assert (change.ratio, change.verdict) == (1.0, NO_CHANGE)
    assert change.low == pytest.approx(1.0) and change.high == pytest.approx(1.0)
    same.loc[same["letter"] == "B", "value"] = 90.0
    change = paired_change(same, "A", "B", higher_is_better=True)
    assert change.low == pytest.approx(0.9) and change.high == pytest.approx(0.9)
    assert change.verdict == SLOWER


def test_a_block_missing_an_arm_is_dropped():
    values = servers(4, 0.90, 0.01, seed=1)
    values = values[~((values["block"] == 2) & (values["letter"] == "B"))]
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.blocks == 3 and change.df == 12 - 3 - 1 and change.verdict == SLOWER


def test_no_values_is_not_enough_data():
    empty = pd.DataFrame({"letter": [], "block": [], "slot": [], "value": []})
    assert paired_change(empty, "A", "B", True).verdict == NOT_ENOUGH


def test_a_small_clear_change_is_a_verdict_however_small():
    """Significance first (issue 34): a 1% change measured to +-0.1% is "faster", not "no
    change"; "no change" is an interval that covers 0 inside the margin."""
    values = servers(4, 1.01, 0.0005, seed=9)
    change = paired_change(values, "A", "B", True)
    assert change.verdict == FASTER and change.ratio == pytest.approx(1.01, abs=0.002)
    assert paired_change(values, "A", "B", True, Rule(margin=0.05)).verdict == FASTER
    same = paired_change(servers(4, 1.0, 0.002, seed=9), "A", "B", True)
    assert same.low < 1 < same.high and same.verdict == NO_CHANGE


def test_noisy_figure_asks_for_enough_blocks():
    change = paired_change(servers(3, 1.0, 0.06, seed=4), "A", "B", True)
    assert change.verdict == NOT_ENOUGH
    needed = change.blocks_needed
    # independently: a server's residual sd from the interval (ABBA: se = sd / sqrt(blocks))
    sd = math.log(change.high / change.ratio) / t_quantile(0.95, change.df) * math.sqrt(3)
    effect = abs(math.log(change.ratio))
    edge = math.log1p(Rule().margin)
    target = max(effect, edge - effect)  # an interval that excludes 0, or lies inside

    def half(blocks: int) -> float:
        return t_quantile(0.95, 3 * blocks - 1) * sd / math.sqrt(blocks)

    assert half(needed) <= target < half(needed - 1)


@pytest.mark.parametrize(
    ("low", "high", "higher_is_better", "expected"),
    [
        (0.06, 0.09, True, FASTER),
        (0.06, 0.09, False, SLOWER),
        (-0.09, -0.06, True, SLOWER),
        (-0.005, 0.009, True, NO_CHANGE),  # covers 0, inside +-2%
        (0.005, 0.02, True, FASTER),  # clear, however small: significance first
        (-0.02, -0.005, False, FASTER),  # a cost that fell
        (0.02, 0.06, True, FASTER),
        (-0.04, 0.04, True, NOT_ENOUGH),  # covers 0, past the 2% margin
        (-0.015, 0.015, True, NO_CHANGE),
        (-0.001, 0.099, True, NOT_ENOUGH),  # defect 2: this read "no change" and exited 0
        (-0.07, 0.05, True, NOT_ENOUGH),
    ],
)
def test_decide(low, high, higher_is_better, expected):
    assert decide(math.log1p(low), math.log1p(high), higher_is_better, Rule()) == expected


def test_no_change_means_the_whole_interval_inside_the_margin():
    rule = Rule(margin=0.05)
    inside, edge = math.log1p(0.0499), math.log1p(0.0501)
    assert decide(-inside, inside, True, rule) == NO_CHANGE
    assert decide(-inside, edge, True, rule) == NOT_ENOUGH
    assert decide(-edge, inside, True, rule) == NOT_ENOUGH


def test_a_family_of_figures_is_judged_at_a_bonferroni_level():
    assert Rule(level=0.95).family(25).level == pytest.approx(0.998)
    assert Rule(level=0.95).family(1).level == pytest.approx(0.95)


def test_schedules_alternate_their_order():
    assert schedule(3, abba=True) == list("ABBABAABABBA")
    assert schedule(2, abba=False) == list("ABBA")
    design = Design.of(schedule(2, abba=True), 4)
    assert design.blocks.tolist() == [0, 0, 0, 0, 1, 1, 1, 1] and design.df == 5


def test_fit_works_on_many_runs_at_once():
    design = Design.of(schedule(3, abba=True), 4)
    rng = np.random.default_rng(0)
    logs = rng.normal(0, 0.05, (50, 12))
    effects, ses = fit(logs, design)
    for row, effect, se in zip(logs, effects, ses, strict=True):
        one_effect, one_se = fit(row, design)
        assert (one_effect, one_se) == pytest.approx((effect, se))


def runs(values_a: list[list[float]], values_b: list[list[float]]) -> pd.DataFrame:
    """Recorded runs as compare's between-runs rows: `block` names the run."""
    rows, run = [], 0
    for letter, side in (("A", values_a), ("B", values_b)):
        for servers_of_run in side:
            rows += [{"letter": letter, "block": run, "value": v} for v in servers_of_run]
            run += 1
    return pd.DataFrame(rows)


def test_one_run_a_side_is_descriptive_with_no_verdict():
    change = run_change(runs([[100, 102, 98]], [[80, 81, 79]]), "A", "B", True)
    assert change.method == DESCRIPTIVE and change.verdict == NO_VERDICT
    assert change.low is None and change.high is None
    assert change.ratio == pytest.approx(math.exp(np.log([80, 81, 79]).mean()) / 100, rel=1e-3)


def test_repeated_runs_give_a_two_sample_interval_over_runs():
    a = [[100, 101], [104, 103], [98, 99]]
    b = [[90, 91], [93, 92]]
    change = run_change(runs(a, b), "A", "B", True)
    per_run_a = [np.log(r).mean() for r in a]
    per_run_b = [np.log(r).mean() for r in b]
    assert change.method == RUNS and change.df == 3 and change.blocks == 5
    pooled = (np.var(per_run_a, ddof=1) * 2 + np.var(per_run_b, ddof=1)) / 3
    half = t_quantile(0.95, 3) * math.sqrt(pooled * (1 / 3 + 1 / 2))
    effect = np.mean(per_run_b) - np.mean(per_run_a)
    assert math.log(change.ratio) == pytest.approx(effect)
    assert math.log(change.high) == pytest.approx(effect + half)
    assert change.verdict == SLOWER


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), ratio=st.floats(0.5, 2.0), scale=st.floats(1e-3, 1e6))
def test_swapping_arms_inverts_the_ratio_and_scale_does_not_matter(seed, ratio, scale):
    values = servers(3, ratio, 0.02, seed)
    change = paired_change(values, "A", "B", True)
    swapped = values.assign(letter=values["letter"].map({"A": "B", "B": "A"}))
    back = paired_change(swapped, "A", "B", True)
    scaled = paired_change(values.assign(value=values["value"] * scale), "A", "B", True)
    assert back.ratio == pytest.approx(1 / change.ratio)
    assert back.low == pytest.approx(1 / change.high)
    assert {change.verdict, back.verdict} in ({FASTER, SLOWER}, {change.verdict})
    assert scaled.ratio == pytest.approx(change.ratio) and scaled.verdict == change.verdict

"""The paired comparison: known answers on synthetic per-server values (docs/STATISTICS.md)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.analysis.stats import (
    BLOCKS,
    FASTER,
    NO_CHANGE,
    NOT_ENOUGH,
    SLOWER,
    WITHIN_BLOCK,
    Rule,
    block_log_ratios,
    decide,
    paired_change,
    t_quantile,
)

ABBA = "ABBA"


def servers(
    blocks: int, ratio: float, noise: float, seed: int, base: float = 20000.0, order: str = ABBA
) -> pd.DataFrame:
    """Per-server values: arm B is `ratio` times arm A, each server with lognormal noise
    `noise`, and each block with its own drift (which pairing must cancel)."""
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


def test_block_log_ratio_is_mean_b_over_mean_a_per_block():
    values = pd.DataFrame(
        {"letter": list("ABBA"), "block": 0, "slot": range(4), "value": [100.0, 90, 110, 100]}
    )
    ratios = block_log_ratios(values, "A", "B")
    assert ratios.tolist() == pytest.approx([math.log(100 / 100)])


def test_ten_percent_less_throughput_is_slower_and_ci_covers_truth():
    change = paired_change(servers(4, 0.90, 0.01, seed=7), "A", "B", higher_is_better=True)
    assert change.verdict == SLOWER
    assert change.method == BLOCKS and change.blocks == 4 and change.df == 3
    assert change.low <= 0.90 <= change.high


def test_ten_percent_more_latency_is_slower_and_less_is_faster():
    worse = paired_change(servers(4, 1.10, 0.01, seed=3), "A", "B", higher_is_better=False)
    better = paired_change(servers(4, 1 / 1.10, 0.01, seed=3), "A", "B", higher_is_better=False)
    assert (worse.verdict, better.verdict) == (SLOWER, FASTER)


def test_ci_covers_the_true_ratio_about_95_percent_of_the_time():
    covered = 0
    for seed in range(300):
        change = paired_change(servers(4, 0.90, 0.02, seed), "A", "B", higher_is_better=True)
        covered += change.low <= 0.90 <= change.high
    assert 0.90 <= covered / 300 <= 0.99


def test_a_a_is_no_change_about_95_percent_of_the_time():
    verdicts = [
        paired_change(servers(4, 1.0, 0.01, seed), "A", "B", higher_is_better=True).verdict
        for seed in range(400)
    ]
    false_positive = sum(v in (FASTER, SLOWER) for v in verdicts) / len(verdicts)
    assert false_positive <= 0.10
    assert verdicts.count(NO_CHANGE) / len(verdicts) >= 0.88


def test_pairing_cancels_drift_between_blocks():
    # drift of 5% between blocks, 0.2% server noise: unpaired, the spread would hide a 3% change
    change = paired_change(servers(4, 1.03, 0.002, seed=11), "A", "B", higher_is_better=True)
    assert change.verdict == FASTER
    assert change.ratio == pytest.approx(1.03, abs=0.005)


def test_one_abba_block_falls_back_to_a_weaker_within_block_estimate():
    values = servers(1, 0.90, 0.005, seed=5)
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.method == WITHIN_BLOCK and change.blocks == 1 and change.df == 2
    logs = np.log(values["value"].to_numpy())
    a, b = logs[[0, 3]], logs[[1, 2]]
    pooled_sd = math.sqrt((a.var(ddof=1) + b.var(ddof=1)) / 2)
    half = 4.302653 * pooled_sd * math.sqrt(1 / 2 + 1 / 2)
    assert math.log(change.ratio) == pytest.approx(b.mean() - a.mean())
    assert math.log(change.high / change.ratio) == pytest.approx(half, rel=1e-5)
    assert change.verdict == SLOWER


def test_one_ab_block_is_not_enough_data():
    values = servers(1, 0.90, 0.01, seed=5, order="AB")
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.verdict == NOT_ENOUGH and change.ratio is None


def test_plain_ab_blocks_pair_one_server_each():
    change = paired_change(servers(6, 0.90, 0.01, seed=2, order="AB"), "A", "B", True)
    assert change.method == BLOCKS and change.blocks == 6 and change.verdict == SLOWER


def test_zero_variance():
    same = servers(3, 1.0, 0.0, seed=0)
    same["value"] = 100.0
    change = paired_change(same, "A", "B", higher_is_better=True)
    assert (change.ratio, change.low, change.high, change.verdict) == (1.0, 1.0, 1.0, NO_CHANGE)
    same.loc[same["letter"] == "B", "value"] = 90.0
    change = paired_change(same, "A", "B", higher_is_better=True)
    assert change.low == pytest.approx(0.9) and change.high == pytest.approx(0.9)
    assert change.verdict == SLOWER


def test_a_block_missing_an_arm_or_a_value_is_dropped():
    values = servers(4, 0.90, 0.01, seed=1)
    values = values[~((values["block"] == 2) & (values["letter"] == "B"))]
    values.loc[values.index[0], "value"] = float("nan")  # one server of block 0 failed
    change = paired_change(values, "A", "B", higher_is_better=True)
    assert change.blocks == 3 and change.verdict == SLOWER


def test_no_values_is_not_enough_data():
    empty = pd.DataFrame({"letter": [], "block": [], "slot": [], "value": []})
    assert paired_change(empty, "A", "B", True).verdict == NOT_ENOUGH


def test_min_effect_turns_a_tiny_significant_change_into_no_change():
    values = servers(4, 1.003, 0.0005, seed=9)
    assert paired_change(values, "A", "B", True).verdict == NO_CHANGE
    assert paired_change(values, "A", "B", True, Rule(min_effect=0.0)).verdict == FASTER


def test_noisy_figure_asks_for_enough_blocks():
    rule = Rule()
    change = paired_change(servers(3, 1.0, 0.06, seed=4), "A", "B", True, rule)
    assert change.verdict == NOT_ENOUGH
    needed = change.blocks_needed
    # independently: the spread of one block's log ratio is the observed se * sqrt(blocks)
    spread = math.log(change.high / change.ratio) / t_quantile(0.95, 2) * math.sqrt(3)
    target = math.log(1.05)
    assert t_quantile(0.95, needed - 1) * spread / math.sqrt(needed) <= target
    assert t_quantile(0.95, needed - 2) * spread / math.sqrt(needed - 1) > target


@pytest.mark.parametrize(
    ("low", "high", "higher_is_better", "expected"),
    [
        (0.02, 0.05, True, FASTER),
        (0.02, 0.05, False, SLOWER),
        (-0.05, -0.02, True, SLOWER),
        (-0.005, 0.009, True, NO_CHANGE),  # inside +-1%
        (0.002, 0.008, True, NO_CHANGE),  # significant but negligible
        (0.002, 0.012, True, FASTER),  # significant, not provably negligible
        (-0.04, 0.04, True, NO_CHANGE),  # covers 0, half-width 4% <= 5%
        (-0.07, 0.05, True, NOT_ENOUGH),  # covers 0, half-width 6%
    ],
)
def test_decide(low, high, higher_is_better, expected):
    assert decide(low, high, higher_is_better, Rule()) == expected


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

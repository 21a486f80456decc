"""The verdicts' error rates over thousands of seeded synthetic runs, held to stated bounds
(docs/STATISTICS.md, "Checked by simulation"). Deterministic: every rate comes from a fixed
seed, so a bound that fails is the statistics changing, never chance.

Bounds: with 10,000 runs a rate's binomial standard error is at most 0.5 points, about 0.16
at 2.5%; the targets (headline "slower" at most 2.5%, any verdict at most 5%, coverage 95%)
get a margin of about two standard errors.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from harness.analysis.simulation import Noise, between_runs, rates, simulate
from harness.analysis.stats import SLOWER, Design, Rule, judge, schedule

RUNS = 10_000
DRIFT = Noise(server=0.05, block=0.05, drift=0.01)  # 1% per slot, steady through the run
SLOWDOWN = -math.log(1.10)  # a planted 10% slowdown of a throughput (log B/A)


@pytest.mark.parametrize("blocks", [1, 2, 3, 4, 5, 6])
def test_aa_error_rates_hold_for_one_to_six_abba_blocks_with_drift(blocks):
    found = rates(blocks, DRIFT, runs=RUNS, seed=blocks)
    assert found.slower <= 0.029
    assert found.any_verdict <= 0.055
    assert 0.945 <= found.covered <= 0.97


@pytest.mark.parametrize("blocks", [2, 3, 4, 5, 6])
def test_aa_error_rates_hold_for_alternating_ab_blocks_with_drift(blocks):
    found = rates(blocks, DRIFT, abba=False, runs=RUNS, seed=10 + blocks)
    assert found.slower <= 0.029 and found.any_verdict <= 0.055


@pytest.mark.parametrize("higher_is_better", [True, False])
@pytest.mark.parametrize("blocks", [1, 3, 6])
def test_intervals_cover_a_known_ten_percent_slowdown(blocks, higher_is_better):
    """At least 95% (less two standard errors). A drift within blocks makes the residuals
    larger and the intervals a little wider than they need be: at most 97%."""
    effect = SLOWDOWN if higher_is_better else -SLOWDOWN
    found = rates(
        blocks, DRIFT, effect, runs=RUNS, seed=20 + blocks, higher_is_better=higher_is_better
    )
    assert 0.945 <= found.covered <= 0.97
    assert found.faster <= 0.001  # the wrong direction: a t-interval on 2 df allows a little


def test_a_planted_ten_percent_slowdown_is_found_at_three_blocks_when_servers_vary_by_five():
    """The figure issue 11 asks for on the development machine, here with synthetic noise of
    a 5% server-to-server spread; docs/POWER.md has the real runs' noise."""
    found = rates(3, DRIFT, SLOWDOWN, runs=RUNS, seed=3)
    assert found.slower >= 0.78 and found.faster == 0.0


def test_power_grows_with_blocks():
    found = [rates(n, DRIFT, SLOWDOWN, runs=RUNS, seed=30 + n).slower for n in range(1, 7)]
    assert found == sorted(found) and found[-1] > 0.98


def test_b_always_second_is_biased_by_drift_and_alternating_is_not():
    """Defect 3: with B always second, a throughput falling 1% per server moved every block's
    ratio the same way, so A/A runs read "slower" (23% of them at 5 blocks, issue 11).
    Alternating A B and B A cancels the drift over each pair of blocks. A 1% bias is inside
    the default 5% margin, so the rates are shown at a 1% margin, where it would show."""
    noise = Noise(server=0.02, block=0.05, drift=-0.01)
    strict = Rule(margin=0.01)

    def judged(letters: list[str], size: int):
        logs = simulate(letters, size, noise, 0.0, RUNS, np.random.default_rng(5))
        effect, _, _, verdicts = judge(logs, Design.of(letters, size), True, strict)
        return effect.mean(), np.mean(verdicts == SLOWER)

    bias, slower = judged(list("AB" * 6), 2)
    assert bias == pytest.approx(-0.01, abs=0.001) and slower > 0.08  # B one slot later
    bias, slower = judged(schedule(6, abba=False), 2)
    assert bias == pytest.approx(0.0, abs=0.001) and slower <= 0.029
    bias, slower = judged(schedule(6, abba=True), 4)
    assert bias == pytest.approx(0.0, abs=0.001) and slower <= 0.029


def test_a_position_effect_cancels_over_pairs_of_abba_and_baab_blocks():
    """Outer servers of a block 3% faster (issue 11's A/A runs looked like this): one A B B A
    block alone is biased; every pair of blocks in turned order cancels it."""
    u_shape = Noise(server=0.03, block=0.05, drift=0.0, positions=(0.03, 0.0, 0.0, 0.03))
    assert rates(1, u_shape, runs=RUNS, seed=41).slower > 0.035
    for blocks in (2, 4, 6):
        found = rates(blocks, u_shape, runs=RUNS, seed=40 + blocks)
        assert found.slower <= 0.029 and found.any_verdict <= 0.055


@pytest.mark.parametrize("spread", [0.02, 0.05])
def test_between_recorded_runs_the_run_is_the_unit(spread):
    """Defect 1: two A/A runs with run-to-run spread, their blocks paired by order, called
    "slower" far more than 2.5% of the time. One run a side now gives no verdict at all;
    three runs a side give the nominal rates over runs."""
    noise = Noise(server=0.05, block=0.05, drift=0.0, run=spread)
    by_order = between_runs(1, 3, noise, by_order=True, runs=RUNS, seed=1)
    assert by_order.slower > 0.08
    one = between_runs(1, 3, noise, runs=RUNS, seed=2)
    assert one.any_verdict == 0.0
    three = between_runs(3, 3, noise, runs=RUNS, seed=3)
    assert three.slower <= 0.029 and three.any_verdict <= 0.055
    assert 0.94 <= three.covered <= 0.96

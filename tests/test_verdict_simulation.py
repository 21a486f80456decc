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

from harness.analysis.block_model import Design, judge, schedule
from harness.analysis.simulation import Noise, auto_rates, between_runs, rates, simulate
from harness.analysis.verdict import SLOWER, Rule

RUNS = 10_000
DRIFT = Noise(server=0.05, block=0.05, drift=0.01)  # 1% per slot, steady through the run
SLOWDOWN = -math.log(1.10)  # a planted 10% slowdown of a throughput (log B/A)
LOG_075 = math.log(0.75)  # a server 25% slower (log of its share of the throughput)


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


def outer_slow(share: float) -> Noise:
    """A/A noise whose block's outer servers (A's in an A B B A block) run at `share` of the
    others' throughput, with a 5% server noise and a 1% drift per slot."""
    offset = math.log(share)
    return Noise(server=0.05, block=0.05, drift=0.01, positions=(offset, 0.0, 0.0, offset))


@pytest.mark.parametrize("share,alone", [(0.75, 0.7), (0.90, 0.2)])
def test_one_block_gives_no_verdict_because_position_reads_as_a_change(share, alone):
    """INVARIANTS 50. The H200 A/A run of `bench run qwen35 -c 64 --abba`, one block, said
    "faster (+35.3%)": both A servers were slow. In one A B B A block arm A holds the outer
    positions, so an effect of a server's position is arm A's: with the outer servers 25% (10%)
    slower the interval alone calls 79% (22%) of A/A runs "faster" or "slower", against a
    nominal 5%. One block now gets its interval and "not enough data", never "faster" or
    "slower" (so never exit 1); two or more blocks, ABBA then BAAB, cancel the position effect
    over each pair and hold the nominal rates."""
    one = rates(1, outer_slow(share), runs=RUNS, seed=51)
    assert one.interval_alone > alone  # what one block said before
    assert one.any_verdict == 0.0 and one.not_enough == 1.0
    for blocks in range(2, 7):
        found = rates(blocks, outer_slow(share), runs=RUNS, seed=50 + blocks)
        assert found.slower <= 0.029 and found.any_verdict <= 0.055, (blocks, found)


def test_a_cold_first_server_alone_widens_the_interval_and_fakes_no_change():
    """The run's first server 25% slower and no other (cold caches, compiles, clocks): it moves
    one server of arm A, so it grows the residuals as much as the estimate, and the interval
    alone stays under the nominal 5% at every block count. What one block cannot survive is an
    effect on both of an arm's servers (above), not a cold start."""
    cold = Noise(server=0.05, block=0.05, drift=0.01, first=LOG_075)
    assert rates(1, cold, runs=RUNS, seed=61).interval_alone <= 0.055
    for blocks in range(2, 7):
        found = rates(blocks, cold, runs=RUNS, seed=60 + blocks)
        assert found.slower <= 0.029 and found.any_verdict <= 0.055, (blocks, found)


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


@pytest.mark.parametrize("spread", [0.01, 0.03, 0.08])
def test_blocks_auto_holds_the_aa_rates_over_its_looks(spread):
    """INVARIANTS 77: --blocks auto looks at 2, 3, ... 8 blocks and stops at the first decided
    look; each look at its share of the 5% (half to the first, the rest evenly) keeps A/A
    "slower" at most 2.5% and any verdict at most 5% over all the looks."""
    noise = Noise(server=spread, block=0.05, drift=0.01)
    found = auto_rates(8, noise, runs=RUNS, seed=71)
    assert found.rates.slower <= 0.029 and found.rates.any_verdict <= 0.055


def test_blocks_auto_finds_a_clear_change_at_its_first_look():
    found = auto_rates(8, Noise(server=0.01, block=0.05, drift=0.0), SLOWDOWN, runs=RUNS, seed=73)
    assert found.rates.slower == 1.0 and found.mean_blocks == 2.0


def test_significance_first_calls_a_precise_three_percent_slowdown_slower():
    """Issue 34: on the H200 a 3% slowdown measured to +-0.8% read "no change" at the 5%
    margin. Now at a 1% server spread two blocks call it slower nearly always."""
    found = rates(2, Noise(server=0.005, block=0.05, drift=0.0), -math.log(1.03), runs=RUNS)
    assert found.slower >= 0.99 and found.no_change == 0.0

"""bench power: the resampling of whole blocks on synthetic data with a known answer (its rates'
intervals hold the true rate), the real A/A blocks' false alarms and position effects, the
stamp a report checks, and one tiny real run end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from harness.analysis import aa_run, power, power_report, power_stats
from harness.analysis.block_model import MIN_BLOCKS, Design, judge, schedule
from harness.analysis.stats import paired_change
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import NOT_ENOUGH, SLOWER, Rule
from harness.measure.power import PowerPlan, measure
from harness.results import write_power
from harness.scenario import load_scenario

SIGMA = 0.05  # a server's noise (log units) in the synthetic runs


def design(blocks: int) -> Design:
    return Design.of(schedule(blocks, abba=True), 4)


def blocks_of(count: int, seed: int = 7, sigma: float = SIGMA, outer: float = 0.0) -> np.ndarray:
    """[count, 4] null blocks: a block offset, server noise, the outer servers `outer` apart."""
    rng = np.random.default_rng(seed)
    pool = rng.normal(0.0, sigma, (count, 4)) + rng.normal(0.0, 0.05, (count, 1))
    return pool + np.array([outer, 0.0, 0.0, outer])


def runs(blocks: int, higher_is_better: bool = True, pool=None, draws: int = 4000, seed=7):
    pool = blocks_of(400) if pool is None else pool
    rng = np.random.default_rng(seed)
    return power_stats.Experiments.of(pool, blocks, higher_is_better, draws, rng, 40, 50)


@pytest.mark.parametrize("blocks", [2, 3, 5, 10])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_aa_false_positive_rate_is_near_nominal(blocks, higher_is_better):
    rate = runs(blocks, higher_is_better).false_positive_rate()
    assert 0.03 <= rate.value <= 0.07  # nominal 5%
    assert rate.low <= rate.value <= rate.high


def test_one_block_has_no_false_positives_and_detects_nothing():
    """INVARIANTS 50: one block gives no verdict, so bench power counts none at one block."""
    one = runs(1)
    assert one.false_positive_rate().value == 0.0
    assert one.detection_rate(power_stats.LARGEST).value == 0.0
    assert one.min_detectable_slowdown().value is None
    assert 0.93 <= one.coverage(0.1).value <= 0.97


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_large_planted_slowdown_is_found_and_covered(higher_is_better):
    five = runs(5, higher_is_better)
    assert five.detection_rate(0.5).value > 0.99
    assert five.detection_rate(0.0).value < 0.05
    assert 0.93 <= five.coverage(0.1).value <= 0.97


def test_min_detectable_slowdown_matches_theory_and_shrinks_with_blocks():
    found = {n: runs(n).min_detectable_slowdown() for n in (3, 5, 10)}
    # normal theory for 80% power at 95%: (t_.975 + t_.80) * sigma / sqrt(n), in log units,
    # on 3n - 1 degrees of freedom (an ABBA block's estimate has the variance of one server)
    df = 3 * 5 - 1
    theory_5 = math.expm1((t_quantile(0.95, df) + t_quantile(0.6, df)) * SIGMA / math.sqrt(5))
    assert 0.85 * theory_5 <= found[5].value <= 1.15 * theory_5
    assert found[5].low < theory_5 < found[5].high
    assert found[3].value > found[5].value > found[10].value
    assert runs(5).detection_rate(found[5].value).value >= power_stats.POWER


def test_too_few_blocks_give_no_rates_and_say_so():
    rng = np.random.default_rng(3)
    rates = power._rates(blocks_of(1), [3], True, 100, 10, rng)
    assert all(table[3] is None for table in rates)
    report = power_report.PowerReport("q", "tiny", {}, 1, 4, 16, 5.0, 0.2, [], [], "-", pool_size=1)
    assert any("too few to resample" in d for d in power.doubts(report))
    report.pool_size = 4
    assert any("hold the truth" in d for d in power.doubts(report))


def test_undetectable_when_the_noise_swamps_everything():
    huge = runs(2, pool=blocks_of(50, sigma=5.0), draws=500)
    found = huge.min_detectable_slowdown()
    assert found.value is None and found.high is None


def true_detection(blocks: int, outer: float, sigma: float, slowdown: float = 0.1) -> float:
    """The detection rate of the setup itself (fresh blocks, 200,000 runs): the known answer."""
    d = design(blocks)
    logs = blocks_of(200_000 * blocks, seed=99, sigma=sigma, outer=outer)
    logs = logs.reshape(200_000, 4 * blocks) - math.log1p(slowdown) * d.is_b
    return float((judge(logs, d, True, Rule())[3] == SLOWER).mean())


def test_repeated_analyses_quote_intervals_that_hold_the_true_rate():
    """Issue 34: one setup analysed again and again (each a fresh A/A run of 12 blocks, the
    default bench power's pool) quoted "+10% found at 3 blocks" anywhere from 60% to 98%
    against a true 82%. Each analysis now quotes an interval over the pool and the draws:
    they hold the true rate about as often as they claim (95%), and are not vacuous."""
    truth = true_detection(3, outer=0.0, sigma=SIGMA)
    held, widths = 0, []
    for analysis in range(60):
        pool = blocks_of(12, seed=1000 + analysis)
        rng = np.random.default_rng(analysis)
        rate = power_stats.Experiments.of(pool, 3, True, 500, rng, 100, 50).detection_rate(0.1)
        held += rate.low <= truth <= rate.high
        widths.append(rate.high - rate.low)
    assert held >= 0.85 * 60  # measured 92% (docs/POWER.md)
    assert float(np.median(widths)) < 0.5


def test_synthetic_runs_keep_a_blocks_position_structure():
    """Whole blocks keep a position effect (outer servers 25% slower), which widens every
    interval: a +10% slowdown at 2 blocks is then rarely found. Residuals resampled one by one
    lost it (they would find it as if the noise were plain)."""
    outer = math.log(0.75)
    truth = true_detection(2, outer=outer, sigma=0.02)
    pool = blocks_of(48, seed=5, sigma=0.02, outer=outer)
    found = runs(2, pool=pool, draws=2000).detection_rate(0.1)
    assert found.low <= truth <= found.high and truth < 0.2
    plain = runs(2, pool=blocks_of(48, seed=5, sigma=0.02), draws=2000).detection_rate(0.1)
    assert plain.value > 0.9


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_verdicts_are_paired_changes_verdicts(higher_is_better, blocks):
    """The vectorised judgement is stats.paired_change's, run for run (one block: "not enough
    data" in both, INVARIANTS 50)."""
    d = design(blocks)
    noise = runs(blocks, higher_is_better, pool=blocks_of(400) * 3, draws=40)
    slowdown = 0.08
    found = noise.judged(noise.runs, slowdown)[0]
    shift = math.log1p(slowdown) * (-1 if higher_is_better else 1)
    letters = np.where(d.is_b, "B", "A")
    for row, verdict in zip(noise.runs, found, strict=True):
        values = 100.0 * np.exp(row + shift * d.is_b)
        frame = pd.DataFrame({"letter": letters, "block": d.blocks, "value": values})
        assert paired_change(frame, "A", "B", higher_is_better).verdict == verdict
    assert len(set(found)) > 1 if blocks >= MIN_BLOCKS else set(found) == {NOT_ENOUGH}


def run_frame(logs: np.ndarray) -> pd.DataFrame:
    d = design(len(logs) // 4)
    letters = np.where(d.is_b, "B", "A")
    slots = np.arange(len(logs))
    return pd.DataFrame(
        {"letter": letters, "block": d.blocks, "slot": slots, "value": np.exp(logs)}
    )


def test_a_planted_runs_blocks_leave_its_effect_out():
    d = design(3)
    logs = np.random.default_rng(1).normal(0, SIGMA, len(d.blocks))
    plain = power_stats.null_blocks(run_frame(logs))
    planted = power_stats.null_blocks(run_frame(logs + 0.3 * d.is_b))
    assert planted == pytest.approx(plain) and plain.shape == (3, 4)
    # each block's arm contrast about the run's, scaled by sqrt(K / (K - 1)) (K = 3)
    is_b = d.is_b.reshape(3, 4)
    contrast = power_stats._contrast(logs.reshape(3, 4), is_b)
    wanted = (contrast - contrast.mean()) * math.sqrt(3 / 2)
    assert power_stats._contrast(plain, is_b) == pytest.approx(wanted)
    # an A/A run's blocks as run, in position order; a block missing a server is left out
    assert power_stats.aa_blocks(run_frame(logs)) == pytest.approx(logs.reshape(3, 4))
    broken = run_frame(logs).drop(index=5)
    assert power_stats.aa_blocks(broken) == pytest.approx(logs.reshape(3, 4)[[0, 2]])


def test_cv_and_expected_ratios():
    assert power_stats.cv([9.0, 11.0]) == pytest.approx(math.sqrt(2) / 10)
    assert power_stats.cv([5.0]) is None
    expected = power.expected_ratios(delay_ms=5.0, iteration_ms=20.0, work_ms=1.0)
    assert expected["output_tok_per_s"] == pytest.approx(0.8)
    assert expected["postprocess work"] == pytest.approx(6.0)


def aa_blocks(blocks: int, outer: float, seed: int = 0) -> pd.DataFrame:
    """A/A servers in the real schedule's order, the outer servers of a block `outer` higher."""
    rng = np.random.default_rng(seed)
    rows = []
    for slot, letter in enumerate(schedule(blocks, abba=True)):
        position = slot % 4
        log = rng.normal(0, 0.005) + (outer if position in (0, 3) else 0.0)
        rows.append(
            {"letter": letter, "block": slot // 4, "slot": slot, "value": 100 * math.exp(log)}
        )
    return pd.DataFrame(rows)


def test_real_aa_blocks_show_their_false_alarms_and_position_effects():
    found = aa_run.real_aa(aa_blocks(6, outer=0.08), higher_is_better=True)
    assert found.blocks == 6 and set(found.alarms) == {2, 3, 4, 5, 6}  # one block: no verdict
    assert found.alarms[2][1] == 3 and found.alarms[4][1] == 1
    assert found.alarms[2][0] == 0  # ABBA and BAAB together: the position effect cancels
    assert [p.letters for p in found.positions] == ["ABABAB", "BABABA", "BABABA", "ABABAB"]
    contrast = found.outer_minus_inner
    assert contrast.low > 0.07 and contrast.mean == pytest.approx(0.08, abs=0.01)
    report = power_report.PowerReport("q", "tiny", {}, 6, 4, 16, 5.0, 0.2, [], [], "-", 12, found)
    assert any("position in its block" in d for d in power.doubts(report))
    quiet = aa_run.real_aa(aa_blocks(6, outer=0.0), higher_is_better=True)
    assert quiet.outer_minus_inner.low < 0 < quiet.outer_minus_inner.high


def test_a_power_result_is_quoted_only_for_the_setup_it_was_measured_on():
    machine = {"host": "vm", "cpu": "x86_64", "cpus": 2, "gpu": None, "torch": "2.13"}
    report = power_report.PowerReport("qwen35", "tiny", machine, 3, 4, 16, 5.0, 0.2, [], [], "-")
    stored = json.loads(json.dumps(report.to_json()))
    manifest = {"scenario": {"name": "qwen35", "size": "tiny"}, "concurrency": 4}
    assert power_report.mismatch(stored, manifest | {"machine": machine | {"torch": "2.14"}}) == []
    other = manifest | {"concurrency": 64, "machine": machine | {"gpu": "H200"}}
    assert power_report.mismatch(stored, other) == [
        "concurrency 4 (this run: 64)",
        "machine gpu None (this run: H200)",
    ]
    assert power_report.mismatch({"scenario": "qwen35"}, manifest) == [
        "it carries no stamp of the setup it was measured on"
    ]


@pytest.mark.slow
def test_tiny_power_run_end_to_end(tmp_path):
    """Two A/A blocks and two planted blocks (half an iteration), a few requests per server:
    the planted postprocess delay is found and the report is written. (One block's interval
    has 2 degrees of freedom, and on cores shared with other engines two A servers'
    postprocess work differed 3.5-fold: one block could not decide.) About 45 s on 2 cores,
    most of it the 16 servers' start-ups (two configurations of two ABBA blocks, the fewest
    that decide); longer while other engines share the cores."""
    load = {"concurrency": 2, "blocks": 2, "requests": 6, "warmup": 1}
    plan = PowerPlan(load_scenario("qwen35", "tiny"), **load, levels=(0.5,), draws=200, boots=20)
    report = measure(plan, tmp_path / "run", lambda status: None)
    data = json.loads(write_power(report.to_json(), tmp_path).read_text())
    keys = "scenario size machine blocks false_positive_rate created min_detectable_slowdown"
    assert {*keys.split(), "noise", "levels"} <= set(data)
    assert data["size"] == "tiny" and data["blocks"] == 2
    assert data["stamp"] == report.stamp() and data["stamp"]["concurrency"] == 2
    assert report.iteration_ms and report.iteration_ms > 0
    (level,) = report.levels
    assert level.measured["postprocess work"]["verdict"] == SLOWER
    assert level.measured["postprocess work"]["ratio"] > 1.5
    assert set(data["noise"]) == set(power.FIGURES)


def test_a_planted_slowdown_missed_is_a_doubt_only_when_it_should_have_been_seen():
    def report(expected_ratio: float) -> power_report.PowerReport:
        tok = "output_tok_per_s"
        rate = power_stats.Rate
        figure = power_report.FigurePower(
            tok,
            True,
            0.05,
            0.04,
            "no change",
            *({3: rate(x, x, x)} for x in (0.05, 0.2, 0.5, 0.95)),
        )
        change = {"ratio": 0.9, "low": 0.7, "high": 1.1, "verdict": "not enough data"}
        level = power_report.LevelResult(0.1, 500, "-", {tok: expected_ratio}, {tok: change})
        run = ("qwen35", "tiny", {}, 3, 4, 16, 5.0, 0.2)
        return power_report.PowerReport(*run, [figure], [level], "-", pool_size=12)

    assert power.doubts(report(0.9)) == []  # +11% planted, +20% needed: not expected to be seen
    (doubt,) = power.doubts(report(0.5))  # +100% planted: it should have been
    assert "not called slower" in doubt


def test_a_power_result_carries_every_rate_with_its_interval():
    """Written and read back: each rate its value and interval; a report reads the value (and
    a result written before intervals, plain numbers, still reads)."""
    rate = power_stats.Rate
    rates = [{3: rate(v, v - 0.01, v + 0.02)} for v in (0.05, 0.2, 0.5, 0.95)]
    figure = power_report.FigurePower("output_tok_per_s", True, 0.05, 0.04, "no change", *rates, 12)
    report = power_report.PowerReport("q", "tiny", {}, 3, 4, 16, 5.0, 0.2, [figure], [], "-", 12)
    stored = json.loads(json.dumps(report.to_json()))
    found = power_report.rates_for(stored, "output_tok_per_s", 3)
    assert found["detection"] == 0.5 and found["detection_low"] == pytest.approx(0.49)
    assert found["min_detectable_slowdown_high"] == pytest.approx(0.22)
    assert stored["false_positive_rate"] == {"output_tok_per_s": 0.05}
    old = {"figures": [{"figure": "x", **{k: {"3": 0.1} for k in power_stats_keys()}}]}
    assert power_report.rates_for(old, "x", 3)["coverage"] == 0.1
    assert power_report.rates_for(old, "x", 3)["coverage_low"] is None


def power_stats_keys() -> tuple[str, ...]:
    return ("false_positive_rate", "min_detectable_slowdown", "detection", "coverage")

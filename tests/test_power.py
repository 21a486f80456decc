"""bench power: the resampling statistics on synthetic data with a known answer, the real A/A
blocks' false alarms and position effects, the stamp a report checks, and one tiny real run
end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.config import load_scenario
from harness.analysis import power, power_stats
from harness.analysis.stats import (
    MIN_BLOCKS,
    NOT_ENOUGH,
    SLOWER,
    Design,
    paired_change,
    schedule,
    t_quantile,
)
from harness.measure.power import PowerPlan, measure
from harness.results import write_power

SIGMA = 0.05  # a server's noise (log units) in the synthetic runs


def design(blocks: int) -> Design:
    return Design.of(schedule(blocks, abba=True), 4)


def null_noise(blocks: int, draws: int = 4000, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pool = rng.normal(0.0, SIGMA, 400)
    return power_stats.experiments(pool, design(blocks), draws, rng)


@pytest.mark.parametrize("blocks", [2, 3, 5, 10])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_aa_false_positive_rate_is_near_nominal(blocks, higher_is_better):
    runs = power_stats.Experiments(null_noise(blocks), design(blocks), higher_is_better)
    rate = runs.false_positive_rate()
    assert 0.02 <= rate <= 0.065  # nominal 5% (less where intervals fall inside the margin)


def test_one_block_has_no_false_positives_and_detects_nothing():
    """INVARIANTS 50: one block gives no verdict, so bench power counts none at one block."""
    runs = power_stats.Experiments(null_noise(1), design(1), True)
    assert runs.false_positive_rate() == 0.0 and runs.detection_rate(power_stats.LARGEST) == 0.0
    assert runs.min_detectable_slowdown() is None and 0.93 <= runs.coverage(0.1) <= 0.97


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_large_planted_slowdown_is_found_and_covered(higher_is_better):
    runs = power_stats.Experiments(null_noise(5), design(5), higher_is_better)
    assert runs.detection_rate(0.5) > 0.99
    assert runs.detection_rate(0.0) < 0.05
    assert 0.93 <= runs.coverage(0.1) <= 0.97


def test_min_detectable_slowdown_matches_theory_and_shrinks_with_blocks():
    found = {
        n: power_stats.Experiments(null_noise(n), design(n), True).min_detectable_slowdown()
        for n in (3, 5, 10)
    }
    # normal theory for 80% power at 95%: (t_.975 + t_.80) * sigma / sqrt(n), in log units,
    # on 3n - 1 degrees of freedom (an ABBA block's estimate has the variance of one server)
    df = 3 * 5 - 1
    theory_5 = math.expm1((t_quantile(0.95, df) + t_quantile(0.6, df)) * SIGMA / math.sqrt(5))
    assert 0.85 * theory_5 <= found[5] <= 1.15 * theory_5
    assert found[3] > found[5] > found[10]
    rate = power_stats.Experiments(null_noise(5), design(5), True).detection_rate(found[5])
    assert rate >= power_stats.POWER


def test_small_pool_uses_normal_noise_of_its_spread():
    """Two residuals cannot be resampled: the noise is normal with their root mean square,
    and the false-positive rate stays near nominal."""
    rng = np.random.default_rng(3)
    noise = power_stats.experiments(np.array([0.04, -0.06]), design(5), 4000, rng)
    assert noise.std() == pytest.approx(math.sqrt((0.04**2 + 0.06**2) / 2), rel=0.05)
    assert 0.02 <= power_stats.Experiments(noise, design(5), True).false_positive_rate() <= 0.065


def test_undetectable_when_the_noise_swamps_everything():
    rng = np.random.default_rng(0)
    huge = power_stats.experiments(np.array([-5.0, 5.0]), design(1), 500, rng)
    assert power_stats.Experiments(huge, design(1), True).min_detectable_slowdown() is None


@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_verdicts_are_paired_changes_verdicts(higher_is_better, blocks):
    """The vectorised judgement is stats.paired_change's, run for run (one block: "not enough
    data" in both, INVARIANTS 50)."""
    d = design(blocks)
    noise = null_noise(blocks, draws=40) * 3  # wide enough to mix the verdicts
    slowdown = 0.08
    found = power_stats.Experiments(noise, d, higher_is_better).verdicts(slowdown)
    shift = math.log1p(slowdown) * (-1 if higher_is_better else 1)
    letters = np.where(d.is_b, "B", "A")
    for row, verdict in zip(noise, found, strict=True):
        values = 100.0 * np.exp(row + shift * d.is_b)
        frame = pd.DataFrame({"letter": letters, "block": d.blocks, "value": values})
        assert paired_change(frame, "A", "B", higher_is_better).verdict == verdict
    assert len(set(found)) > 1 if blocks >= MIN_BLOCKS else set(found) == {NOT_ENOUGH}


def test_a_runs_residuals_leave_its_planted_effect_out():
    d = design(3)
    rng = np.random.default_rng(1)
    logs = rng.normal(0, SIGMA, len(d.blocks))
    frame = pd.DataFrame({"letter": np.where(d.is_b, "B", "A"), "block": d.blocks})
    plain = power_stats.run_residuals(frame.assign(value=np.exp(logs)))
    planted = power_stats.run_residuals(frame.assign(value=np.exp(logs + 0.3 * d.is_b)))
    assert planted == pytest.approx(plain)
    assert len(plain) == 12 and plain.sum() == pytest.approx(0.0, abs=1e-12)
    # scaled by sqrt(n / df): their mean square estimates the variance without bias
    assert np.mean(plain**2) == pytest.approx(np.sum((plain * math.sqrt(8 / 12)) ** 2) / 8)


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
    found = power.real_aa(aa_blocks(6, outer=0.08), higher_is_better=True)
    assert found.blocks == 6 and set(found.alarms) == {2, 3, 4, 5, 6}  # one block: no verdict
    assert found.alarms[2][1] == 3 and found.alarms[4][1] == 1
    assert found.alarms[2][0] == 0  # ABBA and BAAB together: the position effect cancels
    assert [p.letters for p in found.positions] == ["ABABAB", "BABABA", "BABABA", "ABABAB"]
    contrast = found.outer_minus_inner
    assert contrast.low > 0.07 and contrast.mean == pytest.approx(0.08, abs=0.01)
    report = power.PowerReport("q", "tiny", {}, 6, 4, 16, 5.0, 0.2, [], [], "-", 12, found)
    assert any("position in its block" in d for d in power.doubts(report))
    quiet = power.real_aa(aa_blocks(6, outer=0.0), higher_is_better=True)
    assert quiet.outer_minus_inner.low < 0 < quiet.outer_minus_inner.high


def test_a_power_result_is_quoted_only_for_the_setup_it_was_measured_on():
    machine = {"host": "vm", "cpu": "x86_64", "cpus": 2, "gpu": None, "torch": "2.13"}
    report = power.PowerReport("qwen35", "tiny", machine, 3, 4, 16, 5.0, 0.2, [], [], "-")
    stored = json.loads(json.dumps(report.to_json()))
    manifest = {"scenario": {"name": "qwen35", "size": "tiny"}, "concurrency": 4}
    assert power.mismatch(stored, manifest | {"machine": machine | {"torch": "2.14"}}) == []
    other = manifest | {"concurrency": 64, "machine": machine | {"gpu": "H200"}}
    assert power.mismatch(stored, other) == [
        "concurrency 4 (this run: 64)",
        "machine gpu None (this run: H200)",
    ]
    assert power.mismatch({"scenario": "qwen35"}, manifest) == [
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
    plan = PowerPlan(load_scenario("qwen35", "tiny"), **load, levels=(0.5,), draws=200)
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
    def report(expected_ratio: float) -> power.PowerReport:
        tok = "output_tok_per_s"
        figure = power.FigurePower(
            tok, True, 0.05, 0.04, "no change", {3: 0.05}, {3: 0.2}, {3: 0.5}, {3: 0.95}
        )
        change = {"ratio": 0.9, "low": 0.7, "high": 1.1, "verdict": "not enough data"}
        level = power.LevelResult(0.1, 500, "-", {tok: expected_ratio}, {tok: change})
        run = ("qwen35", "tiny", {}, 3, 4, 16, 5.0, 0.2)
        return power.PowerReport(*run, [figure], [level], "-", pool_size=12)

    assert power.doubts(report(0.9)) == []  # +11% planted, +20% needed: not expected to be seen
    (doubt,) = power.doubts(report(0.5))  # +100% planted: it should have been
    assert "not called slower" in doubt

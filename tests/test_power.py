"""bench power: the resampling statistics on synthetic data with a known answer, and one tiny
real run end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from engine.config import load_scenario
from harness.analysis import power, power_stats
from harness.analysis.stats import SLOWER, paired_change
from harness.measure.power import PowerPlan, measure
from harness.results import write_power

SIGMA = 0.05  # spread of the per-block log ratio in the synthetic runs


def null_draws(blocks: int, draws: int = 4000, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    pool = rng.normal(0.0, SIGMA, 400)
    return power_stats.resample(pool, blocks, draws, rng)


@pytest.mark.parametrize("blocks", [3, 5, 10])
@pytest.mark.parametrize("higher_is_better", [True, False])
def test_aa_false_positive_rate_is_near_nominal(blocks, higher_is_better):
    rate = power_stats.false_positive_rate(null_draws(blocks), higher_is_better)
    assert 0.02 <= rate <= 0.08  # nominal 5% (a little less: CIs within +-1% say "no change")


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_large_planted_slowdown_is_found(higher_is_better):
    draws = null_draws(5)
    assert power_stats.detection_rate(draws, 0.5, higher_is_better) > 0.99
    assert power_stats.detection_rate(draws, 0.0, higher_is_better) < 0.05


def test_min_detectable_slowdown_matches_theory_and_shrinks_with_blocks():
    found = {n: power_stats.min_detectable_slowdown(null_draws(n), True) for n in (3, 5, 10, 20)}
    # normal theory for 80% power at 95%: (t_.975 + t_.80) * sigma / sqrt(n), in log units
    theory_5 = math.expm1((2.776 + 0.941) * SIGMA / math.sqrt(5))
    assert 0.7 * theory_5 <= found[5] <= 1.3 * theory_5
    assert found[3] > found[5] > found[10] > found[20]
    assert power_stats.detection_rate(null_draws(5), found[5], True) >= power_stats.POWER


def test_small_pool_uses_normal_noise_of_its_spread():
    """Two A/A blocks cannot be resampled (identical blocks half the time): the draws are
    normal with their root mean square, and the false-positive rate stays near nominal."""
    draws = power_stats.resample(np.array([0.04, -0.06]), 5, 4000, np.random.default_rng(3))
    assert draws.std() == pytest.approx(math.sqrt((0.04**2 + 0.06**2) / 2), rel=0.05)
    assert 0.02 <= power_stats.false_positive_rate(draws, True) <= 0.08


def test_undetectable_when_the_noise_swamps_everything():
    huge = power_stats.resample(np.array([-5.0, 5.0]), 2, 500, np.random.default_rng(0))
    assert power_stats.min_detectable_slowdown(huge, True) is None


@pytest.mark.parametrize("higher_is_better", [True, False])
def test_verdicts_are_paired_changes_verdicts(higher_is_better):
    """The vectorised interval is stats.paired_change's, block for block."""
    draws = null_draws(4, draws=40) * 3  # wide enough to mix the verdicts
    slowdown = 0.08
    found = power_stats.verdicts(draws, slowdown, higher_is_better)
    shift = math.log1p(slowdown) * (-1 if higher_is_better else 1)
    for row, verdict in zip(draws, found, strict=True):
        frame = pd.DataFrame(
            [{"letter": "A", "block": k, "value": 100.0} for k in range(len(row))]
            + [
                {"letter": "B", "block": k, "value": 100.0 * math.exp(r + shift)}
                for k, r in enumerate(row)
            ]
        )
        assert paired_change(frame, "A", "B", higher_is_better).verdict == verdict
    assert len(set(found)) > 1


def test_null_pool_centres_planted_runs():
    pool = power_stats.null_pool(
        np.array([0.01, -0.02]), [np.array([0.5, 0.6, 0.7]), np.array([1.0])]
    )
    assert len(pool) == 5  # a planted run of one block has no residual
    residuals = pool[2:]
    assert residuals.mean() == pytest.approx(0.0)
    assert residuals.std(ddof=0) == pytest.approx(np.std([0.5, 0.6, 0.7], ddof=1))


def test_cv_and_expected_ratios():
    assert power_stats.cv([9.0, 11.0]) == pytest.approx(math.sqrt(2) / 10)
    assert power_stats.cv([5.0]) is None
    expected = power.expected_ratios(delay_ms=5.0, iteration_ms=20.0, work_ms=1.0)
    assert expected["output_tok_per_s"] == pytest.approx(0.8)
    assert expected["postprocess work"] == pytest.approx(6.0)


@pytest.mark.slow
def test_tiny_power_run_end_to_end(tmp_path):
    """One A/A block and one planted block (0.2 of an iteration), a few requests per server:
    the planted postprocess delay is found and the report is written. About a minute on an
    idle 2-core machine; much longer while other engines share the cores."""
    load = {"concurrency": 2, "blocks": 1, "requests": 6, "warmup": 1}
    plan = PowerPlan(load_scenario("qwen35", "tiny"), **load, levels=(0.2,), draws=200)
    report = measure(plan, tmp_path / "run", lambda status: None)
    data = json.loads(write_power(report.to_json(), tmp_path).read_text())
    keys = "scenario size machine blocks false_positive_rate created min_detectable_slowdown"
    assert {*keys.split(), "noise", "levels"} <= set(data)
    assert data["size"] == "tiny" and data["blocks"] == 1
    assert report.iteration_ms and report.iteration_ms > 0
    (level,) = report.levels
    assert level.measured["postprocess work"]["verdict"] == SLOWER
    assert level.measured["postprocess work"]["ratio"] > 1.5
    assert set(data["noise"]) == set(power.FIGURES)


def test_a_planted_slowdown_missed_is_a_doubt_only_when_it_should_have_been_seen():
    def report(expected_ratio: float) -> power.PowerReport:
        tok = "output_tok_per_s"
        figure = power.FigurePower(tok, True, 0.05, 0.04, "no change", {3: 0.05}, {3: 0.2})
        change = {"ratio": 0.9, "low": 0.7, "high": 1.1, "verdict": "not enough data"}
        level = power.LevelResult(0.1, 500, "-", {tok: expected_ratio}, {tok: change})
        run = ("qwen35", "tiny", {}, 3, 4, 16, 5.0, 0.2)
        return power.PowerReport(*run, [figure], [level], "-", pool_size=12)

    assert power.doubts(report(0.9)) == []  # +11% planted, +20% needed: not expected to be seen
    (doubt,) = power.doubts(report(0.5))  # +100% planted: it should have been
    assert "not called slower" in doubt

"""benchmarks/stats.py: the benchmarks' one rule for median, p10 and p90 (numpy's default,
linear interpolation between order statistics) pinned on small inputs with known answers."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.stats import Summary, render, summarise


def test_no_samples_give_no_summary():
    assert summarise([]) is None


def test_one_sample_is_its_own_median_and_deciles():
    assert summarise([7.0]) == Summary(7.0, 7.0, 7.0, 1)


def test_two_samples_interpolate_between_them():
    s = summarise([2.0, 1.0])
    assert (s.median, s.n) == (1.5, 2)
    assert (s.p10, s.p90) == (pytest.approx(1.1), pytest.approx(1.9))


def test_the_deciles_interpolate_at_q_times_n_minus_one():
    s = summarise([float(v) for v in range(20, 0, -1)])  # 20..1: h = 0.1 * 19 = 1.9
    assert (s.median, s.p10, s.p90) == (10.5, pytest.approx(2.9), pytest.approx(18.1))
    s = summarise([float(v) for v in range(1, 12)])  # 1..11: h = 1, 5 and 9 land on samples
    assert (s.median, s.p10, s.p90, s.n) == (6.0, 2.0, 10.0, 11)


def test_the_rule_is_the_inclusive_method_of_the_standard_library():
    samples = [0.31, 0.29, 0.35, 0.52, 0.30, 0.33, 0.28, 0.41]
    deciles = statistics.quantiles(samples, n=10, method="inclusive")
    s = summarise(samples)
    assert s.median == pytest.approx(statistics.median(samples))
    assert (s.p10, s.p90) == (pytest.approx(deciles[0]), pytest.approx(deciles[-1]))


def test_render_shows_the_labels_every_benchmark_prints():
    assert render(summarise([1.0, 2.0])) == "median 1.500 ms (p10 1.100, p90 1.900)"
    in_us = render(Summary(12.5, 10.0, 20.25, 3), "us")
    assert in_us == "median 12.500 us (p10 10.000, p90 20.250)"

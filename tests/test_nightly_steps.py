"""bench nightly's step test (harness/analysis/steps.py, docs/NIGHTLY.md "Finding steps"): a
+10% step persisting 3 commits found at a 3% server spread, few false flags, the harness's own
verdict rule, and a step reported on one night only."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from harness.analysis import steps
from harness.analysis.nightly import NightlyResult, find_regressions
from harness.analysis.stats import run_change
from harness.analysis.step_simulation import SeriesNoise, false_flags, found_share, nightly_table
from harness.analysis.verdict import SLOWER
from harness.cli import app
from harness.commands import nightly as command
from harness.show.nightly import render

COMMITS = [f"{i:03d}".ljust(40, "a") for i in range(40)]  # distinct 8-character prefixes


def series(levels, servers: int = 3, spread: float = 0.01, seed: int = 1) -> list[list[float]]:
    """Per-server samples around each commit's level (a cost)."""
    rng = np.random.default_rng(seed)
    return [list(level * np.exp(rng.normal(0, spread, servers))) for level in levels]


def test_a_ten_percent_step_is_found_with_few_false_flags():
    """INVARIANTS 70: at a 3% server spread and 3 servers a commit, a +10% step of a cost (or
    -10% of a throughput) persisting 3 commits is flagged in at least 90% of series, and null
    series flag at most 1 step per 100 commits."""
    noise = SeriesNoise(servers=3, spread=0.03)
    assert found_share(noise, math.log(1.10), draws=1000, seed=1) >= 0.95
    assert found_share(noise, -math.log(0.90), draws=1000, seed=2) >= 0.95
    assert false_flags(noise, series=100, seed=3) <= 1.0
    # one server a commit is not enough
    assert found_share(SeriesNoise(servers=1, spread=0.06), math.log(1.10), 1000, 4) < 0.6


def test_the_table_for_the_simulation_script():
    table = nightly_table(200).splitlines()
    assert table[0].startswith("| servers | server spread |") and len(table) == 2 + 7
    cells = [c.strip() for c in table[4].split("|")[1:-1]]  # 3 servers at 3%
    assert cells[:3] == ["3", "3%", "0%"] and float(cells[3].rstrip("%")) >= 90


def test_a_step_is_found_where_it_is_and_only_upward():
    up = [10.0] * 20 + [11.0] * 8
    (step,) = steps.find_steps(series(up))
    assert step.start <= 20 <= step.end and step.first == 20
    assert step.ratio == pytest.approx(1.10, rel=0.03)
    assert step.tested == tuple(range(step.start - steps.WINDOW, step.start + steps.PERSIST))
    assert steps.find_steps(series([10.0] * 20 + [9.0] * 8)) == []  # an improvement
    spike = [10.0] * 20 + [13.0] + [10.0] * 7  # one noisy night
    assert steps.find_steps(series(spike)) == []
    short = [10.0] * 20 + [11.0] * 2  # not yet persisting 3 commits: not tested yet
    assert steps.find_steps(series(short)) == []


def test_commits_without_samples_are_skipped_and_bad_samples_dropped():
    values = series([10.0] * 20 + [11.0] * 8)
    values[21], values[5] = None, [float("nan"), 0.0, -1.0]
    assert np.isnan(steps.levels(values)[[5, 21]]).all()
    (step,) = steps.find_steps(values)
    assert step.first == 20 and 21 not in step.tested and 5 not in step.tested
    assert steps.levels([[1.0, math.e, math.e**5]])[0] == pytest.approx(1.0)  # median of logs


def test_the_step_test_is_the_harness_interval_of_recorded_runs():
    """A candidate's verdict is stats.run_change's over the commits as runs (each commit one
    replicate, its level the value): the rule of bench compare, not a copy of it."""
    rule = steps.StepRule(min_step=0.0)
    rng = np.random.default_rng(5)
    checked = 0
    for shift in np.linspace(0.0, 0.05, 30):
        before = rng.normal(0, 0.02, 15)
        after = rng.normal(shift, 0.02, 3)
        flagged, _ = steps.step_up(before, after, rule)
        frame = pd.DataFrame({
            "letter": ["A"] * 15 + ["B"] * 3,
            "block": range(18),
            "value": np.exp(np.concatenate([before, after])),
        })  # fmt: skip
        change = run_change(frame, "A", "B", higher_is_better=False, rule=rule.rule)
        if (after > before.mean()).all():
            assert bool(flagged) == (change.verdict == SLOWER)
            checked += 1
        else:
            assert not flagged  # not persisting: each commit must sit above the old level
    assert checked > 10


def test_a_step_smaller_than_its_threshold_is_not_flagged():
    up = series([10.0] * 20 + [10.3] * 8, servers=5, spread=0.002)
    names = {"bench.x": up}
    assert find_regressions(names, COMMITS[:28], {".*": 0.05}) == []
    (found,) = find_regressions(names, COMMITS[:28], {".*": 0.01})
    assert (found.before, found.after) == (COMMITS[19], COMMITS[20])


def test_a_step_fails_one_night_and_is_known_after():
    """INVARIANTS 71: a step is reported (and fails the night) once: the night its test
    could first be made. Every later night lists it as known and exits 0 on it."""
    values = series([10.0] * 20 + [11.0] * 12, seed=9)
    nights = {}
    for tip in range(19, 32):  # one commit measured a night
        commits = COMMITS[: tip + 1]
        found = find_regressions({"bench.x": values[: tip + 1]}, commits, {}, {commits[-1]})
        nights[tip] = [r.known for r in found]
    (reported,) = [tip for tip, known in nights.items() if False in known]
    assert reported in (21, 22)  # once the step (at 20) has held 3 commits, or 2 of them
    assert all(nights[tip] == [] for tip in range(19, reported))
    assert all(nights[tip] == [True] for tip in range(reported + 1, 32))
    first_night = find_regressions({"bench.x": values}, COMMITS[:32], {})
    assert [r.known for r in first_night] == [False]  # nothing recorded before: all new


def result(known: bool) -> NightlyResult:
    (r,) = find_regressions({"bench.x": series([10.0] * 20 + [11.0] * 8)}, COMMITS[:28], {})
    r = r.__class__(**{**r.__dict__, "known": known})
    return NightlyResult("vm", "main", [COMMITS[27]], [], [r], None, COMMITS[:28])


@pytest.mark.parametrize("known, code", [(False, 1), (True, 0)])
def test_only_a_new_regression_fails_the_night(monkeypatch, known, code):
    monkeypatch.setattr(command, "nightly", lambda since, publish, machine, cluster: result(known))
    shown = CliRunner().invoke(app, ["nightly"])
    assert shown.exit_code == code, shown.output
    assert ("1 new regression" in shown.output) != known
    assert ("known" in shown.output) == known
    as_json = CliRunner().invoke(app, ["nightly", "--json"])
    assert f'"new_regressions": {0 if known else 1}' in as_json.output


def test_render_names_the_step_and_its_range():
    console = Console(width=200)
    with console.capture() as captured:
        console.print(render(result(False)))
    text = captured.get()
    assert f"{COMMITS[19][:8]}..{COMMITS[20][:8]}" in text and "+10" in text


def test_a_commit_the_cluster_lost_is_named_and_fails_the_night(monkeypatch):
    """INVARIANTS 85: `bench nightly --cluster` names a lost commit (its node, what became of
    it), leaves it out of the measured ones, and exits 2; each commit's host is shown."""
    node = {"node_id": "n1", "host": "gpu-1", "gpu": "H100", "seconds": 80.0}
    lost = {"commit": COMMITS[27], "node_id": "n2", "host": "gpu-2"}
    lost["error"] = "its node left the cluster; not measured tonight, the next night measures it"
    cluster = {"address": "ray://head:10001", "gpus": 2, "cpus": 32}
    cluster |= {"commits": {COMMITS[26]: node}, "lost": [lost]}
    night = NightlyResult("vm", "main", [COMMITS[26]], [], [], None, COMMITS[:28], cluster)
    monkeypatch.setattr(command, "nightly", lambda since, publish, machine, cluster: night)
    shown = CliRunner().invoke(app, ["nightly", "--cluster", "ray://head:10001"])
    assert shown.exit_code == 2, shown.output
    assert f"{COMMITS[27][:8]} not measured" in shown.output and "gpu-2" in shown.output
    assert "gpu-1 1" in shown.output
    as_json = CliRunner().invoke(app, ["nightly", "--json"])
    assert f'"lost": [\n    "{COMMITS[27]}"' in as_json.output


def test_a_bad_cluster_address_is_one_line_before_anything_runs():
    shown = CliRunner().invoke(app, ["nightly", "--cluster", "nowhere"])
    assert shown.exit_code == 2 and "--cluster 'nowhere': give 'auto'" in shown.output
    assert "Traceback" not in shown.output

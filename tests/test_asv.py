"""The asv suite runs (a broken benchmark fails CI), and the session benchmark tracks the
figures `bench run`'s summary gives for that same session."""

from __future__ import annotations

import json
import time

import pytest

from harness.analysis.nightly import find_regressions, to_measure
from harness.measure import nightly
from harness.measure.arms import git

MACHINE = "ci-quick"


@pytest.mark.slow
def test_asv_quick_run_tracks_the_session_summary(tmp_path):
    started = time.monotonic()
    config = tmp_path / "asv.conf.json"
    conf = nightly.load_config() | {
        "repo": str(nightly.REPO),
        "benchmark_dir": str(nightly.REPO / "benchmarks"),
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
        "env_dir": str(tmp_path / "env"),
    }
    config.write_text(json.dumps(conf))
    env = {"HOME": str(tmp_path), "BENCH_ASV_SESSIONS": str(tmp_path / "sessions")}
    assert nightly.asv("machine", "--yes", f"--machine={MACHINE}", config=config, env=env) == 0
    head = git("rev-parse", "HEAD")
    run = ["run", "--quick", "--python=same", f"--set-commit-hash={head}", f"--machine={MACHINE}"]
    assert nightly.asv(*run, "--show-stderr", config=config, env=env) == 0, "a benchmark failed"

    values = {k: v[0] for k, v in nightly.series(tmp_path / "results", MACHINE, [head]).items()}
    assert values and all(v is not None for v in values.values()), values
    summary = json.loads((tmp_path / "sessions" / "worktree" / "summary.json").read_text())
    figures = {f["figure"]: f["a"] for f in summary["figures"]}
    phases = {p["name"]: p["a_ms"] for p in summary["phases"]}
    messages = {m["name"]: m["a_ms"] for m in summary["messages"]}
    expected = {
        "bench_session.Session.track_ms_per_1k_tokens": 1e6 / figures["output_tok_per_s"],
        "bench_session.Session.track_postprocess_ms_per_iter": phases["postprocess work"],
        "bench_session.Session.track_message_ms_per_request": messages["worker.msg.*"],
        "bench_session.Session.track_ttft_p50_ms": figures["ttft_p50_ms"],
    }
    for name, value in expected.items():
        assert values[name] == pytest.approx(value, rel=1e-9), name
    assert values["bench_session.SchedulerStep.time_schedule(16)"] > 0
    assert time.monotonic() - started < 180


def test_step_detection_flags_an_upward_step_only():
    commits = [f"{i:040x}" for i in range(20)]
    flat = [10.0 + 0.05 * (i % 3) for i in range(20)]
    up = flat[:12] + [v * 1.3 for v in flat[12:]]
    down = flat[:12] + [v / 1.3 for v in flat[12:]]
    found = find_regressions({"up": up, "down": down, "flat": flat}, commits, {})
    assert [(r.benchmark, r.before, r.after) for r in found] == [("up", commits[11], commits[12])]
    assert found[0].ratio == pytest.approx(1.3, rel=0.02)


def test_step_detection_skips_missing_values_and_honours_thresholds():
    commits = [f"{i:040x}" for i in range(10)]
    values = [1.0, None, 1.0, 1.0, 1.0, 1.04, 1.04, None, 1.04, 1.04]
    assert find_regressions({"x": values}, commits, {".*": 0.05}) == []
    (r,) = find_regressions({"x": values}, commits, {".*": 0.01})
    assert (r.before, r.after) == (commits[4], commits[5])


def test_to_measure_takes_new_commits_or_the_range_since():
    commits = ["a", "b", "c", "d"]
    assert to_measure(commits, {"a", "b"}, None) == ["c", "d"]
    assert to_measure(commits, {"a", "b", "c", "d"}, ["d", "c"]) == ["c", "d"]

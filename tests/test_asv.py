"""The asv suite runs (a broken benchmark fails CI), and the session benchmark tracks the
figures `bench run`'s summary gives for that same session."""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import pytest

from benchmarks.bench_runtime import Postprocess
from engine.runtime.postprocess import PostprocessNeed
from harness.analysis.nightly import to_measure
from harness.errors import BenchError
from harness.measure import asv_runs, nightly
from harness.measure.arms import git
from harness.measure.session import SERVERS

MACHINE = "ci-quick"


@pytest.mark.slow
def test_asv_quick_run_tracks_the_session_summary(tmp_path):
    started = time.monotonic()
    config = tmp_path / "asv.conf.json"
    conf = asv_runs.load_config() | {
        "repo": str(asv_runs.REPO),
        "benchmark_dir": str(asv_runs.REPO / "benchmarks"),
        "results_dir": str(tmp_path / "results"),
        "html_dir": str(tmp_path / "html"),
        "env_dir": str(tmp_path / "env"),
    }
    config.write_text(json.dumps(conf))
    env = {"HOME": str(tmp_path), "BENCH_ASV_SESSIONS": str(tmp_path / "sessions")}
    assert asv_runs.asv("machine", "--yes", f"--machine={MACHINE}", config=config, env=env) == 0
    head = git("rev-parse", "HEAD")
    run = ["run", "--quick", "--python=same", f"--set-commit-hash={head}", f"--machine={MACHINE}"]
    run.append("--record-samples")  # as bench nightly records: each server's value kept
    assert asv_runs.asv(*run, "--show-stderr", config=config, env=env) == 0, "a benchmark failed"

    values = {k: v[0] for k, v in nightly.series(tmp_path / "results", MACHINE, [head]).items()}
    assert values and all(v is not None for v in values.values()), values
    session = tmp_path / "sessions" / "worktree"
    samples = json.loads((session / "samples.json").read_text())
    summary = json.loads((session / "summary.json").read_text())
    tok_s = next(f for f in summary["figures"] if f["figure"] == "output_tok_per_s")
    assert samples["ms_per_1k_tokens"] == pytest.approx([1e6 / v for v in tok_s["servers_a"]])
    for figure, per_server in samples.items():
        assert len(per_server) == SERVERS and None not in per_server, figure
        value = values[f"bench_session.Session.track_{figure}"]
        assert value == pytest.approx(statistics.median(per_server), rel=1e-9), figure
    stats = asv_stats(tmp_path / "results", "bench_session.Session.track_ms_per_1k_tokens")
    assert stats["repeat"] == SERVERS and stats["q_25"] <= stats["q_75"]  # the spread is kept
    kept = nightly.samples(tmp_path / "results", MACHINE, [head])
    session_samples = kept["bench_session.Session.track_ms_per_1k_tokens"][0]
    assert sorted(session_samples) == pytest.approx(sorted(samples["ms_per_1k_tokens"]))
    assert values["bench_session.SchedulerStep.time_schedule(16)"] > 0
    assert time.monotonic() - started < 240


def asv_stats(results: Path, benchmark: str) -> dict:
    """The stats asv recorded for one benchmark of the one result file under `results`."""
    from asv.results import iter_results_for_machine

    (result,) = iter_results_for_machine(str(results), MACHINE)
    (stats,) = result.get_result_stats(benchmark, [])
    return stats


def test_begin_resume_times_the_same_path_every_sample():
    """Defect 9: `begin` counts an iteration of every row, so repeated calls walked the rows
    to their caps and, after a few hundred, timed a SEND break instead of the common step.
    Every sample starts from setup's state: one call per sample, setup before each."""
    bench = Postprocess()
    bench.setup(128)
    drifting = [bench.time_begin_resume(128).need for _ in range(600)]
    assert PostprocessNeed.SEND in drifting  # what a sample of many calls would time
    for _ in range(600):
        bench.reset()
        assert bench.time_begin_resume(128).need is PostprocessNeed.DONE
    assert Postprocess.number == 1  # asv runs setup, which resets, before every timed call


def test_to_measure_takes_new_commits_or_the_range_since():
    commits = ["a", "b", "c", "d"]
    assert to_measure(commits, {"a", "b"}, None) == ["c", "d"]
    assert to_measure(commits, {"a", "b", "c", "d"}, ["d", "c"]) == ["c", "d"]


def test_the_session_runs_under_this_checkouts_harness(monkeypatch, tmp_path):
    """Defect 9: the commit's tree came first on asv's path, so each commit's own harness
    measured it. The session runs in a process whose path is this checkout's; only the tree
    it starts servers from is the commit's."""
    import subprocess

    from benchmarks import REPO, bench_session

    seen = {}

    def fake_run(cmd, cwd, env, **kwargs):
        seen.update(cmd=cmd, cwd=cwd, env=env)
        (tmp_path / "samples.json").write_text(json.dumps({"ms_per_1k_tokens": [1.0]}))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("BENCH_TREE", "/somewhere/commit-tree")
    monkeypatch.setattr(bench_session.subprocess, "run", fake_run)
    monkeypatch.setattr(bench_session, "TREE", Path("/somewhere/commit-tree"))
    assert bench_session.run_session(tmp_path) == {"ms_per_1k_tokens": [1.0]}
    assert seen["cmd"][1:3] == ["-m", "harness.measure.session"]
    assert seen["cmd"][seen["cmd"].index("--tree") + 1] == "/somewhere/commit-tree"
    assert seen["cwd"] == REPO and seen["env"]["PYTHONPATH"] == str(REPO)
    assert "BENCH_TREE" not in seen["env"]
    assert bench_session.tracked([3.0, None, 1.0]) == {"samples": [3.0, 1.0], "number": 1}


@pytest.mark.parametrize("body", ['{"commit_hash": "ab', "[1, 2]", '{"version": 2}'])
def test_a_damaged_asv_result_is_one_line_naming_its_file(tmp_path, body):
    """Issue 36: every reader of recorded results refuses a damaged file in one line naming it
    (asv alone warns and drops the commit, so a step would be judged without it)."""
    from asv.machine import Machine

    from harness.measure.nightly import series_commits

    machine = tmp_path / "m"
    machine.mkdir()
    (machine / "machine.json").write_text(
        json.dumps({"machine": "m", "version": Machine.api_version})
    )
    bad = machine / "abc123-existing.json"
    bad.write_text(body)
    with pytest.raises(BenchError, match=f"^{re.escape(str(bad))} is not an asv result"):
        series_commits(tmp_path, "m")

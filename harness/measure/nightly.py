"""`bench nightly`: asv records main's commits not yet measured; analysis/nightly.py finds the
steps in the recorded series (docs/NIGHTLY.md).

asv runs in the existing environment (asv.conf.json: no per-commit virtualenv, no torch
builds), so it does not check commits out itself. For each commit this module makes a
worktree (harness.arms, the worktrees `bench run` uses for a ref arm), points the benchmarks
at it (BENCH_TREE and BENCH_COMMIT, read by benchmarks/__init__.py) and records the results
under the commit's hash (`asv run --python=same --set-commit-hash`).
"""

from __future__ import annotations

import itertools
import os
import platform
import subprocess
import sys
from pathlib import Path

from harness.analysis.nightly import NightlyResult, find_regressions, to_measure
from harness.errors import BenchError
from harness.measure.arms import HARNESS_TREE as REPO
from harness.measure.arms import git, resolve

CONFIG = REPO / "asv.conf.json"


def load_config(path: Path = CONFIG) -> dict:
    """asv.conf.json as asv reads it (comments allowed)."""
    from asv.util import load_json

    return load_json(str(path), js_comments=True)


def asv(*args: str, config: Path = CONFIG, env: dict | None = None) -> int:
    """Run an asv command on `config` from the repository root; its output goes to stderr."""
    cmd = [sys.executable, "-m", "asv", *args, "--config", str(config)]
    environ = {**os.environ, **(env or {})}
    return subprocess.run(cmd, cwd=REPO, env=environ, stdout=sys.stderr).returncode


def record(commit: str, machine: str, config: Path = CONFIG) -> bool:
    """Run the suite on `commit`'s code (a worktree) and save it under the commit's hash."""
    tree = resolve("A", commit[:8], commit).tree
    args = [
        "run",
        "--python=same",
        "--show-stderr",
        f"--set-commit-hash={commit}",
        f"--machine={machine}",
    ]
    env = {"BENCH_TREE": str(tree), "BENCH_COMMIT": commit}
    return asv(*args, config=config, env=env) == 0


def branch_commits(branch: str) -> list[str]:
    """The branch's first-parent history, oldest first."""
    return git("rev-list", "--first-parent", "--reverse", branch, cwd=REPO).split()


def series(results_dir: Path, machine: str, commits: list[str]) -> dict[str, list[float | None]]:
    """Each benchmark's (and each parameter combination's) values in `commits` order."""
    from asv.results import iter_results_for_machine

    position = {commit: i for i, commit in enumerate(commits)}
    out: dict[str, list[float | None]] = {}
    for result in iter_results_for_machine(str(results_dir), machine):
        i = position.get(result.commit_hash)
        if i is None:
            continue
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            values = result.get_result_value(key, params)
            combos = [", ".join(c) for c in itertools.product(*params)] if params else []
            names = [f"{key}({c})" for c in combos] if combos else [key]
            for name, value in zip(names, values, strict=True):
                out.setdefault(name, [None] * len(commits))[i] = value
    return out


def nightly(since: str | None, publish: bool, machine: str | None = None) -> NightlyResult:
    conf = load_config()
    branch = conf["branches"][0]
    machine = machine or platform.node()
    results_dir = REPO / conf["results_dir"]
    if asv("machine", "--yes", f"--machine={machine}") != 0:
        raise BenchError(
            "asv machine failed (see its output above); is asv installed? pip install asv"
        )
    commits = branch_commits(branch)
    measured = set(series_commits(results_dir, machine))
    after = git("rev-list", f"{since}..{branch}", cwd=REPO).split() if since else None
    todo = to_measure(commits, measured, after)
    failed = [commit for commit in todo if not record(commit, machine)]
    found = find_regressions(
        series(results_dir, machine, commits), commits, conf.get("regressions_thresholds", {})
    )
    html = None
    if publish and asv("publish") == 0:
        html = str(REPO / conf["html_dir"] / "index.html")
    return NightlyResult(machine, branch, todo, failed, found, html, commits)


def series_commits(results_dir: Path, machine: str) -> list[str]:
    """Commits with results on `machine`."""
    from asv.results import iter_results_for_machine

    return [r.commit_hash for r in iter_results_for_machine(str(results_dir), machine)]

"""`bench nightly`: asv over main's commits not yet measured, and asv's step detection over the
recorded series (docs/NIGHTLY.md).

asv runs in the existing environment (asv.conf.json: no per-commit virtualenv, no torch
builds), so it does not check commits out itself. For each commit this module makes a
worktree (harness.arms, the worktrees `bench run` uses for a ref arm), points the benchmarks
at it (BENCH_TREE and BENCH_COMMIT, read by benchmarks/__init__.py) and records the results
under the commit's hash (`asv run --python=same --set-commit-hash`). Regressions come from
asv's own step detection (asv.step_detect, as `asv publish` computes them) over each
benchmark's series in main's first-parent order; every tracked figure is a cost, so an
upward step is a regression.
"""

from __future__ import annotations

import itertools
import os
import platform
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.arms import REPO, git, resolve
from harness.errors import BenchError

CONFIG = REPO / "asv.conf.json"
THRESHOLD = 0.05  # relative step asv reports when asv.conf.json sets none for a benchmark


@dataclass(frozen=True)
class Regression:
    benchmark: str
    before: str  # the last commit at the old level
    after: str  # the first commit at the new level (before's child: a one-commit step)
    old: float  # the level before the step
    new: float  # the best value after it

    @property
    def ratio(self) -> float:
        return self.new / self.old if self.old else float("inf")


@dataclass
class NightlyResult:
    machine: str
    branch: str
    measured: list[str]  # commits recorded by this run, oldest first
    failed: list[str]  # of those, commits where asv reported a failed benchmark
    regressions: list[Regression]
    html: str | None = None
    commits: list[str] = field(default_factory=list)  # the branch, oldest first

    @property
    def tip_failed(self) -> bool:
        return bool(self.commits) and self.commits[-1] in self.failed

    def to_json(self) -> dict:
        regressions = [asdict(r) | {"ratio": r.ratio} for r in self.regressions]
        return asdict(self) | {"regressions": regressions, "tip_failed": self.tip_failed}


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
    return git("rev-list", "--first-parent", "--reverse", branch).split()


def to_measure(commits: list[str], measured: set[str], since: list[str] | None) -> list[str]:
    """`since` (the commits after REV) when given, else the commits not yet measured."""
    if since is not None:
        wanted = set(since)
        return [c for c in commits if c in wanted]
    return [c for c in commits if c not in measured]


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


def threshold_for(name: str, thresholds: dict[str, float]) -> float:
    """asv.conf.json's regressions_thresholds: the largest of those whose regex matches."""
    matched = [value for regex, value in thresholds.items() if re.match(regex, name)]
    return max(matched, default=THRESHOLD)


def find_regressions(
    values: dict[str, list[float | None]], commits: list[str], thresholds: dict[str, float]
) -> list[Regression]:
    """Upward steps (every figure is a cost) that asv's step detection keeps."""
    from asv.step_detect import detect_regressions, detect_steps

    found = []
    for name, ys in values.items():
        if sum(y is not None for y in ys) < 2:
            continue
        _, _, jumps = detect_regressions(detect_steps(ys), threshold_for(name, thresholds))
        for before, after, old, new in jumps or []:
            found.append(Regression(name, commits[before], commits[after], old, new))
    return found


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
    after = git("rev-list", f"{since}..{branch}").split() if since else None
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

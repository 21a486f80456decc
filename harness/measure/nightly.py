"""`bench nightly`: asv records main's commits not yet measured; analysis/nightly.py finds the
steps in the recorded per-server samples (docs/NIGHTLY.md).

asv runs in the existing environment (asv.conf.json: no per-commit virtualenv, no torch
builds), so it does not check commits out itself. For each commit this module makes a
worktree (harness.arms, the worktrees `bench run` uses for a ref arm), points the benchmarks
at it (BENCH_TREE and BENCH_COMMIT, read by benchmarks/__init__.py) and records the results
under the commit's hash (`asv run --python=same --set-commit-hash`).
"""

from __future__ import annotations

import itertools
import platform
from pathlib import Path

from harness.analysis.nightly import NightlyResult, find_regressions, to_measure
from harness.errors import BenchError
from harness.measure.arms import HARNESS_TREE as REPO
from harness.measure.arms import git
from harness.measure.asv_runs import CONFIG, asv, load_config, record


def branch_commits(branch: str) -> list[str]:
    """The branch's first-parent history, oldest first."""
    return git("rev-list", "--first-parent", "--reverse", branch, cwd=REPO).split()


def series(results_dir: Path, machine: str, commits: list[str]) -> dict[str, list[float | None]]:
    """Each benchmark's (and each parameter combination's) values in `commits` order."""
    out: dict[str, list[float | None]] = {}
    for i, name, value, _ in _results(results_dir, machine, commits):
        out.setdefault(name, [None] * len(commits))[i] = value
    return out


def samples(
    results_dir: Path, machine: str, commits: list[str]
) -> dict[str, list[list[float] | None]]:
    """Each benchmark's samples per commit in `commits` order: its servers' values (asv's
    samples, kept by `--record-samples`), or the value alone for a result recorded without."""
    out: dict[str, list[list[float] | None]] = {}
    for i, name, value, kept in _results(results_dir, machine, commits):
        found = kept if kept else ([value] if value is not None else None)
        out.setdefault(name, [None] * len(commits))[i] = found
    return out


def machine_results(results_dir: Path, machine: str):
    """asv's result files of `machine`, each loaded; a file asv cannot read (truncated, bit
    flips, a wrong shape) is a BenchError naming it, not a warning that drops its commit (a
    step would then be judged without it) nor a traceback."""
    from asv.results import Results, iter_results_paths

    for root, filename, name in iter_results_paths(str(results_dir / machine)):
        path = Path(root) / filename
        try:
            yield Results.load(str(path), machine_name=name)
        except Exception as exc:  # asv raises UserError, KeyError, TypeError, ValueError...
            raise BenchError(
                f"{path} is not an asv result asv can read ({type(exc).__name__}: {exc});"
                " remove it (its commit is measured again) and rerun"
            ) from None


def _results(results_dir: Path, machine: str, commits: list[str]):
    """(commit position, benchmark name, value, samples) of every recorded result in `commits`."""
    position = {commit: i for i, commit in enumerate(commits)}
    for result in machine_results(results_dir, machine):
        i = position.get(result.commit_hash)
        if i is None:
            continue
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            values = result.get_result_value(key, params)
            kept = result.get_result_samples(key, params) or [None] * len(values)
            combos = [", ".join(c) for c in itertools.product(*params)] if params else []
            names = [f"{key}({c})" for c in combos] if combos else [key]
            for name, value, found in zip(names, values, kept, strict=True):
                yield i, name, value, found


def nightly(
    since: str | None,
    publish: bool,
    machine: str | None = None,
    cluster: str | None = None,
    config: Path = CONFIG,
) -> NightlyResult:
    """Record main's commits not yet measured (or those after `since`) and find the steps.
    With `cluster` (--cluster) each commit is a Ray task (harness/cluster/nightly.py); the
    results directory is written here alone, in commit order, as a local night writes it."""
    joined = _joined(cluster)
    conf = load_config(config)
    branch = conf["branches"][0]
    machine = machine or platform.node()
    results_dir = config.parent / conf["results_dir"]
    if asv("machine", "--yes", f"--machine={machine}", config=config) != 0:
        raise BenchError(
            "asv machine failed (see its output above); is asv installed? pip install asv"
        )
    commits = branch_commits(branch)
    measured = set(series_commits(results_dir, machine))
    after = git("rev-list", f"{since}..{branch}", cwd=REPO).split() if since else None
    todo = to_measure(commits, measured, after)
    section = None
    if joined is None:
        failed = [commit for commit in todo if not record(commit, machine, config)]
    else:
        from harness.cluster.nightly import record_commits

        failed, section = record_commits(todo, conf, config, machine, joined)
    lost = {entry["commit"] for entry in (section or {}).get("lost", [])}
    tonight = [commit for commit in todo if commit not in lost]
    thresholds = conf.get("regressions_thresholds", {})
    kept = samples(results_dir, machine, commits)
    found = find_regressions(kept, commits, thresholds, set(tonight))
    html = None
    if publish and asv("publish", config=config) == 0:
        html = str(config.parent / conf["html_dir"] / "index.html")
    return NightlyResult(machine, branch, tonight, failed, found, html, commits, section)


def _joined(cluster: str | None):
    """The Ray cluster --cluster names, joined before anything is measured (None: here)."""
    if cluster is None:
        return None
    from harness.cluster.connect import connect

    return connect(cluster)


def series_commits(results_dir: Path, machine: str) -> list[str]:
    """Commits with results on `machine`."""
    return [r.commit_hash for r in machine_results(results_dir, machine)]

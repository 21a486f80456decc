"""asv for one commit: its configuration, its command, and the suite recorded on a commit's
code under the commit's hash (`asv run --python=same --set-commit-hash`, the suite pointed at
a worktree of the commit through BENCH_TREE and BENCH_COMMIT, read by benchmarks/__init__.py).
What a local night (nightly.py) and a cluster night's tasks (harness/cluster/nightly.py) both
run; neither imports the other for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from harness.measure.arms import HARNESS_TREE as REPO
from harness.measure.arms import resolve

CONFIG = REPO / "asv.conf.json"
ASV_MAIN = "harness.cluster.asv_main"  # asv with a machine file of its own


def load_config(path: Path = CONFIG) -> dict:
    """asv.conf.json as asv reads it (comments allowed)."""
    from asv.util import load_json

    return load_json(str(path), js_comments=True)


def asv(
    *args: str,
    config: Path = CONFIG,
    env: dict | None = None,
    machine_file: Path | None = None,
    log: TextIO | None = None,
) -> int:
    """Run an asv command on `config` from the repository root; its output goes to stderr (or
    all of it to `log`). `machine_file`: asv's machine file in place of ~/.asv-machine.json (a
    cluster task's own, harness/cluster/asv_main.py)."""
    main = ["-m", "asv"] if machine_file is None else ["-m", ASV_MAIN, str(machine_file)]
    cmd = [sys.executable, *main, *args, "--config", str(config)]
    environ = {**os.environ, **(env or {})}
    out = {"stdout": sys.stderr} if log is None else {"stdout": log, "stderr": subprocess.STDOUT}
    return subprocess.run(cmd, cwd=REPO, env=environ, **out).returncode


def run_args(commit: str, machine: str) -> list[str]:
    """`asv run`'s arguments for one commit: the suite in this environment, each server's
    value kept, saved under the commit's hash."""
    return [
        "run",
        "--python=same",
        "--show-stderr",
        "--record-samples",  # each server's value, for the step test (analysis/steps.py)
        f"--set-commit-hash={commit}",
        f"--machine={machine}",
    ]


def commit_env(commit: str) -> dict[str, str]:
    """What points the suite at `commit`'s code: a worktree of it (made here)."""
    tree = resolve("A", commit[:8], commit).tree
    return {"BENCH_TREE": str(tree), "BENCH_COMMIT": commit}


def record(commit: str, machine: str, config: Path = CONFIG) -> bool:
    """Run the suite on `commit`'s code (a worktree) and save it under the commit's hash."""
    return asv(*run_args(commit, machine), config=config, env=commit_env(commit)) == 0

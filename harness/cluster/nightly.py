"""`bench nightly --cluster`: each commit's `asv run` a Ray task that claims one GPU (one CPU on
a CPU cluster); the commits spread over the cluster's nodes and run at once.

A task runs the command a local night runs for its commit (measure/asv_runs.py: `run_args`, on
the worktree the driver made), on its node, into a results directory of its own and under an
asv machine file of its own that holds the driver's machine entry (asv_main.py), and returns
the files asv wrote with asv's output. The driver alone writes the results directory, in
commit order, so asv's files, the step test and the exit codes are a local night's.

Each commit's node is recorded (the result's `cluster.commits`, and nodes/<machine>.json beside
the results directory): a node is a source of spread between commits (docs/NIGHTLY.md). A
task is never retried: a commit whose worker or node is lost is recorded in `cluster.lost`
(which commit, node, why) and reported as not measured. It has no result file, so the next
night measures it as a new commit; nothing of the lost attempt reaches the series.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import ray

from harness.cluster.connect import Cluster
from harness.cluster.node import fault_block, without_spare
from harness.cluster.tasks import (
    alive_nodes,
    cancel,
    finished,
    interruptions,
    ledger_beside_driver,
    lost_reason,
    tell,
    this_node,
)
from harness.errors import BenchError
from harness.measure.asv_runs import asv, commit_env, run_args

OWN = ("results_dir", "html_dir", "env_dir")  # a task's own, under its temp directory
SHARED = ("repo", "benchmark_dir")  # the driver's, made absolute: the same path on every node


@dataclass
class CommitResult:
    index: int  # the commit's place among the night's
    node: dict  # node_id and the machine (results.machine)
    files: dict[str, str]  # what asv wrote: JSON text by path under its results directory
    log: str  # asv's output
    ok: bool  # asv's exit code was 0 (no benchmark failed)
    seconds: float


@ray.remote(max_retries=0)  # a lost commit is reported as not measured, never rerun unseen
def record_commit(
    index: int, conf: dict, machine: str, entry: dict, env: dict, ledger, fault
) -> CommitResult:
    """The night's commit `index` (`env`: its BENCH_TREE and BENCH_COMMIT) recorded on this
    node; the ledger is told first."""
    started, node = time.monotonic(), this_node()
    tell(ledger.begin.remote(index, uuid.uuid4().hex, node))
    commit = env["BENCH_COMMIT"]
    with tempfile.TemporaryDirectory(prefix=f"bench-nightly-{commit[:8]}-") as tmp:
        tmp = Path(tmp)
        config, machine_file, log = tmp / "asv.conf.json", tmp / "asv-machine.json", tmp / "log"
        config.write_text(json.dumps(conf | {key: str(tmp / key) for key in OWN}))
        machine_file.write_text(json.dumps({machine: entry, "version": 1}))
        with log.open("w") as out:
            args = run_args(commit, machine)
            code = asv(*args, config=config, env=env, machine_file=machine_file, log=out)
        if fault is not None and fault[0] == index:  # the test hook: measured, then lost
            shutil.rmtree(tmp)
            os._exit(1)
        results = tmp / "results_dir"
        files = {str(p.relative_to(results)): p.read_text() for p in results.rglob("*.json")}
        said = log.read_text(errors="replace")
    return CommitResult(index, node, files, said, code == 0, time.monotonic() - started)


def record_commits(
    todo: list[str], conf: dict, config: Path, machine: str, cluster: Cluster
) -> tuple[list[str], dict]:
    """Record `todo` (oldest first) as tasks on `cluster`: the commits asv reported failed
    benchmarks for, and the night's `cluster` section (each commit's node, the lost ones)."""
    from asv.machine import MachineCollection

    entry = MachineCollection.load(machine)  # `asv machine --yes` wrote it on this host
    shared = conf | {key: str((config.parent / conf[key]).resolve()) for key in SHARED}
    envs = [commit_env(commit) for commit in todo]  # worktrees made here, a shared filesystem
    ledger, fault = ledger_beside_driver(), fault_block()
    task = record_commit.options(**cluster.claim)
    args = (shared, machine, entry)
    pending = {task.remote(i, *args, env, ledger, fault): i for i, env in enumerate(envs)}
    _say(f"cluster {cluster.address}: {len(todo)} commits, {cluster.slots} at a time")
    writer = _Writer(config.parent / conf["results_dir"], todo)
    section = cluster.manifest() | {"commits": {}, "lost": []}
    try:
        with interruptions() as stopped:
            for ref, index in finished(pending, stopped):
                commit = todo[index]
                try:
                    result = ray.get(ref)
                except ray.exceptions.RayTaskError as exc:  # a bug in the task, as locally
                    raise exc.cause from None
                except ray.exceptions.RayError as exc:
                    section["lost"] += _lost(commit, ray.get(ledger.of.remote(index)), exc)
                    writer.add(index, None)
                    continue
                seconds = round(result.seconds, 1)
                section["commits"][commit] = without_spare(result.node) | {"seconds": seconds}
                writer.add(index, result)
                _say(f"{commit[:8]} recorded on {result.node.get('host')} in {seconds:.0f} s")
        if stopped["set"]:
            raise BenchError(
                f"interrupted: {len(pending)} commits not measured (the next night measures"
                " them); the finished ones are recorded"
            )
    finally:
        cancel(pending)
        writer.flush()
        nodes = section["commits"]
        section["commits"] = {commit: nodes[commit] for commit in todo if commit in nodes}
        _keep_nodes(config.parent / conf["results_dir"], machine, section)
    return writer.failed, section


def _lost(commit: str, attempts: list[dict], exc: Exception) -> list[dict]:
    """The commit's attempt (one: never retried) as `cluster.lost` records it: its node and
    what became of it."""
    alive, said = alive_nodes(), " ".join(str(exc).split())[:160]
    lost = []
    for node in attempts or [{"node_id": None}]:  # none: lost before it told the ledger
        why = lost_reason(node, alive) if node["node_id"] else "lost as it began"
        error = f"{why}; not measured tonight, the next night measures it ({said})"
        lost.append({"commit": commit, "node_id": node["node_id"], "host": node.get("host")})
        lost[-1]["error"] = error
        _say(f"{commit[:8]} lost on {node.get('host')}: {error}")
    return lost


class _Writer:
    """Finished commits' asv files into the results directory, in commit order (a lost commit
    has none); asv's output after them on stderr, as a local night prints it."""

    def __init__(self, results_dir: Path, todo: list[str]):
        self.results_dir, self.todo = results_dir, todo
        self.next, self.done = 0, {}
        self.failed: list[str] = []

    def add(self, index: int, result: CommitResult | None) -> None:
        self.done[index] = result
        while self.next in self.done:
            self._write(self.next, self.done.pop(self.next))
            self.next += 1

    def flush(self) -> None:
        """Every finished commit not yet written (after an interruption)."""
        for index in sorted(self.done):
            self._write(index, self.done.pop(index))

    def _write(self, index: int, result: CommitResult | None) -> None:
        if result is None:
            return
        sys.stderr.write(result.log)
        for name, text in sorted(result.files.items()):
            path = self.results_dir / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        if not result.ok:
            self.failed.append(self.todo[index])


def nodes_path(results_dir: Path, machine: str) -> Path:
    """Where each commit's node is kept across nights: beside asv's results directory (asv
    would read a file inside it as a result)."""
    return results_dir.parent / "nodes" / f"{machine}.json"


def _keep_nodes(results_dir: Path, machine: str, section: dict) -> None:
    path = nodes_path(results_dir, machine)
    kept = json.loads(path.read_text()) if path.exists() else {"commits": {}, "lost": []}
    kept["commits"] |= section["commits"]
    kept["lost"] += section["lost"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)

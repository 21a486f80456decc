"""A run's schedule on a Ray cluster (`--cluster`): each block a task (node.run_block) that
claims one GPU (a CPU on a CPU cluster) and runs its servers in sequence on that node; the
blocks spread over the cluster's nodes and run at once.

The driver gathers each finished block's rows into the run directory in block order, as a
local run writes them, so reports, compare and `--continue` read a cluster run like any other.
The manifest's `cluster` section names each block's node and attempt, and every lost attempt
(which block, which node, what became of it): a lost attempt's rows never reach the tables,
and its retry is named. An interruption (Ctrl-C, SIGTERM, SIGHUP) cancels the blocks still
running and keeps the finished ones. Statistics: docs/STATISTICS.md ("Blocks on a cluster").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from harness.analysis.summary import Summary
from harness.cluster.connect import Cluster, ray_module
from harness.cluster.node import (
    BlockResult,
    attempt_of,
    fault_block,
    lost_attempts,
    run_block,
    without_spare,
)
from harness.cluster.tasks import (
    alive_nodes,
    cancel,
    finished,
    interruptions,
    ledger_beside_driver,
)
from harness.errors import BenchError
from harness.measure import runner
from harness.measure.runner import RunPlan, Tally
from harness.results import RunDir

LEDGER_WAIT_S = 10.0  # the longest an attempt's ledger message may lag its result


def run_schedule(
    plan: RunPlan, rundir: RunDir, cluster: Cluster, say: Callable[[str], None]
) -> tuple[bool, Summary]:
    """Run the plan's blocks (from `plan.first_block`) as tasks on `cluster`; whether every
    block ran, and the run's summary (`runner.finish`, as a local run ends)."""
    ray = ray_module()
    runner.write_scenarios(plan, rundir)
    ledger = ledger_beside_driver()
    fault = fault_block()
    blocks = range(plan.first_block, len(plan.letters) // plan.block_size)
    task = run_block.options(**cluster.claim)
    pending = {task.remote(plan, block, ledger, fault): block for block in blocks}
    say(f"cluster {cluster.address}: {len(blocks)} blocks, {cluster.slots} at a time")
    gather = _Gather(rundir, cluster, first=plan.first_block)
    try:
        with interruptions() as stopped:
            for ref, block in finished(pending, stopped):
                result = _result(ray, ref, block, ledger, gather)
                if not result.complete and result.error is None:  # its node's Ctrl-C: cut
                    stopped["set"] = True  # a cut block is left out, as a lost one is
                    continue
                alive = alive_nodes()
                for lost in gather.add(result, _attempts(ray, ledger, result), alive):
                    say(
                        f"block {block}: attempt {lost['attempt']} on {lost['host']}: {lost['error']}"
                    )
                if result.error:
                    raise BenchError(f"block {block} on {result.node.get('host')}: {result.error}")
                say(
                    f"block {block} done on {result.node.get('host')}"
                    f" ({result.node.get('gpu') or 'cpu'}) in {result.seconds:.0f} s"
                )
        complete = not pending and not stopped["set"]
    finally:
        cancel(pending)
        gather.flush()
    return complete, runner.finish(rundir, complete, gather.tally)


def _attempts(ray, ledger, result: BlockResult) -> list[dict]:
    """The block's attempts as the ledger holds them, once it holds the result's own (its
    message, sent as the attempt began, may come in after the result)."""
    deadline = time.monotonic() + LEDGER_WAIT_S
    while True:
        attempts = ray.get(ledger.of.remote(result.block))
        if attempt_of(result, attempts) is not None or time.monotonic() > deadline:
            return attempts
        time.sleep(0.05)


def _result(ray, ref, block: int, ledger, gather: _Gather) -> BlockResult:
    """The block's result; a block whose every attempt was lost is recorded and refused."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:  # a bug in the task: a crash, as locally
        raise exc.cause from None
    except ray.exceptions.RayError as exc:
        attempts = ray.get(ledger.of.remote(block))
        said = " ".join(str(exc).split())[:160]
        for number, node in enumerate(attempts, start=1):
            gather.lost.append(
                {"block": block, "attempt": number, "node_id": node["node_id"]}
                | {"host": node.get("host"), "error": said}
            )
        raise BenchError(
            f"block {block} was lost on all {len(attempts)} attempts (the last: {said})"
        ) from None


class _Gather:
    """Finished blocks into the run directory, in block order; the manifest's `cluster`."""

    def __init__(self, rundir: RunDir, cluster: Cluster, first: int):
        self.rundir, self.next = rundir, first
        recorded = rundir.manifest.get("cluster") or {}  # a continued run's earlier calls
        self.section = cluster.manifest() | {"blocks": dict(recorded.get("blocks") or {})}
        self.lost: list[dict] = list(recorded.get("lost") or [])
        self.done: dict[int, BlockResult] = {}
        self.tally = Tally()

    def add(self, result: BlockResult, attempts: list[dict], alive: set[str]) -> list[dict]:
        """Take a finished block; the attempts of it that were lost."""
        lost = lost_attempts(result, attempts, alive)
        self.lost += lost
        entry = without_spare(result.node) | {"attempt": attempt_of(result, attempts)}
        self.section["blocks"][str(result.block)] = entry | {"seconds": round(result.seconds, 1)}
        self.done[result.block] = result
        while self.next in self.done:
            self._append(self.done.pop(self.next))
            self.next += 1
        self._save()
        return lost

    def flush(self) -> None:
        """Every finished block not yet appended (after a gap: a block cut or lost)."""
        for block in sorted(self.done):
            self._append(self.done.pop(block))
        self._save()

    def _append(self, result: BlockResult) -> None:
        for rows in result.slots:
            log = self.rundir.log_path(rows.server.server)
            log.write_text(rows.log)
            server = replace(rows.server, log=str(log))
            self.rundir.append_slot(rows.requests, rows.spans, server, rows.failed, rows.metrics)
        tally, other = self.tally, result.tally
        tally.requests, tally.failed = tally.requests + other.requests, tally.failed + other.failed
        tally.first_error = tally.first_error or other.first_error

    def _save(self) -> None:
        self.rundir.update_manifest(cluster=self.section | {"lost": self.lost})

"""One block on one node: the Ray task `run_block`, and its attempts as the ledger holds them.

The task runs the block through the runner a local run uses (`runner.execute`, on the plan cut
to that block), into a run directory of its own under the node's temp directory: the
scenario files its servers read and their logs, as locally. Its slots' rows are kept, not
written (`NodeRunDir`), and returned whole when the block ends, with the node it ran on; the
driver appends them to the run directory (blocks.py). An attempt that dies (its worker process
or its node lost) returns nothing, so none of its rows can reach the results: Ray runs the
block again from its start (max_retries), and the ledger (tasks.py), an actor beside the
driver, says which attempts began where, so the lost one is recorded and the retry named.
"""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from engine.env import EnvVar
from harness.cluster.tasks import lost_reason, tell, this_node
from harness.errors import BenchError
from harness.measure import runner
from harness.measure.runner import RunPlan, Tally
from harness.results import RunDir

RETRIES = 2  # attempts after the first for a block whose worker or node is lost
FAULT = EnvVar(
    "BENCH_CLUSTER_FAULT",
    "Test only: a block number whose first attempt's worker exits (os._exit) after its first"
    " slot, as a lost node would (bench nightly: a commit's place among the night's, 0 the"
    " oldest, whose worker exits once asv has measured it); read by the driver and handed to"
    " the tasks.",
)


@dataclass
class SlotRows:
    """What `RunDir.append_slot` takes for one slot, as the runner gave it."""

    requests: list
    spans: list
    server: object  # ServerRecord
    failed: str | None
    metrics: list
    log: str  # the server's log, its text


@dataclass
class BlockResult:
    block: int
    token: str  # this attempt's, as the ledger holds it (`attempt_of`)
    node: dict  # node_id and the machine (results.machine)
    slots: list[SlotRows]
    complete: bool
    tally: Tally
    error: str | None = None  # a BenchError that ended the block (a server that cannot start)
    seconds: float = 0.0


class NodeRunDir(RunDir):
    """A block's run directory on its node: the runner writes scenario files and server logs
    into it as into any run directory; each slot's rows are kept for the driver instead."""

    def __init__(self, path: Path, exit_after_first_slot: bool = False):
        super().__init__(path)
        self.slots: list[SlotRows] = []
        self._exit = exit_after_first_slot

    def append_slot(self, requests, spans, server, failed=None, metrics=()) -> None:
        log = Path(server.log).read_text(errors="replace") if Path(server.log).exists() else ""
        self.slots.append(SlotRows(requests, spans, server, failed, list(metrics), log))
        if self._exit:  # the test hook: this attempt's worker dies with a slot measured
            os._exit(1)

    def update_manifest(self, **changes) -> None:
        self.manifest |= changes  # the driver's manifest is the run's


@ray.remote(max_retries=RETRIES)
def run_block(plan: RunPlan, block: int, ledger, fault: tuple[int, str] | None) -> BlockResult:
    """Block `block` of `plan`, whole, on this node; the ledger is told of the attempt first."""
    started, token, node = time.monotonic(), uuid.uuid4().hex, this_node()
    tell(ledger.begin.remote(block, token, node))
    size = plan.block_size
    one = replace(plan, letters=plan.letters[: (block + 1) * size], first_block=block)
    one = replace(one, time_budget_s=None)  # the driver's budget is the run's, not a block's
    error, complete, tally = None, False, Tally()
    with tempfile.TemporaryDirectory(prefix=f"bench-block{block}-") as tmp:
        rundir = NodeRunDir(Path(tmp), exit_after_first_slot=_first_faulty(fault, block))
        try:
            complete, tally = runner.execute(one, rundir, lambda status: None)
        except BenchError as exc:
            error = str(exc)
    seconds = time.monotonic() - started
    return BlockResult(block, token, node, rundir.slots, complete, tally, error, seconds)


def _first_faulty(fault: tuple[int, str] | None, block: int) -> bool:
    """The test hook: whether this is the named block's first attempt (a marker file in the
    node's temp directory, named for the run, says a first attempt began)."""
    if fault is None or fault[0] != block:
        return False
    marker = Path(tempfile.gettempdir()) / f"bench-cluster-fault-{fault[1]}"
    if marker.exists():
        marker.unlink()  # the retry: nothing of the hook is left behind
        return False
    marker.touch()
    return True


def fault_block() -> tuple[int, str] | None:
    """The test hook's block (`FAULT`) with a token for this run, or None."""
    raw = FAULT.raw()
    if raw is None:
        return None
    if not raw.isdigit():
        raise BenchError(f"{FAULT.name} is a block number, not {raw!r}")
    return int(raw), uuid.uuid4().hex


def attempt_of(result: BlockResult, attempts: list[dict]) -> int | None:
    """The result's attempt number (1 for the first) among the block's, once the ledger has
    it (its message may arrive after the result)."""
    tokens = [a["token"] for a in attempts]
    return tokens.index(result.token) + 1 if result.token in tokens else None


def lost_attempts(result: BlockResult, attempts: list[dict], alive: set[str]) -> list[dict]:
    """The attempts of `result`'s block that returned nothing: each with its node and what
    became of it (its node gone, or its worker process died on a live node)."""
    kept = attempt_of(result, attempts)
    lost = []
    for number, node in enumerate(attempts, start=1):
        if number == kept:
            continue
        error = lost_reason(node, alive)
        lost.append(
            {
                "block": result.block,
                "attempt": number,
                "node_id": node["node_id"],
                "host": node.get("host"),
                "error": f"{error}; its rows were discarded, the block rerun as attempt {kept}",
            }
        )
    return lost


def without_spare(node: dict) -> dict:
    """A node as the manifest records it."""
    keep = ("node_id", "host", "gpu", "gpu_ids", "cpu", "cpus")
    return {key: node.get(key) for key in keep}

"""What every unit of work on the cluster shares, a run's block (blocks.py, node.py) as a
nightly's commit (nightly.py): the ledger of attempts, where an attempt runs, the driver's
wait for tasks as they end, its interruptions, and what became of an attempt that returned
nothing.

The ledger is an actor beside the driver. Each attempt tells it, before it starts a server,
where it began (a token, its node); an attempt whose worker or node is lost returns nothing,
so the ledger is what names the node it was lost on."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from harness.results import machine

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the runner's own (stop_flag.StopFlag)
WAIT_S = 0.5  # the longest an interruption waits to be seen


@ray.remote(num_cpus=0)
class Ledger:
    """Every attempt of every unit, as each began: its token and where it ran."""

    def __init__(self):
        self.attempts: dict[int, list[dict]] = {}

    def begin(self, unit: int, token: str, node: dict) -> None:
        self.attempts.setdefault(unit, []).append(node | {"token": token})

    def of(self, unit: int) -> list[dict]:
        return self.attempts.get(unit, [])


def ledger_beside_driver():
    """A Ledger on the driver's node (it outlives any worker node that is lost)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
    return Ledger.options(scheduling_strategy=here).remote()


def this_node() -> dict:
    """Where the calling task runs: its node id, the machine (results.machine), its GPUs."""
    node_id = ray.get_runtime_context().get_node_id()
    return {"node_id": node_id, **machine(), "gpu_ids": ray.get_gpu_ids()}


def tell(ref, wait_s: float = 10.0) -> None:
    """Wait for the ledger's answer by polling: a task blocked in ray.get lends its CPU to
    the next task, which would then run beside this one on the same CPU."""
    deadline = time.monotonic() + wait_s
    while not ray.wait([ref], timeout=0, fetch_local=False)[0] and time.monotonic() < deadline:
        time.sleep(0.005)


def lost_reason(node: dict, alive: set[str]) -> str:
    """What became of an attempt that returned nothing, by whether its node is still alive."""
    if node["node_id"] not in alive:
        return "its node left the cluster"
    return "its worker process died"


def alive_nodes() -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def finished(pending: dict, stopped: dict) -> Iterator[tuple[object, object]]:
    """Each task (its ref and its key in `pending`, removed from it) as it ends, until none is
    left or `stopped` (interruptions()) is set."""
    while pending and not stopped["set"]:
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=WAIT_S)
        if ready:  # else: a signal is seen between waits
            yield ready[0], pending.pop(ready[0])


def cancel(pending: dict) -> None:
    """The tasks still running, cancelled (their servers die with their worker)."""
    for ref in pending:
        ray.cancel(ref, force=True)


@contextmanager
def interruptions():
    """Ctrl-C, SIGTERM or SIGHUP while the tasks run: a flag the wait reads (a handler that
    raised would raise inside Ray's wait); the finished units are kept."""
    flag = {"set": False}

    def stop(*_):
        flag["set"] = True

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield flag
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

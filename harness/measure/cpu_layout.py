"""Which cores each process of a CPU run may use: the worker, the API server, the load generator.

On a CPU the three processes of a slot share the machine's cores, and the kernel's scheduler
moves them between cores as it likes; on 2 cores a worker that the API server or the load
generator displaces loses its step's time, and fresh servers of one code read far apart
(docs/STATISTICS.md, "Noise on a CPU"). A declared layout keeps them apart: on 2 cores the
worker alone on one core, the API server and the load generator on the other; on 3 or more
the API server and the load generator on a core each and the worker on the rest.

The harness pins the API server as it starts it (`ServerProcess(cpus=...)`), names the
worker's cores in BENCH_WORKER_CPUS (engine/env.py: the worker pins itself at its start),
and pins its own process, the load generator, for the slot's load (`pinned`; load shards
inherit it). Only CPU runs are laid out: on a GPU machine the layout is None and nothing is
pinned (its figures come from the GPU, and its 16 host cores are not short).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine import env


@dataclass(frozen=True)
class CpuLayout:
    worker: tuple[int, ...]
    api: tuple[int, ...]
    client: tuple[int, ...]

    def manifest(self) -> dict:
        """The layout as the manifest records it (docs/RESULTS.md, `cpu_layout`)."""
        return {"worker": list(self.worker), "api": list(self.api), "client": list(self.client)}

    def worker_environment(self) -> dict[str, str]:
        """The variable that pins a server's worker to its cores."""
        return {env.WORKER_CPUS.name: env.cpu_list_text(self.worker)}


def cpu_layout(device: str, cpus: set[int] | None = None) -> CpuLayout | None:
    """The layout of a run on `device` over `cpus` (default: the cores this process may use);
    None on a GPU run or with a single core (nothing to keep apart)."""
    if device != "cpu":
        return None
    cores = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    if len(cores) < 2:
        return None
    if len(cores) == 2:
        return CpuLayout(worker=(cores[1],), api=(cores[0],), client=(cores[0],))
    return CpuLayout(worker=tuple(cores[2:]), api=(cores[0],), client=(cores[1],))


class pinned:
    """This process pinned to `cores` inside the block, its own affinity back after it
    (nothing when `cores` is empty or None)."""

    def __init__(self, cores: tuple[int, ...] | None):
        self.cores = set(cores or ())

    def __enter__(self) -> None:
        if self.cores:
            self.saved = os.sched_getaffinity(0)
            os.sched_setaffinity(0, self.cores)

    def __exit__(self, *exc) -> None:
        if self.cores:
            os.sched_setaffinity(0, self.saved)

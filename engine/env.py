"""Environment variables the engine reads: declared once here, typed, prefixed BENCH_.

A bad value fails loudly at startup, never silently falls back to a default.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


class EnvError(ValueError):
    pass


@dataclass(frozen=True)
class EnvVar:
    name: str
    doc: str

    def raw(self) -> str | None:
        value = os.environ.get(self.name)
        return value if value not in (None, "") else None


PHASE_TIMING = EnvVar(
    "BENCH_PHASE_TIMING",
    "Phase timing period in worker iterations (a positive integer); unset or 0: timing off.",
)
SPAN_ADDR = EnvVar(
    "BENCH_SPAN_ADDR",
    "ZMQ address the worker PUBlishes span records on (e.g. tcp://127.0.0.1:5600).",
)
SPAN_FILE = EnvVar("BENCH_SPAN_FILE", "A JSONL file the worker appends span records to.")
WORKER_TEMPLATE = EnvVar(
    "BENCH_WORKER_TEMPLATE",
    "The socket of a worker template (engine/worker/template.py) that forks a server's worker "
    "in place of a fresh interpreter: set by the test suite, never by `bench run`.",
)


def timing_environment(
    period: int, span_addr: str | None = None, span_file: str | None = None
) -> dict[str, str]:
    """The variables that give a server's worker phase timing at `period` (0: off), publishing
    to `span_addr` and/or appending to `span_file`: what the harness sets for each server."""
    variables = {PHASE_TIMING.name: str(period)} if period else {}
    if span_addr:
        variables[SPAN_ADDR.name] = span_addr
    if span_file:
        variables[SPAN_FILE.name] = span_file
    return variables


def phase_timing_period() -> int:
    raw = PHASE_TIMING.raw()
    if raw is None:
        return 0
    try:
        period = int(raw)
    except ValueError:
        raise EnvError(
            f"{PHASE_TIMING.name}={raw!r}: expected a whole number of iterations"
        ) from None
    if period < 0:
        raise EnvError(f"{PHASE_TIMING.name}={raw!r}: must not be negative")
    return period


FLASHINFER_PREBUILT = EnvVar(
    "BENCH_FLASHINFER_PREBUILT",
    "1: load a FlashInfer JIT module's .so already in its cache directory as it is, without "
    "ninja (engine/kernels/flashinfer_import.py); unset or 0: FlashInfer's own rule.",
)


def flashinfer_prebuilt() -> bool:
    raw = FLASHINFER_PREBUILT.raw()
    if raw not in (None, "0", "1"):
        raise EnvError(f"{FLASHINFER_PREBUILT.name}={raw!r}: expected 0 or 1")
    return raw == "1"


WORKER_CPUS = EnvVar(
    "BENCH_WORKER_CPUS",
    "Cores the worker pins itself to at its start (a comma list, e.g. 1 or 2,3): set by the "
    "harness on a CPU run (harness/measure/cpu_layout.py); unset: the cores it inherits.",
)


def cpu_list_text(cores) -> str:
    return ",".join(str(c) for c in sorted(cores))


def worker_cpus() -> set[int] | None:
    """The cores BENCH_WORKER_CPUS names (None: unset); a bad list, or a core this machine
    does not have, fails loudly."""
    raw = WORKER_CPUS.raw()
    if raw is None:
        return None
    try:
        cores = {int(part) for part in raw.split(",")}
    except ValueError:
        raise EnvError(
            f"{WORKER_CPUS.name}={raw!r}: expected a comma list of core numbers"
        ) from None
    available = set(range(os.cpu_count() or 1))
    if not cores <= available:
        raise EnvError(f"{WORKER_CPUS.name}={raw!r}: this machine's cores are {sorted(available)}")
    return cores

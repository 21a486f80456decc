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
SERVER_ID = EnvVar("BENCH_SERVER_ID", "Label of this server in span records (default: its port).")

ALL = (PHASE_TIMING, SPAN_ADDR, SPAN_FILE, SERVER_ID)


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

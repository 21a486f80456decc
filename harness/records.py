"""Raw facts the harness records: one row per request, one row per span window, one per server.

These are the tidy tables written to `results/<run-id>/*.parquet` (schema in docs/RESULTS.md).
Nothing here computes a metric; analysis.py does, from these rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SCHEMA_VERSION = 1


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds on the client's monotonic clock,
    relative to the slot's load start (`ServerRecord.t0_unix` anchors them to wall time)."""

    arm: str
    block: int
    slot: int
    index: int  # position in the scenario's request sequence (same across arms)
    warmup: bool
    prompt_tokens: int
    max_tokens: int
    intended_send_s: float  # when the closed loop wanted to send it (a slot became free)
    send_s: float  # when the request was actually written
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    token_times_s: list[float] = field(default_factory=list)  # arrival of each output token
    status: int = 0  # HTTP status; 0 when no response arrived
    error: str | None = None
    finish_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200


@dataclass
class SpanRecord:
    """One span (or count) window emitted by a worker every `period` iterations."""

    arm: str
    block: int
    slot: int
    server: str
    name: str
    kind: str  # "span" (values in ns) or "count"
    first_iter: int
    last_iter: int
    iterations: int
    mean_batch: float
    n: int
    sum: float
    p50: float
    p95: float
    max: float
    start_unix: float = 0.0  # wall time the window opened
    end_unix: float = 0.0  # wall time it was emitted


@dataclass
class ServerRecord:
    """One slot of the schedule: a fresh server process and the load driven against it."""

    arm: str
    block: int
    slot: int
    letter: str  # A or B
    port: int
    log: str
    t0_unix: float  # wall time of the load's start (time zero of its request records)
    start_unix: float
    stop_unix: float | None = None
    exit_code: int | None = None
    healthy: bool = False
    requests: int = 0
    failures: int = 0
    steady_start_s: float | None = None
    steady_end_s: float | None = None
    error: str | None = None

"""The results schema: the raw facts a run records, one row per request, per span window and
per server, written to `results/<run-id>/*.parquet` (docs/RESULTS.md).

Every row carries where it was recorded from the moment it is recorded: the arm's name and
schedule letter, the server and its block and slot (`Slot`). Nothing here computes a
metric; metrics.py and phases.py do, from these rows.

Version 2 added `letter` and `server` to requests, `letter` to spans and `server` to
servers. A version-1 directory is read by giving its rows those columns from its servers
table (`from_version_1`). Version 3 added `audio_times_s` and `audio_bytes` to requests (a
speech reply's PCM as it arrived); older requests get them empty (`upgrade`). Version 4 added
the servers' interference columns (what ran beside each server during its steady window:
measure/interference.py); older servers get them missing (NaN, `upgrade`). Version 5 added
metrics.parquet (`MetricRecord`: the server's /metrics at its steady window's edges); an older
directory has none, read as an empty table.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pandas as pd

SCHEMA_VERSION = 5
LETTERS = ("A", "B")
SERVER_KEY = ["letter", "block", "slot"]  # one server: the unit analysis groups by


@dataclass(frozen=True)
class Slot:
    """Where a row was recorded: one slot of the schedule, a fresh server of one arm."""

    arm: str  # the arm's name, as the user gave it
    letter: str  # A or B: the arm's place in the comparison
    server: str  # the server's id, <letter><slot>; its log is logs/<server>.log
    block: int
    slot: int


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds on the client's monotonic clock,
    relative to the slot's load start (`ServerRecord.t0_unix` anchors them to wall time)."""

    arm: str
    letter: str
    server: str
    block: int
    slot: int
    index: int  # position in the scenario's request sequence (same across arms)
    warmup: bool
    prompt_tokens: int
    max_tokens: int
    intended_send_s: float  # when it was due: its lane free (closed loop), its arrival (open)
    send_s: float  # when the request was actually written
    first_token_s: float | None = None
    end_s: float | None = None
    output_tokens: int = 0
    token_times_s: list[float] = field(default_factory=list)  # arrival of each output token
    status: int = 0  # HTTP status; 0 when no response arrived
    error: str | None = None
    finish_reason: str | None = None
    # A speech reply (raw PCM): the arrival of each piece of the body and its bytes. Its first
    # piece's arrival is also first_token_s (the first output); it has no tokens.
    audio_times_s: list[float] = field(default_factory=list)
    audio_bytes: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200


@dataclass
class SpanRecord:
    """One span (or count) window a worker emitted every `period` iterations, with its slot's
    columns: the wire's SpanWindowRecord (engine/spans.py) as stored. Declared here rather
    than derived, so the results schema changes only with its version."""

    arm: str
    letter: str
    server: str
    block: int
    slot: int
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
    letter: str
    server: str
    block: int
    slot: int
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
    # What ran beside the server during its steady window (measure/interference.py); None:
    # not measured (no window, no /proc, no nvidia-smi, a local URL arm's server not found).
    sampled_s: float | None = None  # the seconds the samples bracketing the window span
    machine_cpus: int | None = None
    run_cpu_cores: float | None = None  # the run's own processes' CPU-seconds per second
    outside_cpu_cores: float | None = None  # every other process's, on this machine
    outside_cpu_share: float | None = None  # outside_cpu_cores / machine_cpus
    gpu_sm_clock_min_mhz: float | None = None
    gpu_sm_clock_mean_mhz: float | None = None
    gpu_other_processes: int | None = None  # compute processes on the GPU not the run's
    gpu_other_pids: str | None = None  # their pids, comma-separated ("" for none)


INTERFERENCE = (  # the servers' columns version 4 added
    "sampled_s",
    "machine_cpus",
    "run_cpu_cores",
    "outside_cpu_cores",
    "outside_cpu_share",
    "gpu_sm_clock_min_mhz",
    "gpu_sm_clock_mean_mhz",
    "gpu_other_processes",
    "gpu_other_pids",
)


@dataclass
class MetricRecord:
    """One sample of the server's /metrics (Prometheus text) scraped as its steady window
    opened and as it closed (measure/scrape.py), with its slot's columns."""

    arm: str
    letter: str
    server: str
    block: int
    slot: int
    name: str  # the sample's name, e.g. engine:generation_tokens_total, ..._bucket
    labels: str  # its labels, `k=v` sorted and comma-separated ("" for none)
    kind: str  # its family's type: counter, gauge, histogram, summary, ...
    start: float | None  # at the window's start (None: a gauge the first scrape lacked)
    end: float
    delta: float | None  # end - start for a counter's or histogram's samples; None: a gauge
    start_s: float  # when each scrape was taken, on the request clock (docs/RESULTS.md)
    end_s: float


# In the order a slot's rows are written: the servers table last, so that a slot whose server
# row is on disk has every other row of it there too (a write that fails leaves the slot out).
TABLES = {
    "requests": RequestRecord,
    "spans": SpanRecord,
    "metrics": MetricRecord,
    "servers": ServerRecord,
}
REQUIRED = ("requests", "spans", "servers")  # the tables every version has


def columns(table: str) -> list[str]:
    return [f.name for f in fields(TABLES[table])]


def empty(table: str) -> pd.DataFrame:
    """A table with no rows and every column."""
    return pd.DataFrame({name: pd.Series(dtype=object) for name in columns(table)})


def upgrade(frames: dict[str, pd.DataFrame], version: int) -> dict[str, pd.DataFrame]:
    """The tables of a run directory of an older schema version as this version's."""
    if version == 1:
        frames = from_version_1(frames)
    requests, servers = frames["requests"], frames["servers"]
    for column in ("audio_times_s", "audio_bytes"):
        if column not in requests:
            requests = requests.assign(**{column: [[] for _ in range(len(requests))]})
    servers = servers.assign(**{c: float("nan") for c in INTERFERENCE if c not in servers})
    return {
        **frames,
        "requests": requests[columns("requests")],
        "servers": servers[columns("servers")],
        "metrics": frames.get("metrics", empty("metrics")),  # none before version 5
    }


def from_version_1(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Version-1 tables as version 2: servers get their id (<letter><slot>, as the runner
    named them), request rows their server's letter and id, span rows its letter (they name
    their worker's server already)."""
    servers = frames["servers"]
    servers = servers.assign(server=servers["letter"] + servers["slot"].astype(str))
    ids = servers[["block", "slot", "letter", "server"]]
    out = {"servers": servers[[c for c in columns("servers") if c in servers]]}
    for name, keys in (("requests", ids), ("spans", ids.drop(columns="server"))):
        frame = frames[name]
        if frame.empty:
            out[name] = empty(name)
            continue
        merged = frame.merge(keys, on=["block", "slot"], how="left")
        out[name] = merged[[c for c in columns(name) if c in merged]]
    return out

"""The schedule: for each slot, a fresh server, warmup, closed-loop load, drain, stop.

Runs the slots in A B B A order (x blocks), collects every slot's request records and span
records into the run directory as it goes, and stops cleanly on Ctrl-C: the server is
stopped, what was measured is written, and the manifest says the run is incomplete.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from engine import env
from engine.config import Scenario
from harness.arms import Arm
from harness.errors import BenchError
from harness.loadgen import Labels, Progress, RequestSpec, run_closed_loop, run_loop
from harness.records import ServerRecord
from harness.results import RunDir
from harness.server import ServerProcess
from harness.spans import SpanCollector

# How long a stopped server's end-of-spans message may take to arrive. A clean stop sends it
# before the worker exits, so it is in at once; only a crashed worker, or an engine revision
# older than the message, makes the collector wait this long.
LAST_WINDOW_WAIT_S = 2.0


@dataclass(frozen=True)
class RunPlan:
    scenario: Scenario
    arms: dict[str, Arm]  # letter -> arm
    letters: list[str]  # the schedule, e.g. A B B A A B B A
    block_size: int  # letters per block (4 with --abba, else 2)
    concurrency: int
    requests: Sequence[RequestSpec]
    warmup: int
    period: int
    duration_s: float | None = None
    health_timeout_s: float = 300.0
    shards: int = 1


@dataclass
class SlotStatus:
    slot: int
    slots: int
    letter: str
    arm: str
    phase: str  # "starting" | "load" | "stopping"
    progress: Progress | None = None


class Interrupted(Exception):
    pass


def execute(plan: RunPlan, rundir: RunDir, show: Callable[[SlotStatus], None]) -> bool:
    """Run every slot; True when the whole schedule ran."""
    collector = SpanCollector()
    stop = _StopFlag()
    try:
        with stop.installed():
            for slot, letter in enumerate(plan.letters):
                if stop.set or not _run_slot(plan, rundir, collector, slot, letter, show, stop):
                    return False
        return True
    except Interrupted:
        return False
    finally:
        collector.close()


def _run_slot(plan, rundir, collector, slot, letter, show, stop) -> bool:
    arm = plan.arms[letter]
    block = slot // plan.block_size
    server_id = f"{letter}{slot}"
    status = SlotStatus(slot, len(plan.letters), letter, arm.name, "starting")
    show(status)
    record = ServerRecord(
        arm=arm.name,
        block=block,
        slot=slot,
        letter=letter,
        port=0,
        log=str(rundir.log_path(server_id)),
        t0_unix=0.0,
        start_unix=time.time(),
    )
    server = None
    records, spans = [], []
    try:
        if arm.kind == "url":
            url, model = arm.url, served_model(arm.url)
            record.healthy = True
        else:
            server = ServerProcess(
                plan.scenario.name,
                size=plan.scenario.size,
                overrides=",".join(f"{k}={v}" for k, v in arm.overrides.items()) or None,
                cwd=arm.tree,
                log_path=rundir.log_path(server_id),
                server_id=server_id,
                env=env.timing_environment(plan.period, span_addr=collector.address),
            )
            record.port = server.port
            server.start()
            stop.server = server
            server.wait_healthy(plan.health_timeout_s)
            record.healthy = True
            url, model = server.url, plan.scenario.name
        status.phase = "load"
        result = _drive(plan, url, model, arm.name, block, slot, status, show, stop)
        records = result.records
        record.t0_unix = result.t0_unix
        record.steady_start_s, record.steady_end_s = result.steady_start_s, result.steady_end_s
        record.requests = sum(not r.warmup for r in records)
        record.failures = sum(not r.ok for r in records if not r.warmup)
        if result.interrupted:
            record.error = "interrupted"
    except BenchError as exc:
        record.error = str(exc)
        raise
    finally:
        status.phase = "stopping"
        show(status)
        if server is not None:
            record.exit_code = server.stop()
            stop.server = None
            wait_s = LAST_WINDOW_WAIT_S if record.healthy else 0.0
            spans = collector.take(server_id, arm.name, block, slot, wait_s)
        record.stop_unix = time.time()
        rundir.append_slot(records, spans, record)
    return record.error is None


def _drive(plan, url, model, arm, block, slot, status, show, stop):
    def on_progress(progress: Progress) -> None:
        status.progress = progress
        show(status)

    async def load():
        event = asyncio.Event()
        stop.bind(asyncio.get_running_loop(), event)
        try:
            return await run_closed_loop(
                url, plan.requests, plan.concurrency, plan.warmup, Labels(arm, block, slot),
                on_progress, event, model=model, shards=plan.shards, send_for_s=plan.duration_s,
            )  # fmt: skip
        finally:
            stop.bind(None, None)

    return run_loop(load())


def served_model(url: str) -> str | None:
    """The first model an external OpenAI-compatible server lists (None if it lists none)."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
            data = json.loads(resp.read()).get("data") or []
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot reach {url}/v1/models ({exc}); is the server up?") from None
    return data[0]["id"] if data else None


class _StopFlag:
    """Ctrl-C: the first sets the flag (and stops the load in progress); the run winds down."""

    def __init__(self):
        self.set = False
        self.server: ServerProcess | None = None
        self._loop = None
        self._event = None

    def bind(self, loop, event) -> None:
        self._loop, self._event = loop, event
        if self.set and event is not None:
            event.set()

    def _handler(self, *_):
        self.set = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)
        elif self.server is not None:
            raise Interrupted()

    def installed(self):
        flag = self

        class _Ctx:
            def __enter__(self):
                self.prev = signal.signal(signal.SIGINT, flag._handler)
                self.prev_term = signal.signal(signal.SIGTERM, flag._handler)

            def __exit__(self, *_):
                signal.signal(signal.SIGINT, self.prev)
                signal.signal(signal.SIGTERM, self.prev_term)

        return _Ctx()

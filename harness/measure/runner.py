"""The schedule: for each slot, a fresh server, warmup, closed-loop load, drain, stop.

Runs the slots in A B B A order (x blocks), collects every slot's request records and span
records into the run directory as it goes, and stops cleanly on Ctrl-C: the server is
stopped, what was measured is written, and the manifest says the run is incomplete. Every
row is stamped with its slot (arm, letter, server, block, slot) as it is recorded; when the
schedule ends the run is summarised, once (`run_schedule`).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from engine import env
from engine.config import Scenario
from harness.analysis.compare import Comparison
from harness.analysis.schema import ServerRecord, Slot
from harness.errors import BenchError
from harness.measure.arms import Arm
from harness.measure.event_loop import run_loop
from harness.measure.lanes import Progress
from harness.measure.loadgen import run_closed_loop
from harness.measure.request_sequence import RequestSpec
from harness.measure.server import ServerProcess, served_model
from harness.measure.spans import SpanCollector
from harness.results import RunDir, machine, summarise

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

    def manifest(self, run_id: str, command: str, measured: int, arms: list[dict]) -> dict:
        """manifest.json of the run (docs/RESULTS.md); `complete` until the schedule ends."""
        aa_check = self.arms["A"].same_code_as(self.arms["B"]) if "B" in self.arms else False
        return {
            "run_id": run_id,
            "command": command,
            "scenario": self.scenario.to_dict(),
            "arms": arms,
            "aa_check": aa_check,
            "schedule": self.letters,
            "concurrency": self.concurrency,
            "requests": measured,
            "duration_s": self.duration_s,
            "warmup": self.warmup,
            "period": self.period,
            "machine": machine(),
            "complete": False,
        }


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


def run_schedule(
    plan: RunPlan, rundir: RunDir, show: Callable[[SlotStatus], None]
) -> tuple[bool, Comparison]:
    """Run every slot, say in the manifest whether the schedule finished, and summarise the
    run (summary.json). A BenchError (a server that cannot start) leaves it unsummarised."""
    complete = execute(plan, rundir, show)
    rundir.update_manifest(complete=complete)
    return complete, summarise(rundir.path)


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


def _run_slot(plan, rundir, collector, number, letter, show, stop) -> bool:
    arm = plan.arms[letter]
    slot = Slot(arm.name, letter, f"{letter}{number}", number // plan.block_size, number)
    status = SlotStatus(number, len(plan.letters), letter, arm.name, "starting")
    show(status)
    log = rundir.log_path(slot.server)
    record = ServerRecord(**asdict(slot), port=0, log=str(log), t0_unix=0.0, start_unix=time.time())
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
                log_path=log,
                server_id=slot.server,
                env=env.timing_environment(plan.period, span_addr=collector.address),
            )
            record.port = server.port
            server.start()
            stop.server = server
            server.wait_healthy(plan.health_timeout_s)
            record.healthy = True
            url, model = server.url, plan.scenario.name
        status.phase = "load"
        result = _drive(plan, url, model, slot, status, show, stop)
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
            spans = collector.take(slot, wait_s)
        record.stop_unix = time.time()
        rundir.append_slot(records, spans, record)
    return record.error is None


def _drive(plan, url, model, slot, status, show, stop):
    def on_progress(progress: Progress) -> None:
        status.progress = progress
        show(status)

    async def load():
        event = asyncio.Event()
        stop.bind(asyncio.get_running_loop(), event)
        try:
            return await run_closed_loop(
                url,
                plan.requests,
                plan.concurrency,
                plan.warmup,
                slot,
                on_progress,
                event,
                model=model,
                shards=plan.shards,
                send_for_s=plan.duration_s,
                api=plan.scenario.load.api,
            )
        finally:
            stop.bind(None, None)

    return run_loop(load())


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

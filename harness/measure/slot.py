"""One slot of the schedule (`run_slot`): its server started (or the URL arm's found), warmed
up and loaded (closed or open loop) with the load watched, stopped, and its rows (requests,
spans, the server's record, /metrics samples) stamped with the slot and appended to the run
directory, whatever happened; `SlotStatus` is what the progress display is shown of it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass

from engine import env
from harness.analysis.schema import ServerRecord, Slot
from harness.errors import BenchError
from harness.measure.cpu_layout import pinned
from harness.measure.event_loop import run_loop
from harness.measure.interference import Sampler
from harness.measure.lanes import Progress
from harness.measure.loadgen import run_load
from harness.measure.run_plan import RunPlan, SlotLoad
from harness.measure.scrape import SteadyScrape
from harness.measure.server import ServerProcess, served_model
from harness.measure.spans import SpanCollector
from harness.measure.stop_flag import Interrupted
from harness.measure.watch import Watch

# How long a stopped server's end-of-spans message may take to arrive. A clean stop sends it
# before the worker exits, so it is in at once; only a crashed worker, or an engine revision
# older than the message, makes the collector wait this long.
LAST_WINDOW_WAIT_S = 2.0


@dataclass
class SlotStatus:
    """A slot as the progress display is shown it, at each change of phase and load tick."""

    slot: int
    slots: int
    letter: str
    arm: str
    phase: str  # "starting" | "load" | "stopping"
    progress: Progress | None = None


def run_slot(plan, rundir, collector, number, letter, show, stop, tally, layout=None):
    """One slot; its server's record and its requests'. `layout`: a CPU run's cores
    (cpu_layout.py): the API server, its worker and this process's load pinned to them."""
    arm = plan.arms[letter]
    slot = Slot(arm.name, letter, f"{letter}{number}", number // plan.block_size, number)
    status = SlotStatus(number, len(plan.letters), letter, arm.name, "starting")
    show(status)
    log = rundir.log_path(slot.server)
    record = ServerRecord(**asdict(slot), port=0, log=str(log), t0_unix=0.0, start_unix=time.time())
    server = fault = None
    records, spans, metrics = [], [], []
    try:
        if arm.kind == "url":
            url, model = arm.url, served_model(arm.url, plan.headers)
            record.healthy = True
        else:
            server = ServerProcess(  # absolute: the server runs in the arm's tree, not here
                str(rundir.scenario_path(letter).absolute()),
                size=plan.scenario.size,
                cwd=arm.tree,
                log_path=log,
                server_id=slot.server,
                env=server_timing(plan, letter, collector)
                | (layout.worker_environment() if layout else {}),
                cpus=layout.api if layout else None,
            )
            record.port = server.port
            server.start()
            stop.server = server
            server.wait_healthy(plan.health_timeout_s)
            record.healthy = True
            url, model = server.url, plan.scenario.name
        status.phase = "load"
        watch = Watch(server, plan.stall_s)
        shape = plan.load(number)
        scrape = SteadyScrape(
            url, shape, plan.warmup, len(plan.requests), plan.duration_s, plan.headers
        )
        seen = scrape.watching(show)
        with Sampler(local_url=url if server is None else None) as beside:
            with pinned(layout.client if layout else None):
                result = _drive(plan, shape, url, model, slot, status, seen, stop, watch)
        metrics = scrape.rows(slot, result.t0_perf)
        records = result.records
        record.t0_unix = result.t0_unix
        record.steady_start_s, record.steady_end_s = result.steady_start_s, result.steady_end_s
        beside.steady(result).stamp(record)
        record.requests = sum(not r.warmup for r in records)
        record.failures = sum(not r.ok for r in records if not r.warmup)
        if result.interrupted and not watch.server_failed:
            record.error = "interrupted"
        else:
            record.error = fault = watch.fault(records)
        if not watch.server_failed:  # a dead or stalled server's failures say nothing more
            tally.add(records)
    except BenchError as exc:
        record.error = str(exc)
        raise
    except Interrupted:
        record.error = "interrupted"
        raise
    finally:
        status.phase = "stopping"
        show(status)
        if server is not None:
            record.exit_code = server.stop()
            stop.server = None
            wait_s = LAST_WINDOW_WAIT_S if record.healthy and fault is None else 0.0
            spans = collector.take(slot, wait_s)
        record.stop_unix = time.time()
        rundir.append_slot(records, spans, record, failed=fault, metrics=metrics)
    return record, records


def server_timing(plan: RunPlan, letter: str, collector: SpanCollector) -> dict[str, str]:
    """The phase-timing variables of a server: off for an untimed arm (timing on against off
    is then a comparison of its own: scripts/timing_cost.py)."""
    if letter in plan.untimed:
        return env.timing_environment(0)
    return env.timing_environment(plan.period, span_addr=collector.address)


def _drive(plan, shape: SlotLoad, url, model, slot, status, show, stop, watch):
    async def load():
        event = asyncio.Event()

        def on_progress(progress: Progress) -> None:
            status.progress = progress
            show(status)
            if watch.check(progress):
                event.set()

        stop.bind(asyncio.get_running_loop(), event)
        try:
            return await run_load(
                url,
                plan.requests,
                shape.concurrency,
                plan.warmup,
                slot,
                on_progress,
                event,
                model=model,
                shards=plan.shards,
                clients=plan.clients,
                send_for_s=plan.duration_s,
                arrivals=shape.arrivals,
                headers=plan.headers,
                api=plan.api,
            )
        finally:
            stop.bind(None, None)

    return run_loop(load())

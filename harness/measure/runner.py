"""The schedule: for each slot, a fresh server (or a running one at a URL), warmup, load
(closed or open loop), drain, stop.

Runs the slots block by block, alternating the order (A B B A then B A A B, or A B then
B A: analysis.block_model.schedule), collects every slot's request records and span records into
the run directory as it goes, and stops cleanly on Ctrl-C, SIGTERM or SIGHUP: the server is
stopped, what was measured is written, and the manifest says the run is incomplete. Every
row is stamped with its slot (arm, letter, server, block, slot) as it is recorded; when the
schedule ends the run is summarised, once (`run_schedule`).

Every server runs its arm's scenario file in the run directory (scenarios/<letter>.yaml): the
scenario the manifest records, with the arm's overrides. A server that dies or stalls under
load fails its slot, and so does a load most of whose requests failed: the slot is recorded
with what happened (when, the exit code, the last line of the server's log), the manifest
names it in `failed_servers`, which keeps it out of the comparison, and the schedule goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import msgspec

from engine import env
from harness.analysis.schema import RequestRecord, ServerRecord, Slot
from harness.analysis.summary import Summary
from harness.analysis.verdict import Rule
from harness.errors import BenchError
from harness.measure.arms import Arm
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.cpu_layout import CpuLayout, cpu_layout, pinned
from harness.measure.event_loop import run_loop
from harness.measure.interference import Sampler
from harness.measure.lanes import Progress
from harness.measure.loadgen import run_load
from harness.measure.request_sequence import RequestSpec
from harness.measure.scrape import SteadyScrape
from harness.measure.server import ServerProcess, exit_text, served_model
from harness.measure.spans import SpanCollector
from harness.results import RunDir, machine
from harness.scenario import ConfigError, Scenario, scenario_source

# How long a stopped server's end-of-spans message may take to arrive. A clean stop sends it
# before the worker exits, so it is in at once; only a crashed worker, or an engine revision
# older than the message, makes the collector wait this long.
LAST_WINDOW_WAIT_S = 2.0
# A load in which no request finishes for this long while some are in flight has stalled.
STALL_S = 120.0
# A server whose requests failed and whose /health no longer answers 200 is given this long
# to exit (the engine exits within 2 s of losing its worker) before it counts as alive.
EXIT_WAIT_S = 3.0


@dataclass(frozen=True)
class SlotLoad:
    """How one slot's load is driven: C lanes, closed loop or (with arrivals) open loop."""

    concurrency: int  # requests in flight (closed loop) or their cap (open loop)
    arrivals: ArrivalSchedule | None = None

    def manifest(self) -> dict:
        if self.arrivals is None:
            return {"mode": "closed", "concurrency": self.concurrency}
        a = self.arrivals
        return {
            "mode": "open",
            "request_rate": a.rate,
            "burstiness": a.burstiness,
            "max_in_flight": self.concurrency,
        }


@dataclass(frozen=True)
class RunPlan:
    scenario: Scenario
    arms: dict[str, Arm]  # letter -> arm
    letters: list[str]  # the schedule (`schedule`), e.g. A B B A B A A B
    block_size: int  # letters per block (4 with --abba, else 2)
    concurrency: int
    requests: Sequence[RequestSpec]
    warmup: int
    period: int
    duration_s: float | None = None
    health_timeout_s: float = 300.0
    shards: int = 1
    stall_s: float = STALL_S
    rule: Rule = Rule()  # how the comparison's intervals become verdicts and the exit code
    allow_interference: bool = False  # keep the verdict beside an interference doubt
    untimed: tuple[str, ...] = ()  # letters whose servers run without phase timing
    arrivals: ArrivalSchedule | None = None  # open loop at a rate; None: closed loop
    headers: dict[str, str] | None = None  # sent with every request (and /v1/models)
    chat: bool = False  # /v1/chat/completions instead of /v1/completions
    points: list[SlotLoad] | None = None  # a sweep: each slot's own load
    # Seconds the schedule may take: a block starts only while the run's time so far plus
    # its longest block yet fits (the first always runs); None: every block.
    time_budget_s: float | None = None
    # The first block this call runs: 0, or for a continued run (`bench run --continue`) the
    # block after the recorded ones; `letters` holds every block's, the recorded ones too.
    first_block: int = 0
    clients: object | None = None  # `bench measure --clients`: harness.cluster.clients.ClientPool

    @property
    def api(self) -> str:
        """The endpoint the load drives: the scenario's (completions or speech), or chat."""
        return "chat" if self.chat else self.scenario.load.api

    @property
    def cpu_layout(self) -> CpuLayout | None:
        """The cores of each process on a CPU run of engine arms (cpu_layout.py); None on a
        GPU, on one core, or with a URL arm (a server the harness does not start)."""
        if any(arm.kind == "url" for arm in self.arms.values()):
            return None
        return cpu_layout(self.scenario.engine.device)

    @property
    def first_slot(self) -> int:
        return self.first_block * self.block_size

    def load(self, slot: int) -> SlotLoad:
        if self.points is not None:
            return self.points[slot]
        return SlotLoad(self.concurrency, self.arrivals)

    def manifest(self, run_id: str, command: str, measured: int, arms: list[dict], **extra) -> dict:
        """manifest.json of the run (docs/RESULTS.md); `complete` until the schedule ends."""
        aa_check = self.arms["A"].same_code_as(self.arms["B"]) if "B" in self.arms else False
        return {
            "run_id": run_id,
            "command": command,
            "unix_time": time.time(),
            "scenario": self.scenario.to_dict(),
            "arms": arms,
            "aa_check": aa_check,
            "schedule": self.letters,
            "block_size": self.block_size,
            "concurrency": self.concurrency,
            "load": self.load(0).manifest() | {"api": self.api},
            "requests": measured,
            "request_digest": request_digest(self.requests),
            "duration_s": self.duration_s,
            "warmup": self.warmup,
            "period": self.period,
            **rule_manifest(self.rule),
            "allow_interference": self.allow_interference,
            "time_budget_s": self.time_budget_s,
            "untimed": list(self.untimed),
            "machine": machine(),
            "cpu_layout": None if (layout := self.cpu_layout) is None else layout.manifest(),
            "complete": False,
            **extra,
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


@dataclass
class Tally:
    """The measured requests of the run's slots whose server neither died nor stalled, and
    the first failure's error: most of them failed, and the run is no result."""

    requests: int = 0
    failed: int = 0
    first_error: str | None = None

    def add(self, records: list[RequestRecord]) -> None:
        for r in records:
            if not r.warmup:
                self.requests += 1
                self.failed += not r.ok
                if not r.ok and self.first_error is None:
                    self.first_error = _what_failed(r)

    @property
    def mostly_failed(self) -> bool:
        return 2 * self.failed > self.requests


BlockValues = Callable[[list[tuple[ServerRecord, list[RequestRecord]]], float], None]


def run_schedule(
    plan: RunPlan,
    rundir: RunDir,
    show: Callable[[SlotStatus], None],
    first_block: BlockValues | None = None,
) -> tuple[bool, Summary]:
    """Run every slot, say in the manifest whether the schedule finished, and summarise the
    run (summary.json). A BenchError (a server that cannot start, a write that fails) leaves it
    unsummarised. A finished run most of whose measured requests failed is no result: it is
    summarised (its report shows the failures), then raised as a BenchError (`finish`).
    `first_block(slots, seconds)`: called once this call's first block has run, with each of its
    slots' server and request records and the block's wall time (`bench run`'s estimate)."""
    complete, tally = execute(plan, rundir, show, first_block)
    return complete, finish(rundir, complete, tally)


def finish(rundir: RunDir, complete: bool, tally: Tally) -> Summary:
    """The end of a schedule (run here or on a cluster, harness/cluster/): the manifest says
    whether it finished, the run is summarised, and a finished run most of whose measured
    requests failed is raised as a BenchError."""
    rundir.update_manifest(complete=complete)
    summary = rundir.summarise()
    if complete and tally.mostly_failed:  # not the requests an interruption cut
        error = (
            f"{tally.failed} of {tally.requests} measured requests failed"
            f" (the first: {tally.first_error}); no result"
        )
        rundir.update_manifest(error=error)
        raise BenchError(error)
    return summary


def execute(
    plan: RunPlan,
    rundir: RunDir,
    show: Callable[[SlotStatus], None],
    first_block: BlockValues | None = None,
) -> tuple[bool, Tally]:
    """Run every slot; whether the whole schedule ran, and the measured requests."""
    write_scenarios(plan, rundir)
    layout, block, started = plan.cpu_layout, [], time.monotonic()
    collector = SpanCollector()
    stop = _StopFlag()
    tally = Tally()
    budget = _Budget(plan)
    try:
        with stop.installed():
            for slot in range(plan.first_slot, len(plan.letters)):
                if stop.set:
                    return False, tally
                if slot % plan.block_size == 0 and not budget.fits_another_block(slot):
                    rundir.update_manifest(budget_stop=budget.stop_note(slot))
                    return True, tally  # whole blocks: a finished (shorter) schedule
                letter = plan.letters[slot]
                ran = _run_slot(plan, rundir, collector, slot, letter, show, stop, tally, layout)
                if first_block is not None and len(block) < plan.block_size:
                    block.append(ran)
                    if len(block) == plan.block_size:
                        first_block(block, time.monotonic() - started)
        return not stop.set, tally
    except Interrupted:
        return False, tally
    finally:
        collector.close()


def write_scenarios(plan: RunPlan, rundir: RunDir) -> None:
    """Each engine arm's scenario file in the run directory, the one its servers run."""
    source = plan.scenario.source or plan.scenario.name
    for letter, arm in plan.arms.items():
        if arm.kind != "url":
            try:
                scenario = scenario_source(source, plan.scenario.size, arm.overrides)
            except ConfigError as exc:  # the file changed since the plan read it
                raise BenchError(str(exc)) from None
            rundir.write_scenario(letter, scenario)


class _Budget:
    """`--time-budget`: at each block's start, whether the call's time so far plus its longest
    block yet still fits the budget. The cut falls between blocks, so every block that ran
    is whole (its ABBA order intact) and the comparison stands on them. A continued run counts
    from its own start, and its first block always runs."""

    def __init__(self, plan: RunPlan):
        self.plan, self.started = plan, time.monotonic()
        self.block_started, self.longest = self.started, 0.0

    def fits_another_block(self, slot: int) -> bool:
        now = time.monotonic()
        if slot != self.plan.first_slot:
            self.longest = max(self.longest, now - self.block_started)
        self.block_started = now
        budget = self.plan.time_budget_s
        first = slot == self.plan.first_slot
        return budget is None or first or now - self.started + self.longest <= budget

    def stop_note(self, slot: int) -> str:
        size, first = self.plan.block_size, self.plan.first_slot
        done, planned = (slot - first) // size, (len(self.plan.letters) - first) // size
        unit = "load points" if self.plan.points else "blocks"  # a sweep's block: one load
        return (
            f"the time budget ({self.plan.time_budget_s:g} s) ended the schedule after {done} of"
            f" {planned} {unit} (the longest took {self.longest:.0f} s)"
        )


def rule_manifest(rule: Rule) -> dict:
    """The manifest's record of the verdict rule (summary.rule_of reads it back)."""
    fields = ("margin", "fail_at", "level", "looks", "look")
    return {name: getattr(rule, name) for name in fields}


def request_digest(requests: Sequence[RequestSpec]) -> str:
    """16 hex of the sha256 of the request sequence as sent (its seed and lengths, or a prompt
    file's prompts): a continued run must send what the recorded one sent."""
    return hashlib.sha256(msgspec.msgpack.encode(requests)).hexdigest()[:16]


def _run_slot(plan, rundir, collector, number, letter, show, stop, tally, layout=None):
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
                env=_timing(plan, letter, collector)
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


def _timing(plan: RunPlan, letter: str, collector: SpanCollector) -> dict[str, str]:
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


class Watch:
    """A slot's load watched on the progress tick (every 0.25 s, off the per-token path): a
    server that exits, or a load in which no request finishes for `stall_s` while some are in
    flight, stops the load at once. Afterwards `fault` says what failed the slot, if anything
    did: a server that died, a stall, or most requests failed."""

    def __init__(self, server: ServerProcess | None, stall_s: float):
        self.server, self.stall_s = server, stall_s
        self.exited: int | None = None  # the server's exit code, once seen
        self.stalled_s: float | None = None  # when the stall began, on the load's clock
        self._done, self._since = -1, 0.0

    @property
    def server_failed(self) -> bool:
        """The server died or stalled (so far as the watch has seen)."""
        return self.exited is not None or self.stalled_s is not None

    def check(self, progress: Progress) -> bool:
        """True when the load must stop."""
        if self.server is not None and self.exited is None:
            self.exited = self.server.exited()
        if progress.done != self._done or progress.in_flight == 0:
            self._done, self._since = progress.done, progress.elapsed_s
        elif progress.elapsed_s - self._since >= self.stall_s and self.stalled_s is None:
            self.stalled_s = self._since
        return self.server_failed

    def fault(self, records: list[RequestRecord]) -> str | None:
        """What failed the slot, from the load's records; None for a slot that did not fail."""
        if self.stalled_s is not None:
            return (
                f"stalled {self.stalled_s:.1f} s into the load: no request finished for"
                f" {self.stall_s:g} s"
            )
        failed = [r for r in records if not r.ok]
        server = self.server
        if server is not None and self.exited is None and failed and not server.answers_health():
            self.exited = server.wait_exit(EXIT_WAIT_S)  # its requests failed: is it dying?
        if self.exited is not None:
            when = f"{min(r.end_s for r in failed):.1f} s into the load" if failed else "under load"
            said = server.last_log_line()
            ends = f"; its log ends: {said}" if said else ""
            return f"died {when} (exit code {exit_text(self.exited)}){ends}"
        measured = [r for r in records if not r.warmup]
        if not measured:
            sent = len(records)
            return (
                f"0 measured requests ({sent} warmup request{'s' if sent != 1 else ''} sent):"
                " the load measured nothing; give more --requests or a longer --duration"
            )
        lost = [r for r in measured if not r.ok]
        if 2 * len(lost) > len(measured):
            first = _what_failed(lost[0])
            return f"{len(lost)} of {len(measured)} measured requests failed (the first: {first})"
        return None


def _what_failed(record: RequestRecord) -> str:
    return record.error or f"HTTP {record.status}"


class _StopFlag:
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed): the first sets the flag (and stops the
    load in progress); the run winds down. SIGKILL cannot be caught: the servers then die with
    the harness (server.die_with_parent)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

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
                self.previous = {sig: signal.signal(sig, flag._handler) for sig in flag.SIGNALS}

            def __exit__(self, *_):
                for sig, handler in self.previous.items():
                    signal.signal(sig, handler)

        return _Ctx()

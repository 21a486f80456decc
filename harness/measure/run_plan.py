"""What a run is to do (`RunPlan`): the scenario, the arms, the schedule of slots, each slot's
load (`SlotLoad`) and the rest of the settings the runner reads; and the run's manifest as the
plan describes it (docs/RESULTS.md)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from harness.analysis.verdict import Rule
from harness.measure.arms import Arm
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.cpu_layout import CpuLayout, cpu_layout
from harness.measure.request_sequence import RequestSpec
from harness.measure.watch import STALL_S
from harness.results import machine
from harness.scenario import Scenario


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

    def load_manifest(self) -> dict:
        """The manifest's `load`: every slot's; for a sweep (`points`) what its points share,
        `per_point` naming the fields each point sets (the manifest's `points` hold them)."""
        if self.points is None:
            return self.load(0).manifest() | {"api": self.api}
        loads = [point.manifest() for point in self.points]
        shared = {k: v for k, v in loads[0].items() if all(other.get(k) == v for other in loads)}
        per_point = sorted({k for load in loads for k in load} - set(shared))
        return shared | {"per_point": per_point, "api": self.api}

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
            "load": self.load_manifest(),
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


def rule_manifest(rule: Rule) -> dict:
    """The manifest's record of the verdict rule (summary.rule_of reads it back)."""
    fields = ("margin", "fail_at", "level", "looks", "look")
    return {name: getattr(rule, name) for name in fields}


def request_digest(requests: Sequence[RequestSpec]) -> str:
    """16 hex of the sha256 of the request sequence as sent (its seed and lengths, or a prompt
    file's prompts): a continued run must send what the recorded one sent."""
    return hashlib.sha256(msgspec.msgpack.encode(requests)).hexdigest()[:16]

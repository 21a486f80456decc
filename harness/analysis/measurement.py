"""One target measured (`bench measure`): its figures pooled over its servers and per server,
goodput against the SLOs given, worker phases and message costs when it has spans, and the
doubts that qualify them, as one JSON-ready `Measurement` (summary.json holds it).

Pure: frames in, dataclasses out; the figures are metrics.py's and goodput.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import msgspec
import pandas as pd

from harness.analysis import metrics, phases, server_figures
from harness.analysis.comparison import _plain
from harness.analysis.doubts import start_stall_doubts
from harness.analysis.goodput import Goodput, goodput
from harness.analysis.schema import SCHEMA_VERSION, empty

LETTER = "A"  # a measurement's one target takes the first letter of the schedule
SLO_ATTAINMENT = 0.99  # the share of requests that must be good unless told otherwise


@dataclass
class Value:
    figure: str
    label: str
    unit: str
    value: float | None  # pooled over the servers (server_figures.arm_summary)
    servers: list[float | None]  # per server, schedule order


@dataclass
class Phase:
    name: str
    ms: float | None  # ms per worker iteration (per request for a message)


@dataclass
class Measurement:
    label: str  # the target: a scenario or a URL
    headline: str
    load: dict  # how the load was driven (mode, concurrency, rate, burstiness, ...)
    requests: int
    failed: int
    figures: list[Value]
    goodput: Goodput | None = None
    slo_attainment: float = SLO_ATTAINMENT
    phases: list[Phase] = field(default_factory=list)
    messages: list[Phase] = field(default_factory=list)
    doubts: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    @property
    def slo_missed(self) -> bool:
        """Fewer good requests than the attainment asks for (never without --goodput)."""
        g = self.goodput
        return g is not None and (g.share is None or g.share < self.slo_attainment)

    def to_json(self) -> dict:
        return _plain(asdict(self) | {"kind": "measure", "slo_missed": self.slo_missed})

    @classmethod
    def from_json(cls, data: Mapping) -> Measurement:
        return msgspec.convert(data, cls)


def figures(audio: bool = False) -> list[server_figures.Figure]:
    """A measurement's figures: the comparison's, and completed requests per second."""
    rate = server_figures.Figure("request_per_s_run", "requests/s (whole run)", "req/s", True)
    return [*server_figures.figures(audio), rate]


def measure(
    requests: pd.DataFrame,
    spans: pd.DataFrame | None,
    servers: pd.DataFrame,
    label: str,
    load: dict,
    *,
    headline: str = server_figures.figures()[0].name,
    slos_ms: dict[str, float] | None = None,
    slo_attainment: float = SLO_ATTAINMENT,
    external: bool = False,
    audio: bool = False,
) -> Measurement:
    """`audio`: a speech load, whose figures are audio's (server_figures.figures)."""
    spans = empty("spans") if spans is None or spans.empty else spans
    per_server = server_figures.server_summary(requests, servers, audio)
    groups = dict(list(requests.groupby(["block", "slot"]))) if len(requests) else {}
    per_server["request_per_s_run"] = [
        metrics.run_request_per_s(groups.get(key, requests.iloc[:0]))
        for key in zip(per_server["block"], per_server["slot"], strict=True)
    ]
    pooled = server_figures.arm_summary(requests, servers, audio).set_index("letter")
    pooled.loc[LETTER, "request_per_s_run"] = per_server["request_per_s_run"].mean()
    values = [
        Value(
            f.name,
            f.label,
            f.unit,
            pooled[f.name].get(LETTER),
            per_server[f.name].tolist(),
        )
        for f in figures(audio)
    ]
    table = phases.phase_table(spans, phases.BY_ARM).set_index("name")["ms_per_iter"]
    costs = phases.message_costs(spans, phases.BY_ARM).set_index("name")["ms_per_request"]
    result = Measurement(
        label=label,
        headline=headline,
        load=load,
        requests=int(per_server["requests"].sum()) if len(per_server) else 0,
        failed=metrics.failed(requests) if len(requests) else 0,
        figures=values,
        goodput=goodput(requests, slos_ms) if slos_ms else None,
        slo_attainment=slo_attainment,
        phases=[Phase(name, ms) for name, ms in sorted(table.items())],
        messages=[Phase(name, ms) for name, ms in sorted(costs.items())],
    )
    result.doubts = doubts(result, requests, per_server, servers, spans, external)
    return result


def doubts(
    result: Measurement,
    requests: pd.DataFrame,
    per_server: pd.DataFrame,
    servers: pd.DataFrame,
    spans: pd.DataFrame,
    external: bool,
) -> list[str]:
    """Failed requests, unhealthy servers, no steady window, a stall at a server's start,
    untimed tokens, no spans."""
    out = []
    if result.failed:
        out.append(f"{result.failed} failed requests: see status/error in requests")
    if cut := metrics.cut(requests) if len(requests) else 0:
        out.append(
            f"{cut} requests cut in flight by the interruption: not completed, not counted"
            " as failed"
        )
    for s in servers.itertuples(index=False):
        if not s.healthy or s.error:
            out.append(f"server {s.server}: {s.error or 'never healthy'}; see {s.log}")
        if pd.isna(s.steady_start_s) or pd.isna(s.steady_end_s):
            out.append(f"server {s.server}: no steady window, so no steady tok/s")
    out += start_stall_doubts(requests, servers)
    untimed = int((per_server["output_tokens"] - per_server["timed_tokens"]).sum())
    if untimed > 0:
        out.append(
            f"{untimed} output tokens have no arrival time (text-only stream?): steady tok/s"
            " and ITL undercount them; read the whole-run tok/s"
        )
    if spans.empty and not external:
        out.append("no spans: run the target's servers with the phase-timing flag")
    if any(p.name == phases.POSTPROCESS_WORK and (p.ms or 0) < 0 for p in result.phases):
        out.append("postprocess work < 0: a subtracted wait is not inside postprocess_batch")
    return out

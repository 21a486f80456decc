"""A sweep (`bench sweep`): one steady measurement per offered load (a request rate or a
concurrency), the throughput-latency curve they draw, and its saturation point
(docs/METRICS.md); with two arms, the same sweep for each, so the curves compare. Pure:
frames in, a JSON-ready `Sweep` out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

import msgspec
import pandas as pd

from harness.analysis import metrics, server_figures
from harness.analysis.comparison import _plain
from harness.analysis.doubts import start_stall_doubts
from harness.analysis.goodput import goodput
from harness.analysis.schema import SCHEMA_VERSION

# Saturated: the next point's throughput grew by less than this share of the load's growth.
SATURATION_GAIN = 0.2
LATENCY_COLUMNS = [f"{m}_{s}_ms" for m in ("ttft", "tpot", "e2e") for s in ("p50", "p99")]


@dataclass
class Point:
    load: float  # the offered request rate (req/s) or the concurrency
    server: str
    letter: str  # the arm
    output_tok_per_s: float | None  # steady
    request_per_s: float | None  # completed per second of the measured run
    requests: int
    failed: int
    latency_ms: dict[str, float | None]  # LATENCY_COLUMNS
    goodput_share: float | None = None


@dataclass
class Sweep:
    labels: dict[str, str]  # letter -> the arm's label (one arm: A)
    axis: str  # "rate" or "concurrency"
    points: list[Point]  # by arm, then load
    # per arm: the load beyond which more load bought little throughput (None: none seen),
    # and the load of the highest throughput
    saturation: dict[str, float | None]
    peak: dict[str, float | None]
    slos_ms: dict[str, float] | None = None
    doubts: list[str] = field(default_factory=list)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict:
        return _plain(asdict(self) | {"kind": "sweep"})

    @classmethod
    def from_json(cls, data: Mapping) -> Sweep:
        return msgspec.convert(data, cls)


def saturation(loads: list[float], throughputs: list[float | None]) -> float | None:
    """The first load whose next step raised throughput by less than SATURATION_GAIN of the
    step in load (relative growths); None when every step still paid."""
    for i in range(len(loads) - 1):
        a, b = throughputs[i], throughputs[i + 1]
        if a is None or b is None or not a > 0 or a != a or b != b:
            continue
        if (b / a - 1) < SATURATION_GAIN * (loads[i + 1] / loads[i] - 1):
            return loads[i]
    return None


def sweep(
    requests: pd.DataFrame,
    servers: pd.DataFrame,
    loads: Mapping[str, float],
    labels: Mapping[str, str],
    axis: str,
    slos_ms: dict[str, float] | None = None,
) -> Sweep:
    """`loads`: each server's offered load (server id -> rate or concurrency); `labels`: each
    arm's label by letter."""
    per_server = server_figures.server_summary(requests, servers)
    ids = servers.sort_values(["block", "slot"])["server"].tolist()
    points = []
    for server, row in zip(ids, per_server.to_dict("records"), strict=True):
        mine = requests[requests["server"] == server] if len(requests) else requests
        points.append(
            Point(
                load=float(loads[server]),
                server=server,
                letter=row["letter"],
                output_tok_per_s=row["output_tok_per_s"],
                request_per_s=metrics.run_request_per_s(mine),
                requests=int(row["requests"]),
                failed=int(row["failed"]),
                latency_ms={c: row[c] for c in LATENCY_COLUMNS},
                goodput_share=goodput(mine, slos_ms).share if slos_ms else None,
            )
        )
    points.sort(key=lambda p: (p.letter, p.load))
    result = Sweep(dict(labels), axis, points, {}, {}, slos_ms)
    for letter in labels:
        mine = [p for p in points if p.letter == letter]
        rates = [p.output_tok_per_s for p in mine]
        result.saturation[letter] = saturation([p.load for p in mine], rates)
        finite = [(r, p.load) for r, p in zip(rates, mine, strict=True) if r is not None and r == r]
        result.peak[letter] = max(finite)[1] if finite else None
    for p in points:
        where = f"load {p.load:g}" + (f", arm {p.letter}" if len(labels) > 1 else "")
        if p.failed:
            result.doubts.append(f"{p.failed} failed requests at {where}")
        if p.output_tok_per_s is None or p.output_tok_per_s != p.output_tok_per_s:
            result.doubts.append(
                f"no steady window at {where}: raise --requests (several times the load)"
                " or give --duration"
            )
    result.doubts += start_stall_doubts(requests, servers)
    return result

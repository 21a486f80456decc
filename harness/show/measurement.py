"""A `Measurement` (bench measure) and a `Sweep` (bench sweep) as rich tables. Every number is
a field of the summary, formatted as everywhere (format.py)."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape

from harness.analysis.measurement import Measurement
from harness.analysis.phases import ALL_MESSAGES, POSTPROCESS_WORK
from harness.analysis.sweep import LATENCY_COLUMNS, Sweep
from harness.show.comparison import table
from harness.show.format import joined, number, percent


def load_text(load: dict) -> str:
    """How the load was driven, in a few words."""
    if load.get("mode") == "open":
        return (
            f"open loop at {load['request_rate']:g} req/s (burstiness {load['burstiness']:g},"
            f" at most {load['max_in_flight']} in flight)"
        )
    return f"closed loop at c={load.get('concurrency', '?')}"


def render(m: Measurement) -> Group:
    several = any(len(f.servers) > 1 for f in m.figures)
    columns = ("value", "per server") if several else ("value",)
    figures = table(f"{escape(m.label)}: {load_text(m.load)}", "figure", *columns)
    for f in m.figures:
        servers = (joined(f.servers),) if several else ()
        label = f.label if f.unit in f.label else f"{f.label} ({f.unit})"
        figures.add_row(label, number(f.value), *servers)
    figures.add_row("failed requests", str(m.failed), *(("",) if several else ()))
    parts: list = [figures]
    if m.goodput is not None:
        g = m.goodput
        slos = ", ".join(f"{k} <= {v:g} ms" for k, v in g.slos_ms.items())
        verdict = "[red]SLO missed[/]" if m.slo_missed else "[green]SLO met[/]"
        parts.append(
            f"goodput ({slos}): {number(g.per_s)} req/s, {g.good} of {g.measured} requests"
            f" ({percent(g.share)}; {m.slo_attainment:.0%} needed): {verdict}"
        )
    if m.phases:
        phases = table(
            f"ms per worker iteration ({POSTPROCESS_WORK}: less the waits)", "phase", "ms"
        )
        for p in m.phases:
            phases.add_row(p.name, number(p.ms))
        parts.append(phases)
    if m.messages:
        messages = table(f"ms per request ({ALL_MESSAGES})", "stage", "ms")
        for p in m.messages:
            messages.add_row(p.name, number(p.ms))
        parts.append(messages)
    parts += [f"[yellow]doubt:[/] {escape(d)}" for d in m.doubts]
    return Group(*parts)


def render_sweep(s: Sweep) -> Group:
    unit = "req/s" if s.axis == "rate" else "in flight"
    columns = [
        "tok/s",
        "req/s",
        *(c.removesuffix("_ms").replace("_", " ") for c in LATENCY_COLUMNS),
    ]
    points = table(f"{escape(s.label)}: sweep over {s.axis} (latencies in ms)", unit, *columns)
    for p in s.points:
        latencies = (number(p.latency_ms.get(c)) for c in LATENCY_COLUMNS)
        mark = " *" if p.load == s.saturation else ""
        points.add_row(
            f"{p.load:g}{mark}", number(p.output_tok_per_s), number(p.request_per_s), *latencies
        )
    said = (
        f"saturation at {s.saturation:g} {unit} (*): more load bought little throughput"
        if s.saturation is not None
        else "no saturation within the sweep: throughput still grew with load"
    )
    parts: list = [points, said]
    if s.peak is not None:
        parts.append(f"highest throughput at {s.peak:g} {unit}")
    parts += [f"[yellow]doubt:[/] {escape(d)}" for d in s.doubts]
    return Group(*parts)

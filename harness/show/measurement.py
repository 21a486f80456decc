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
    arms = len(s.labels) > 1
    shown = [c for c in LATENCY_COLUMNS if c != "e2e_p50_ms"]  # 80 columns
    columns = ["tok/s", "req/s", *(c.removesuffix("_ms").replace("_", " ") for c in shown)]
    names = " against ".join(f"{x}: {escape(label)}" for x, label in reversed(s.labels.items()))
    title = f"{names}: sweep over {s.axis} (latencies in ms)"
    points = table(title, s.axis, *(["arm"] if arms else []), *columns)
    for p in s.points:
        latencies = (number(p.latency_ms.get(c)) for c in shown)
        mark = " *" if p.load == s.saturation.get(p.letter) else ""
        points.add_row(
            f"{p.load:g}{mark}",
            *([p.letter] if arms else []),
            number(p.output_tok_per_s),
            number(p.request_per_s),
            *latencies,
        )
    parts: list = [points]
    for letter, label in s.labels.items():
        arm = f"{letter} ({escape(label)}): " if arms else ""
        at = s.saturation.get(letter)
        parts.append(
            f"{arm}saturation at {at:g} {unit} (*): more load bought little throughput"
            if at is not None
            else f"{arm}no saturation within the sweep: throughput still grew with load"
        )
        if s.peak.get(letter) is not None:
            parts.append(f"{arm}highest throughput at {s.peak[letter]:g} {unit}")
    parts += [f"[yellow]doubt:[/] {escape(d)}" for d in s.doubts]
    return Group(*parts)

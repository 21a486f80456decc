"""The report of one target (`bench measure`) or of a sweep (`bench sweep`): the summary's
tables as report blocks, and the sweep's curve. Every number is a field of the summary."""

from __future__ import annotations

from pathlib import Path

from harness.analysis.measurement import Measurement
from harness.analysis.sweep import LATENCY_COLUMNS, Sweep
from harness.show.format import number, percent
from harness.show.measurement import load_text
from harness.show.report.blocks import Block, Bullets, Heading, Image, Table, Text
from harness.show.report.markdown import to_markdown


def measurement_blocks(manifest: dict, m: Measurement) -> list[Block]:
    rows = [[f"{f.label} ({f.unit})", number(f.value)] for f in m.figures]
    blocks: list[Block] = [
        Heading(f"Measurement: {m.label}", 2),
        Text(f"{load_text(m.load)}; {m.requests:,} measured requests, {m.failed:,} failed."),
        Table(["figure", "value"], rows),
    ]
    if m.goodput is not None:
        g = m.goodput
        slos = ", ".join(f"{k} ≤ {v:g} ms" for k, v in g.slos_ms.items())
        verdict = "**SLO missed**" if m.slo_missed else "SLO met"
        blocks.append(
            Text(
                f"Goodput ({slos}): {number(g.per_s)} req/s, {percent(g.share)} of requests "
                f"({m.slo_attainment:.0%} needed): {verdict}."
            )
        )
    if m.phases:
        blocks += [
            Heading("Worker phases (ms per iteration)"),
            Table(["phase", "ms"], [[p.name, number(p.ms)] for p in m.phases]),
        ]
    return blocks + _tail(manifest, m.doubts)


def sweep_blocks(manifest: dict, s: Sweep, plot: str) -> list[Block]:
    names = [c.removesuffix("_ms").replace("_", " ") for c in LATENCY_COLUMNS]
    rows = [
        [f"{p.load:g}", p.letter, number(p.output_tok_per_s), number(p.request_per_s)]
        + [number(p.latency_ms.get(c)) for c in LATENCY_COLUMNS]
        for p in s.points
    ]
    said = []
    for letter, label in s.labels.items():
        at = s.saturation.get(letter)
        said.append(
            f"{letter} ({label}): saturation at {at:g}: the next step in load raised "
            "throughput by less than a fifth of its own growth."
            if at is not None
            else f"{letter} ({label}): no saturation within the sweep."
        )
    return [
        Heading(f"Sweep over {s.axis}: " + ", ".join(s.labels.values()), 2),
        Bullets(said),
        Table([s.axis, "arm", "tok/s", "req/s", *(f"{n} (ms)" for n in names)], rows),
        Image(plot, "throughput-latency curve", "Throughput against load; latency against it."),
        *_tail(manifest, s.doubts),
    ]


def _tail(manifest: dict, doubts: list[str]) -> list[Block]:
    command = " ".join(["bench", *str(manifest.get("command", "")).split()[1:]])
    return [
        Text(f"Command: `{command}`"),
        Heading("Doubts"),
        Bullets(doubts) if doubts else Text("None."),
    ]


def write_single_report(manifest: dict, summary: Measurement | Sweep, out: Path) -> Path:
    """report.md of a measurement or a sweep (with its curve) in `out`."""
    if isinstance(summary, Sweep):
        from harness.show.report.curve import draw_sweep  # matplotlib: only when drawing

        draw_sweep(summary, Path(out) / "sweep.png")
        blocks = sweep_blocks(manifest, summary, "sweep.png")
    else:
        blocks = measurement_blocks(manifest, summary)
    path = Path(out) / "report.md"
    path.write_text(to_markdown(blocks))
    return path

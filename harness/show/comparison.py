"""A run's `Comparison` as rich tables: figures, per-server values, phases, message costs,
doubts. Every number is a field of the comparison."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from harness.analysis.comparison import Comparison
from harness.analysis.phases import POSTPROCESS_WORK
from harness.analysis.schema import LETTERS
from harness.show.format import (
    MESSAGE_NOTE,
    caption,
    change_text,
    joined,
    number,
    phase_caption,
    verdict_text,
    verdict_words,
)


def render(result: Comparison) -> Group:
    """The tables the CLI prints: figures, per-server values, phases, message costs, doubts."""
    a, b = (f"{x}: {escape(result.labels[x])}" for x in LETTERS)
    ci = "change (CI)"
    figures = table("B against A", "figure", a, b, ci, "verdict")
    figures.caption = caption(result)
    for f in result.figures:
        figures.add_row(
            f.label if f.unit in f.label else f"{f.label} ({f.unit})",
            number(f.a),
            number(f.b),
            change_text(f.change),
            verdict_text(f.change),
        )
    servers = table("per server, schedule order", "figure", a, b)
    for f in result.figures:
        if f.higher_is_better:
            servers.add_row(f.label, joined(f.servers_a), joined(f.servers_b))
    failed = ([s.failed for s in result.servers if s.letter == x] for x in LETTERS)
    servers.add_row("failed requests", *(joined(f, str) for f in failed))
    parts: list = [figures, servers]
    if result.phases:
        waits = ", ".join(w.removeprefix(WORKER) for w in result.postprocess_waits)
        title = f"ms per worker iteration, {WORKER}* ({POSTPROCESS_WORK}: postprocess_batch less {waits})"
        phases = table(title, "phase", a, b, ci, "verdict")
        phases.caption = phase_caption(result)
        for p in result.phases:
            phases.add_row(
                p.name.removeprefix(WORKER),
                number(p.a_ms),
                number(p.b_ms),
                change_text(p.change),
                verdict_text(p.change),
            )
        parts.append(phases)
    if result.messages:
        messages = table("ms per request", "stage", a, b)
        messages.caption = MESSAGE_NOTE
        for m in result.messages:
            name = ("  " if m.parent else "") + m.name.removeprefix(WORKER)
            messages.add_row(name, number(m.a_ms), number(m.b_ms))
        parts.append(messages)
    headline = result.headline_row
    label = headline.label if headline else result.headline
    parts.append(f"[bold]headline[/] {escape(label)}: {escape(verdict_words(result))}")
    parts += [f"[yellow]doubt:[/] {escape(d)}" for d in result.doubts]
    return Group(*parts)


WORKER = "worker."  # every span's prefix: said once in the title, not on every row


def table(title: str, first: str, *columns: str) -> Table:
    """A table whose first column names the rows, never cut (at 80 columns the figures wrap
    instead); numbers right, a verdict left."""
    out = Table(title=title)
    out.add_column(first, no_wrap=True)
    for column in columns:
        out.add_column(column, justify="left" if column == "verdict" else "right", overflow="fold")
    return out

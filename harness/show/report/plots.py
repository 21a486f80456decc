"""The report's plots: which are drawn, and the two drawn from the comparison's own figures
(throughput per server, phase breakdown). series.py draws the raw rows (CDFs, over time).

A plot function returns (figure, title, caption), or a string saying why it drew nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine import spans as names
from harness.show.report import series, style
from harness.show.report.style import COLORS, finite

if TYPE_CHECKING:
    from harness.show.report.evidence import Evidence

# How the worker nests its spans (engine/spans.py): an iteration is schedule + forward +
# postprocess_batch; postprocess_batch holds the step's completion wait and the
# worker.postprocess.* stages. What a stack leaves before its total's tick is untimed.
ITERATION = (names.SCHEDULE, names.FORWARD, names.POSTPROCESS_BATCH)


@dataclass
class Plot:
    path: Path
    title: str  # the image's alt text
    caption: str  # how to read it


@dataclass
class Drawn:
    plots: dict[str, Plot] = field(default_factory=dict)  # by name: the PNG's stem
    skipped: list[str] = field(default_factory=list)  # why a plot is missing


def draw_all(evidence: Evidence, directory: Path) -> Drawn:
    directory.mkdir(parents=True, exist_ok=True)
    drawn = Drawn()
    for name, draw in (
        ("throughput", throughput),
        ("phases", phase_breakdown),
        ("latency", series.latency_cdfs),
        ("timeline", series.timeline),
    ):
        with style.context():
            result = draw(evidence)
            if isinstance(result, str):
                drawn.skipped.append(result)
                continue
            figure, title, caption = result
            style.save(figure, directory / f"{name}.png")
        drawn.plots[name] = Plot(directory / f"{name}.png", title, caption)
    return drawn


def throughput(evidence: Evidence):
    """Each server's headline figure (steady output tok/s, or audio-seconds/s) in schedule
    order, coloured by arm; a dashed line at each arm's mean. Drift across A B B A shows as a
    slope within the colours."""
    c = evidence.comparison
    headline = next((f for f in c.figures if f.figure == c.headline), None)
    if not c.servers or headline is None:
        return "throughput per server: no servers in the run"
    figure, axes = style.subplots(1, 1, 3.4)
    ax = axes[0, 0]
    per_letter = {"A": iter(headline.servers_a), "B": iter(headline.servers_b)}
    heights = [finite(next(per_letter[s.letter], None)) for s in c.servers]
    colors = [COLORS[s.letter] for s in c.servers]
    bars = ax.bar(range(len(heights)), heights, width=0.7, color=colors)
    for bar, s in zip(bars, c.servers, strict=True):
        if not s.healthy or s.error:
            bar.set_hatch("//")
        height = bar.get_height()
        text = (f"{height:,.0f}" if height >= 100 else f"{height:.3g}") if height else "n/a"
        text += f"\n{s.failed} failed" if s.failed else ""
        ax.annotate(
            text,
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            xytext=(0, 2),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
            color="#b00020" if s.failed else "black",
        )
    for letter, mean in (("A", headline.a), ("B", headline.b)):
        if finite(mean):
            label = f"{series.label(evidence, letter)} (mean)"
            ax.axhline(mean, color=COLORS[letter], ls="--", lw=1, label=label)
    ax.set_xticks(range(len(heights)), [f"{s.letter}\nb{s.block} s{s.slot}" for s in c.servers])
    unit = headline.unit  # "output tok/s (steady)" names its unit already
    ax.set_ylabel(headline.label if unit in headline.label else f"{headline.label} ({unit})")
    ax.set_ylim(0, max(heights + [1.0]) * 1.25)
    ax.set_title("Throughput per server, schedule order")
    ax.legend(loc="upper right", fontsize=9, frameon=False, ncols=2)
    caption = (
        "One bar per server (block b, slot s) in the order they ran; dashed lines are the arms'"
        " means. Hatched: unhealthy server."
    )
    return figure, "throughput per server", caption


def phase_breakdown(evidence: Evidence):
    """Stacked ms per iteration for each arm: the iteration's parts, then postprocess_batch's
    parts. A black tick marks the enclosing span's total; the gap before it is untimed."""
    pooled = {p.name: {"A": p.a_ms, "B": p.b_ms} for p in evidence.comparison.phases}
    if not pooled:
        return "phase breakdown: no spans from either arm (external servers have none)"
    stages = sorted(n for n in pooled if n.startswith(names.POSTPROCESS))
    inside = [n for n in (names.COMPLETION_WAIT, *stages) if n in pooled]
    panels = [
        ("worker iteration", [n for n in ITERATION if n in pooled], names.ITERATION),
        (f"inside {names.POSTPROCESS_BATCH}", inside, names.POSTPROCESS_BATCH),
    ]
    panels = [p for p in panels if p[1]]
    figure, axes = style.subplots(len(panels), 1, 2.0 * len(panels) + 0.4)
    stacked = [n for _, parts, _ in panels for n in parts if n != names.POSTPROCESS_BATCH]
    neutral = {names.POSTPROCESS_BATCH: style.NEUTRAL}
    colors = dict(zip(stacked, style.PALETTE, strict=False)) | neutral
    for ax, (title, parts, total) in zip(axes[:, 0], panels, strict=True):
        _stack(ax, {n: pooled[n] for n in parts}, pooled.get(total, {}), colors)
        ax.plot([], [], "|", color="black", ms=12, mew=2, label=f"{total.split('.')[-1]} (total)")
        ax.set_yticks([1, 0], [style.short(series.label(evidence, x)) for x in ("A", "B")])
        ax.set_xlabel("ms per worker iteration")
        ax.set_title(title, loc="left")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    caption = (
        "Each arm's servers pooled (sum over sum). The black tick is the enclosing span; the gap"
        " before it is time no span covers."
    )
    return figure, "worker phases, ms per iteration", caption


def _stack(ax, parts: dict[str, dict], total: dict, colors: dict) -> None:
    """One stacked bar per arm (A on top) and a tick at its total; "no spans" for an arm
    without values."""
    ends = []
    for y, letter in ((1, "A"), (0, "B")):
        left = 0.0
        for name, values in parts.items():
            width = finite(values.get(letter))
            label = name.split(".")[-1] if letter == "A" else None
            ax.barh(y, width, left=left, color=colors[name], height=0.55, label=label)
            left += width
        whole = finite(total.get(letter))
        if whole:
            ax.plot([whole], [y], "|", color="black", ms=20, mew=2)
        end = max(left, whole)
        text = f"{end:.3g} ms" if end else "no spans from this arm"
        ax.annotate(text, (end, y), xytext=(4, 0), textcoords="offset points", va="center")
        ends.append(end)
    ax.set_xlim(0, max(ends + [1e-6]) * 1.18)

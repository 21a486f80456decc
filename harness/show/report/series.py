"""Plots of the raw rows: TTFT and ITL distributions per arm, and one server of each arm over
time (tok/s from token arrival times, or audio-seconds/s from PCM arrivals for a speech load;
batch size from the span windows)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from engine import spans as names
from harness.analysis import metrics, phases
from harness.analysis.schema import LETTERS
from harness.analysis.summary import speaks
from harness.show.report import style
from harness.show.report.style import COLORS

if TYPE_CHECKING:
    from harness.show.report.evidence import Evidence

BIN_WIDTHS_S = (0.05, 0.1, 0.2, 0.25, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300)
MAX_BINS = 60


def label(evidence: Evidence, letter: str) -> str:
    return f"{letter}: {evidence.comparison.labels.get(letter, letter)}"


def latency_cdfs(evidence: Evidence):
    """CDFs of TTFT and ITL per arm over the completed measured requests, log x when the
    values span more than a decade."""
    done = metrics.completed(evidence.frames["requests"])
    if done.empty:
        return "latency distributions: no completed measured requests"
    figure, axes = style.subplots(1, 2, 3.4)
    zero_gaps = 0
    for ax, name in zip(axes[0], ("TTFT", "ITL"), strict=True):
        for letter in LETTERS:
            rows = done[done["letter"] == letter]
            seconds = (
                metrics.ttft_s(rows).to_numpy(float) if name == "TTFT" else metrics.itl_s(rows)
            )
            ms = np.sort(seconds[np.isfinite(seconds)]) * 1e3
            zero_gaps += int((ms <= 0).sum())
            ms = ms[ms > 0]
            if ms.size:
                y = np.arange(1, ms.size + 1) / ms.size
                ax.step(ms, y, where="post", color=COLORS[letter], label=label(evidence, letter))
        shown = [line.get_xdata() for line in ax.get_lines()]
        if shown and max(x.max() for x in shown) > 20 * min(x.min() for x in shown):
            ax.set_xscale("log")
        for q, text in ((0.5, "p50"), (0.99, "p99")):
            ax.axhline(q, color="0.8", lw=0.8, zorder=0)
            style.note(ax, text, q)
        ax.set_xlabel(f"{name} (ms{', log scale' if ax.get_xscale() == 'log' else ''})")
        ax.set_ylabel("fraction of samples")
        ax.set_title(name, loc="left")
    axes[0, 0].legend(loc="best", fontsize=9, frameon=False)
    caption = (
        "Completed measured requests of all servers of an arm; grey lines at p50 and p99."
        " Further right is slower."
    )
    if zero_gaps:
        gaps = (
            "1 zero gap (two tokens arriving together) is"
            if zero_gaps == 1
            else (f"{zero_gaps:,} zero gaps (tokens arriving together) are")
        )
        caption += f" {gaps} left out."
    return figure, "TTFT and ITL distributions", caption


def timeline(evidence: Evidence):
    """Output and batch size over time for one server of each arm (its median by the headline
    figure); shaded: the server's steady window. The output is tok/s, or for a speech load
    audio-seconds/s (each piece of PCM counted at its arrival, as the headline counts it)."""
    picks = median_servers(evidence)
    if not picks:
        return "over time: no server with a steady headline figure"
    audio = speaks(evidence.manifest)
    requests, spans = evidence.frames["requests"], evidence.frames["spans"]
    arrivals = {x: _arrivals(requests, s, audio) for x, s in picks.items()}
    duration = max([t.max() for t, _ in arrivals.values() if t.size] + [1.0])
    width = next((w for w in BIN_WIDTHS_S if duration / w <= MAX_BINS), BIN_WIDTHS_S[-1])
    edges = np.arange(0.0, duration + width, width)
    figure, axes = style.subplots(2, 1, 4.8, sharex=True)
    top, bottom = axes[:, 0]
    missing = []
    for letter, server in picks.items():
        color = COLORS[letter]
        name = f"{label(evidence, letter)} (b{server.block} s{server.slot})"
        times, amounts = arrivals[letter]
        totals, _ = np.histogram(times, bins=edges, weights=amounts)
        top.stairs(totals / width, edges, color=color, lw=1.5, label=name)
        if pd.notna(server.steady_start_s) and pd.notna(server.steady_end_s):
            for ax in (top, bottom):
                ax.axvspan(server.steady_start_s, server.steady_end_s, color=color, alpha=0.08)
        if not _batch(bottom, spans, server, color):
            missing.append(f"{letter}: no spans")
    output = "audio-seconds/s" if audio else "output tok/s"
    top.set_ylabel(f"{output} ({width:g} s bins)")
    top.set_title("One server per arm over time (shaded: steady window)", loc="left")
    top.set_ylim(0, top.get_ylim()[1] * 1.3)  # room for the legend above the lines
    top.legend(loc="upper right", fontsize=9, frameon=False, ncols=2)
    concurrency = evidence.manifest.get("concurrency")
    if isinstance(concurrency, int):
        bottom.axhline(concurrency, color="0.6", ls=":", lw=1)
        style.note(bottom, f"c={concurrency}", concurrency, dy=-10)
    bottom.set_ylabel("rows per step")
    bottom.set_xlabel("seconds since the server's load started")
    bottom.set_ylim(bottom=0)
    if missing:
        bottom.text(0.99, 0.05, "; ".join(missing), transform=bottom.transAxes, ha="right")
    what = "seconds of audio" if audio else "output tokens"
    caption = (
        f"Top: {what} of completed requests (warmup included) per {width:g} s."
        " Bottom: mean rows per worker step in each span window (from the load's start: a"
        " window begun before it is drawn from there)."
    )
    return figure, f"{output} and batch size over time", caption


def median_servers(evidence: Evidence) -> dict[str, pd.Series]:
    """The server record of each letter with the median headline figure (the lower median),
    among the servers that have one."""
    c = evidence.comparison
    headline = next((f for f in c.figures if f.figure == c.headline), None)
    if headline is None:
        return {}
    servers = evidence.frames["servers"]
    picks = {}
    for letter, values in (("A", headline.servers_a), ("B", headline.servers_b)):
        ordered = [s for s in c.servers if s.letter == letter]  # values' order: the schedule's
        rated = [(v, s) for v, s in zip(values, ordered, strict=True) if _finite(v)]
        if rated:
            _, median = sorted(rated, key=lambda pair: pair[0])[(len(rated) - 1) // 2]
            match = (servers["block"] == median.block) & (servers["slot"] == median.slot)
            picks[letter] = servers[match].iloc[0]
    return picks


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _arrivals(requests: pd.DataFrame, server: pd.Series, audio: bool):
    """When the server's successful requests received output (seconds since its load started)
    and how much each arrival was: one token, or seconds of audio (its PCM bytes)."""
    rows = requests[(requests["block"] == server.block) & (requests["slot"] == server.slot)]
    rows = rows[metrics.ok(rows)]
    if not audio:
        times = metrics.token_times(rows)
        return times, np.ones_like(times)
    times, sizes = metrics.audio_pieces(rows)
    return times, sizes / metrics.PCM_BYTES_PER_S


def _batch(ax, spans: pd.DataFrame, server: pd.Series, color: str) -> bool:
    """Mean rows per step in each span window, as horizontal segments; False without spans."""
    rows = spans[(spans["block"] == server.block) & (spans["slot"] == server.slot)]
    rows = rows[rows["end_unix"] > 0]  # windows with wall times
    means = phases.count_means(rows, ("start_unix", "end_unix"))
    means = means[means["name"] == names.ROWS_PER_STEP]
    if means.empty:  # no batch count: the windows' own mean batch size
        means = rows[rows["name"] == names.ITERATION].rename(columns={"mean_batch": "mean"})
    if means.empty:
        return False
    start, end = means["start_unix"] - server.t0_unix, means["end_unix"] - server.t0_unix
    during = end > 0  # a window over the start-up alone (before the load) holds no load step
    ax.hlines(means["mean"][during], start[during].clip(lower=0), end[during], color=color, lw=2)
    return True

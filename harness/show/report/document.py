"""What the report says, top to bottom, as blocks that markdown.py and html.py lay out.

Every number is a field of the `Comparison`, formatted as the terminal formats it
(harness/show/format.py); the tables are tables.py's; the manifest gives the setup and the
arms. Nothing here computes a statistic.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from harness.analysis import phases
from harness.analysis.compare import Comparison
from harness.analysis.doubts import client_limit
from harness.analysis.schema import LETTERS
from harness.analysis.stats import FASTER, NO_CHANGE, SLOWER, WITHIN_BLOCK
from harness.show.format import number
from harness.show.measurement import load_text
from harness.show.report.blocks import Block, Bullets, Heading, Image, Text
from harness.show.report.evidence import Evidence
from harness.show.report.tables import (
    arms_table,
    figure_table,
    message_table,
    phase_table,
    server_table,
)

if TYPE_CHECKING:
    from harness.show.report.plots import Drawn


HEADLINE_WORDS = {FASTER: "B is faster", SLOWER: "B is slower", NO_CHANGE: "No change"}


def document(evidence: Evidence, drawn: Drawn, relative_to: Path) -> list[Block]:
    c = evidence.comparison

    def image(name: str) -> list[Block]:
        plot = drawn.plots.get(name)
        if plot is None:
            return []
        path = Path(os.path.relpath(plot.path, relative_to)).as_posix()
        return [Image(path, plot.title, plot.caption)]

    a, b = (f"{x}: {c.labels[x]}" for x in LETTERS)
    blocks: list[Block] = [
        Heading(f"Benchmark: {c.labels['B']} against {c.labels['A']}", 2),
        Text(headline(c)),
        Text("Setup: " + setup(evidence)),
        figure_table(c, a, b),
        Heading("Throughput per server (schedule order)"),
        server_table(c, a, b),
        *image("throughput"),
    ]
    if c.phases:
        waits = ", ".join(f"`{w}`" for w in c.postprocess_waits)
        blocks += [
            Heading("Worker phases (ms per iteration)"),
            Text(
                f"Each arm's servers pooled. *{phases.POSTPROCESS_WORK}* is "
                f"`{phases.POSTPROCESS}` less {waits}."
            ),
            phase_table(c, a, b),
            *image("phases"),
        ]
    if c.messages:
        heading = Heading(f"Message cost (ms per request, `{phases.ALL_MESSAGES}`)")
        blocks += [heading, message_table(c, a, b)]
    blocks += [Heading("Latency and load over time"), *image("latency"), *image("timeline")]
    if drawn.skipped:
        blocks.append(Text("Not drawn: " + "; ".join(drawn.skipped) + "."))
    blocks += [Heading("Arms"), arms_table(evidence), Text(f"Command: `{command(evidence)}`")]
    blocks += [Heading("Doubts"), Bullets(evidence.doubts) if evidence.doubts else Text("None.")]
    blocks += [Heading("Context"), Bullets([calibration(evidence), power(evidence)])]
    return blocks


def headline(c: Comparison) -> str:
    """One sentence: the verdict on the headline figure, both arms' values and the change."""
    f = next((f for f in c.figures if f.figure == c.headline), None)
    if f is None:
        return "**No headline figure.**"
    words = HEADLINE_WORDS.get(f.change.verdict, f.change.verdict.capitalize())
    change = ""
    if f.change.ratio is not None:
        change = (
            f", change {f.change.ratio - 1:+.1%} ({c.rule.level:.0%} CI "
            f"{f.change.low - 1:+.1%} .. {f.change.high - 1:+.1%})"
        )
    weaker = " (a within-block estimate: weaker)" if f.change.method == WITHIN_BLOCK else ""
    return (
        f"**{words}** on {f.label}: A {number(f.a)} → B {number(f.b)} {f.unit}{change}, "
        f"over {f.change.blocks} paired block(s){weaker}."
    )


def setup(evidence: Evidence) -> str:
    m, c = evidence.manifest, evidence.comparison
    machine = m.get("machine") or {}
    device = (
        f"GPU {machine['gpu']}"
        if machine.get("gpu")
        else f"CPU ({machine.get('cpu') or '?'}, {machine.get('cpus', '?')} cores)"
    )
    scenario = m.get("scenario") or {}
    per_arm = " / ".join(str(sum(s.letter == x for s in c.servers)) for x in LETTERS)
    load = (
        f"{m.get('duration_s')} s of load"
        if m.get("duration_s")
        else f"{m.get('requests', '?')} measured"
    )
    measured = sum(s.requests for s in c.servers)
    failed = sum(s.failed for s in c.servers)
    return (
        f"{device}; {scenario.get('name', '?')} {scenario.get('size', '')}, "
        f"{load_text(m.get('load') or {'concurrency': m.get('concurrency', '?')})}; schedule {schedule(m, c)}; {per_arm} servers "
        f"(A / B), each {load} + {m.get('warmup', '?')} warmup requests; "
        f"{measured:,} measured requests, {failed:,} failed."
    )


def schedule(manifest: dict, c: Comparison) -> str:
    """`ABBA × 3` when the schedule repeats one block, else the letters."""
    letters = list(manifest.get("schedule") or [s.letter for s in c.servers])
    blocks = len({s.block for s in c.servers}) or 1
    block = letters[: len(letters) // blocks]
    if block and block * blocks == letters:
        return f"{''.join(block)} × {blocks}"
    return " ".join(letters)


def command(evidence: Evidence) -> str:
    words = str(evidence.manifest.get("command", "")).split()
    return " ".join(["bench", *words[1:]])


def calibration(evidence: Evidence) -> str:
    """The most tok/s the client read in `bench calibrate`, and how near this run came."""
    cal = evidence.calibration or {}
    limit = client_limit(cal)
    if not limit:
        return "No client calibration on record: `bench calibrate` measures the client's own limit."
    when = time.strftime("%Y-%m-%d", time.gmtime(cal.get("unix_time", 0)))
    shards = (cal.get("settings") or {}).get("shards", 1)
    rates = [s.output_tok_per_s for s in evidence.comparison.servers]
    fastest = max((r for r in rates if r is not None and math.isfinite(r)), default=None)
    text = (
        f"Client calibration ({when}): at most {limit:,.0f} tok/s with {shards} client process(es)"
    )
    if fastest:
        text += f"; the fastest server here ran at {fastest:,.0f} ({fastest / limit:.1%} of it)"
    machine = evidence.manifest.get("machine") or {}
    if (cal.get("machine") or {}).get("platform") != machine.get("platform"):
        text += "; calibrated on another machine"
    if cal.get("doubtful"):
        text += f"; the calibration is doubtful: {cal['doubtful']}"
    return text + "."


def power(evidence: Evidence) -> str:
    """The latest `bench power` result for the scenario, for the headline figure. Its rates
    are per figure (a map) as analysis/power.py writes them, or single values."""
    p = evidence.power
    name = (evidence.manifest.get("scenario") or {}).get("name", "?")
    if not p:
        return (
            f"No power result for {name}: `bench power {name}` measures what this setup can detect."
        )
    c = evidence.comparison
    label = next((f.label for f in c.figures if f.figure == c.headline), c.headline)

    def quoted(key: str) -> str:
        value = p.get(key)
        value = value.get(c.headline) if isinstance(value, dict) else value
        return f"{value:.1%}" if isinstance(value, int | float) else "-"

    where = f" at c={p['concurrency']}" if p.get("concurrency") else ""
    when = f", {str(p['created'])[:10]}" if p.get("created") else ""
    blocks = p.get("quoted_blocks", p.get("blocks", "?"))
    return (
        f"Power ({name}{where}{when}): for {label} with {blocks} blocks, false-positive rate "
        f"{quoted('false_positive_rate')}, smallest detectable slowdown "
        f"{quoted('min_detectable_slowdown')}, server-to-server noise (CV) {quoted('noise')}."
    )

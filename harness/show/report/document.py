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
from harness.analysis.comparison import Comparison
from harness.analysis.doubts import client_limit
from harness.analysis.power_report import mismatch, rates_for
from harness.analysis.power_stats import PLANTED, POWER
from harness.analysis.schema import LETTERS
from harness.analysis.stats import BETWEEN_RUNS
from harness.analysis.verdict import (
    FASTER,
    NO_CHANGE,
    NO_VERDICT,
    ONE_BLOCK,
    SLOWER,
    level_text,
)
from harness.show.format import (
    MESSAGE_NOTE,
    bound_text,
    caption,
    exit_words,
    number,
    phase_caption,
)
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


HEADLINE_WORDS = {
    FASTER: "B is faster",
    SLOWER: "B is slower",
    NO_CHANGE: "No change",
    NO_VERDICT: "No verdict",
}


AA_NOTE = (
    "**An A/A run**: arms A and B run the same code and settings, so every change below is "
    "this machine's noise between servers, not a change of the code (docs/GLOSSARY.md)."
)


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
        *([Text(AA_NOTE)] if evidence.manifest.get("aa_check") else []),
        Text("Setup: " + setup(evidence)),
        figure_table(c, a, b),
        Text(f"*{caption(c)}*"),
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
            Text(f"*{phase_caption(c)}.*"),
            *image("phases"),
        ]
    if c.messages:
        heading = Heading("Message cost (ms per request)")
        blocks += [heading, message_table(c, a, b), Text(f"*{MESSAGE_NOTE}.*")]
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
    if f.change.ratio is not None and f.change.low is None:
        change = f", change {f.change.ratio - 1:+.1%} (descriptive: one run a side, no interval)"
    elif f.change.ratio is not None:
        change = (
            f", change {f.change.ratio - 1:+.1%} ({level_text(c.rule.level)} CI "
            f"{bound_text(f.change.low - 1)} .. {bound_text(f.change.high - 1)})"
        )
    if c.unit == BETWEEN_RUNS:
        over = f"over {f.change.blocks} recorded run(s), each run one replicate"
    else:
        one = ": no verdict from one block, where position is confounded with the arm"
        over = f"over {f.change.blocks} block(s){one if f.change.method == ONE_BLOCK else ''}"
    said = f"**{words}** on {f.label}: A {number(f.a)} → B {number(f.b)} {f.unit}{change}, {over}"
    return said + exit_words(c) + "."


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
    driven = load_text(m.get("load") or {"concurrency": m.get("concurrency", "?")})
    return (
        f"{device}; {scenario.get('name', '?')} {scenario.get('size', '')}, {driven}; "
        f"schedule {schedule(m, c)}; {per_arm} servers "
        f"(A / B), each {load} + {m.get('warmup', '?')} warmup requests; "
        f"{measured:,} measured requests, {failed:,} failed."
    )


def schedule(manifest: dict, c: Comparison) -> str:
    """`ABBA × 3` when the schedule repeats one block, `ABBA / BAAB × 4` when it alternates
    two (analysis.block_model.schedule), else the letters."""
    letters = list(manifest.get("schedule") or [s.letter for s in c.servers])
    blocks = len({s.block for s in c.servers}) or 1
    size = len(letters) // blocks
    block = letters[:size]
    if block and block * blocks == letters:
        return f"{''.join(block)} × {blocks}"
    pair = letters[: 2 * size]
    if blocks > 1 and (pair * blocks)[: len(letters)] == letters:
        return f"{''.join(pair[:size])} / {''.join(pair[size:])} × {blocks}"
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
    """The `bench power` result on record for the scenario, quoted for the headline figure at
    this run's block count, and only when it was measured on this run's setup (machine,
    size, concurrency: its stamp)."""
    p = evidence.power
    name = (evidence.manifest.get("scenario") or {}).get("name", "?")
    if not p:
        return (
            f"No power result for {name}: `bench power {name}` measures what this setup can detect."
        )
    when = f" ({str(p['created'])[:10]})" if p.get("created") else ""
    problems = mismatch(p, evidence.manifest)
    if problems:
        return (
            f"The power result on record for {name}{when} is not quoted: it was measured on"
            f" another setup ({'; '.join(problems)}); run `bench power` with this run's setup."
        )
    c = evidence.comparison
    label = next((f.label for f in c.figures if f.figure == c.headline), c.headline)
    rates = rates_for(p, c.headline, c.blocks)
    where = f"{name} at c={p.get('concurrency')}{when}"
    if rates is None:
        return f"Power ({where}): no rates for {label} at {c.blocks} block(s)."

    def share(key: str) -> str:
        value = rates.get(key)
        return "-" if value is None else f"{value:.1%}"

    return (
        f"Power ({where}): for {label} with {c.blocks} block(s), false-positive rate"
        f" {share('false_positive_rate')}; a +{PLANTED:.0%} slowdown called slower in"
        f" {share('detection')} of runs, its interval holding the truth in {share('coverage')};"
        f" smallest slowdown called slower in {POWER:.0%}: {share('min_detectable_slowdown')}."
    )

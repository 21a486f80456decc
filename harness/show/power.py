"""`bench power`'s report as rich tables: noise and false positives per figure, what a number
of blocks detects (every rate with its interval over the pool and the draws), the planted
slowdowns expected against measured, and the real A/A blocks' false alarms and position
effects."""

from __future__ import annotations

import math

from rich.console import Group
from rich.table import Table

from harness.analysis.aa_run import PositionEffect
from harness.analysis.phases import POSTPROCESS_WORK
from harness.analysis.power_report import PowerReport
from harness.analysis.power_stats import LARGEST, LEVEL, PLANTED, POWER, Rate
from harness.show.format import percent, significant

LABELS = {"output_tok_per_s": "output tok/s", POSTPROCESS_WORK: "postprocess ms/iter"}


def render(report: PowerReport) -> Group:
    n = report.quoted_blocks
    title = (
        f"{report.scenario} ({report.size}), c={report.concurrency}, {report.blocks} block(s)"
        f" per configuration, iteration {significant(report.iteration_ms)} ms"
    )
    figures = _table(
        title,
        *("figure", "noise (CV)", "server sd", "A/A verdict", f"false pos. ({n} blocks)"),
        "pool (blocks)",
    )
    for f in report.figures:
        fpr = _share(f.false_positive_rate[n])
        row = [LABELS[f.figure], percent(f.cv), percent(f.noise_sd), f.aa_verdict, fpr]
        figures.add_row(*row, str(f.pool))
    parts: list = [figures, _by_blocks(report)]
    if report.levels:
        parts.append(_levels(report))
    if report.real_aa is not None:
        parts += _real_aa(report)
    parts += [f"[yellow]doubt:[/] {d}" for d in report.doubts]
    return Group(*parts)


def _by_blocks(report: PowerReport) -> Table:
    counts = sorted(report.figures[0].min_detectable_slowdown) if report.figures else []
    columns = []
    for f in report.figures:
        label = LABELS[f.figure]
        columns += [f"{label}: false pos.", f"{label}: +{PLANTED:.0%} found / CI holds it"]
        columns.append(f"{label}: found in {POWER:.0%}")
    title = (
        f"synthetic runs of n blocks (ABBA, BAAB, ...) drawn from the real blocks; in brackets"
        f" the {LEVEL:.0%} interval over the pool and the draws"
    )
    table = _table(title, "blocks", *columns)
    for count in counts:
        row = []
        for f in report.figures:
            found = f"{_share(f.detection[count])} / {_share(f.coverage[count])}"
            row += [_share(f.false_positive_rate[count]), found]
            row.append(_slowdown(f.min_detectable_slowdown[count]))
        table.add_row(str(count), *row)
    return table


def _levels(report: PowerReport) -> Table:
    levels = _table(
        "planted slowdowns: B/A expected and measured",
        *("delay", "figure", "expected", "measured (CI)", "verdict"),
    )
    for level in report.levels:
        for figure, change in level.measured.items():
            ratio, low, high = (significant(change[k]) for k in ("ratio", "low", "high"))
            expected = significant(level.expected.get(figure))
            ci = f"{ratio} ({low}..{high})"
            levels.add_row(f"+{level.delay_us} us", LABELS[figure], expected, ci, change["verdict"])
    return levels


def _real_aa(report: PowerReport) -> list[Table]:
    real = report.real_aa
    alarms = _table(
        f"real A/A: {real.blocks} block(s) of output tok/s split into runs of k blocks",
        *("k", "runs called faster or slower"),
    )
    for k, (found, runs) in real.alarms.items():
        alarms.add_row(str(k), f"{found} of {runs}")
    positions = _table(
        "real A/A: each position's servers against their block's mean (95% CI over blocks)",
        *("position", "arms (block by block)", "mean", "CI"),
    )
    for p in [*real.positions, *([real.outer_minus_inner] if real.outer_minus_inner else [])]:
        name = "outer - inner" if p.position < 0 else str(p.position)
        positions.add_row(name, p.letters if p.position >= 0 else "", _offset(p.mean), _ci(p))
    return [alarms, positions]


def _offset(log_value: float | None) -> str:
    return "-" if log_value is None else f"{math.expm1(log_value):+.1%}"


def _ci(p: PositionEffect) -> str:
    return "-" if p.low is None else f"{_offset(p.low)} .. {_offset(p.high)}"


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    return table


def _share(rate: Rate | None) -> str:
    """A share with its interval: 82.3% (64..95%)."""
    if rate is None or rate.value is None:
        return "-"
    if rate.low is None or rate.high is None:
        return percent(rate.value)
    return f"{rate.value:.1%} ({100 * rate.low:.0f}..{100 * rate.high:.0f}%)"


def _slowdown(rate: Rate | None) -> str:
    """The smallest slowdown found, with its interval: +7.9% (+5.3..+9.9%)."""
    if rate is None or rate.value is None:
        return f"> +{LARGEST:.0%}"
    high = f"+{100 * rate.high:.1f}%" if rate.high is not None else f"> +{LARGEST:.0%}"
    low = "" if rate.low is None else f"+{100 * rate.low:.1f}.."
    return f"+{rate.value:.1%} ({low}{high})"

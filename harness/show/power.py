"""`bench power`'s report as rich tables: noise and false positives per figure, the smallest
slowdown detected per block count, and the planted slowdowns expected against measured."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table

from harness.analysis.phases import POSTPROCESS_WORK
from harness.analysis.power import PowerReport
from harness.analysis.power_stats import LARGEST, POWER
from harness.show.format import percent, significant

LABELS = {"output_tok_per_s": "output tok/s", POSTPROCESS_WORK: "postprocess ms/iter"}


def render(report: PowerReport) -> Group:
    n = report.quoted_blocks
    title = (
        f"{report.scenario} ({report.size}), c={report.concurrency}, {report.blocks} block(s)"
        f" per configuration, iteration {significant(report.iteration_ms)} ms"
    )
    figures = _table(title, "figure", "noise (CV)", "A/A verdict", f"false pos. ({n} blocks)")
    for f in report.figures:
        fpr = f.false_positive_rate[n]
        figures.add_row(LABELS[f.figure], percent(f.cv), f.aa_verdict, percent(fpr))
    counts = sorted(report.figures[0].min_detectable_slowdown) if report.figures else []
    labels = [LABELS[f.figure] for f in report.figures]
    detectable = _table(
        f"smallest slowdown called slower in {POWER:.0%} of runs", "blocks", *labels
    )
    for count in counts:
        row = [_slowdown(f.min_detectable_slowdown[count]) for f in report.figures]
        detectable.add_row(str(count), *row)
    levels = _table(
        "planted slowdowns: B/A expected and measured (95% CI)",
        *("delay", "figure", "expected", "measured", "verdict"),
    )
    for level in report.levels:
        for figure, change in level.measured.items():
            ratio, low, high = (significant(change[k]) for k in ("ratio", "low", "high"))
            expected = significant(level.expected.get(figure))
            ci = f"{ratio} ({low}..{high})"
            levels.add_row(f"+{level.delay_us} us", LABELS[figure], expected, ci, change["verdict"])
    doubts = (f"[yellow]doubt:[/] {d}" for d in report.doubts)
    return Group(figures, detectable, levels, *doubts)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    return table


def _slowdown(value: float | None) -> str:
    return f"> +{LARGEST:.0%}" if value is None else f"+{value:.1%}"

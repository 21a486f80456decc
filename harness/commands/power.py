"""`bench power SCENARIO`: how small a slowdown the harness detects on this machine."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console, Group
from rich.table import Table

from engine.config import ConfigError, load_scenario
from harness.errors import BenchError, fail
from harness.phases import POSTPROCESS_WORK
from harness.power import LARGEST, POWER, PowerPlan, PowerReport, measure, write
from harness.progress import RunProgress
from harness.results import new_run_id

LABELS = {"output_tok_per_s": "output tok/s", POSTPROCESS_WORK: "postprocess ms/iter"}
RESULTS = Path(__file__).resolve().parents[2] / "results" / "power"


def main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, help="Requests in flight."),
    blocks: int = typer.Option(3, min=1, help="ABBA blocks per configuration."),
    requests: int = typer.Option(24, min=1, help="Measured requests per server."),
    warmup: int = typer.Option(4, min=0, help="Warmup requests per server."),
    levels: str = typer.Option("0.1,0.5,1", help="Planted delays, fractions of an iteration."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    ref: str = typer.Option("HEAD", help="Code both arms run: a git ref or 'worktree'."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """A/A blocks and blocks with a planted slowdown: false positives, detectable slowdown, noise."""
    console = Console(stderr=True, highlight=False)
    try:
        fractions = tuple(float(x) for x in levels.split(",") if x.strip())
        resolved = load_scenario(scenario, size)
    except (ValueError, ConfigError) as exc:
        fail(f"{exc} (--levels takes fractions such as 0.1,0.5,1)")
    if not fractions or min(fractions) <= 0:
        fail("--levels needs at least one fraction > 0, e.g. 0.1,0.5,1")
    plan = PowerPlan(resolved, concurrency, blocks, requests, warmup, fractions, ref)
    root = RESULTS / new_run_id(resolved.name)
    slots = 4 * blocks * (1 + len(fractions))
    try:
        with RunProgress(console, slots, requests + warmup) as progress:
            report = measure(plan, root, progress.show)
    except BenchError as exc:
        fail(str(exc))
    path = write(report, RESULTS)
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        Console().print(render(report))
        console.print(f"written to {path}; runs in {root}")


def render(report: PowerReport) -> Group:
    n = report.quoted_blocks
    title = (f"{report.scenario} ({report.size}), c={report.concurrency}, {report.blocks} block(s)"
             f" per configuration, iteration {_num(report.iteration_ms)} ms")  # fmt: skip
    figures = _table(title, "figure", "noise (CV)", "A/A verdict", f"false pos. ({n} blocks)")
    for f in report.figures:
        fpr = f.false_positive_rate[n]
        figures.add_row(LABELS[f.figure], _pct(f.cv), f.aa_verdict, _pct(fpr))
    counts = sorted(report.figures[0].min_detectable_slowdown) if report.figures else []
    labels = [LABELS[f.figure] for f in report.figures]
    detectable = _table(
        f"smallest slowdown called slower in {POWER:.0%} of runs", "blocks", *labels
    )
    for count in counts:
        row = [_slowdown(f.min_detectable_slowdown[count]) for f in report.figures]
        detectable.add_row(str(count), *row)
    levels = _table("planted slowdowns: B/A expected and measured (95% CI)",
                    "delay", "figure", "expected", "measured", "verdict")  # fmt: skip
    for level in report.levels:
        for figure, change in level.measured.items():
            ci = f"{_num(change['ratio'])} ({_num(change['low'])}..{_num(change['high'])})"
            expected = _num(level.expected.get(figure))
            levels.add_row(f"+{level.delay_us} us", LABELS[figure], expected, ci, change["verdict"])
    doubts = (f"[yellow]doubt:[/] {d}" for d in report.doubts)
    return Group(figures, detectable, levels, *doubts)


def _table(title: str, *columns: str) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    return table


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _slowdown(value: float | None) -> str:
    return f"> +{LARGEST:.0%}" if value is None else f"+{value:.1%}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"

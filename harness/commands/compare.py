"""`bench compare RUNS_A RUNS_B`: recorded runs (e.g. last night's and today's) as arms A and B
(analysis/pairing.py), with the same tables as `bench run`. Each side is a run directory or a
directory of run directories; the run is the unit, so one run a side gives a descriptive
change and no verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from harness.analysis.pairing import pair_runs, run_labels
from harness.commands import options as o
from harness.commands.blocks import verdict_exit, verdict_rule
from harness.errors import BenchError, ExitCode
from harness.results import RESULTS, load_runs, report_context
from harness.show.comparison import render
from harness.show.console import fail, notes, output
from harness.show.report.evidence import gather
from harness.show.report.write import write_report


def main(
    runs_a: Path = typer.Argument(..., help="Baseline: a run directory, or a directory of them."),
    runs_b: Path = typer.Argument(..., help="Judged against it: a run directory, or several."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    report: Path | None = typer.Option(None, help="Write report.md and plots into this directory."),
    html: bool = typer.Option(False, "--html", help="With --report, also write report.html."),
    margin: float = o.MARGIN_OPTION,
    fail_at: float = o.FAIL_AT_OPTION,
    confidence: float = o.CONFIDENCE_OPTION,
) -> None:
    """Compare recorded runs as arms A and B; exit 1 when B's headline figure is slower by at
    least --fail-at, 4 when a side has no run with a usable headline.

    A verdict needs two or more runs of each side; one run a side is descriptive (exit 0)."""
    try:
        sides = [load_runs(runs_a), load_runs(runs_b)]
    except BenchError as exc:
        fail(str(exc))
    for path, manifest, _ in (run for side in sides for run in side):
        if manifest.get("kind") == "sweep":  # its servers ran at different loads
            fail(f"{path} is a sweep; compare two arms' curves with bench sweep --arm twice")
    paths = [[str(p) for p, _, _ in side] for side in sides]
    runs = [[(m, f) for _, m, f in side] for side in sides]
    labels = run_labels(*paths, *runs)
    rule = verdict_rule(margin, fail_at, confidence)
    manifest, frames, result = pair_runs(*runs, labels, " ".join(sys.argv), rule)
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
    if report is not None:
        context = report_context(RESULTS, manifest["scenario"].get("name", ""))
        path = write_report(gather(manifest, frames, result, *context), report, html=html)
        notes().print(f"report: {path}")
    if result.failed:
        empty = result.empty_arms
        said = f"side {' and '.join(empty)} has no run with a usable headline" if empty else ""
        fail_line = said or f"failed runs left out: {', '.join(result.failed_servers)}"
        notes().print(f"[yellow]{fail_line}[/]")
        raise typer.Exit(ExitCode.SERVER_FAILED)
    verdict_exit(notes(), result)

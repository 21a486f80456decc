"""`bench compare RUN_A RUN_B`: two recorded runs (e.g. last night's and today's) as arms A and B
(analysis/pairing.py), with the same tables as `bench run`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from harness.analysis.pairing import pair_runs, run_labels
from harness.errors import BenchError
from harness.results import RESULTS, load_run, report_context
from harness.show.comparison import render
from harness.show.console import fail, notes, output
from harness.show.report.evidence import gather
from harness.show.report.write import write_report


def main(
    run_a: Path = typer.Argument(..., help="The baseline run directory (arm A)."),
    run_b: Path = typer.Argument(..., help="The run to judge against it (arm B)."),
    as_json: bool = typer.Option(False, "--json", help="Print the comparison as JSON."),
    report: Path | None = typer.Option(None, help="Write report.md and plots into this directory."),
    html: bool = typer.Option(False, "--html", help="With --report, also write report.html."),
) -> None:
    """Compare two runs' servers as arms A and B; exit 1 when B's headline figure is slower."""
    try:
        runs = [load_run(run_a), load_run(run_b)]
        for path, (_, frames) in zip((run_a, run_b), runs, strict=True):
            if frames["servers"].empty:
                raise BenchError(f"{path} has no servers: nothing was measured; rerun it")
    except BenchError as exc:
        fail(str(exc))
    labels = run_labels(str(run_a), str(run_b), runs[0][0], runs[1][0])
    manifest, frames, result = pair_runs(*runs, labels, " ".join(sys.argv))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
    if report is not None:
        context = report_context(RESULTS, manifest["scenario"].get("name", ""))
        path = write_report(gather(manifest, frames, result, *context), report, html=html)
        notes().print(f"report: {path}")
    if result.regression:
        raise typer.Exit(1)

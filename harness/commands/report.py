"""`bench report RUN_DIR [--html]`: report.md and plots for a pull request, from a run."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.analysis.compare import STATISTICS, Comparison
from harness.analysis.summary import summarize
from harness.errors import BenchError
from harness.results import (
    RESULTS,
    load_run,
    load_summary,
    report_context,
    summarise,
    tables_left_out,
)
from harness.show.console import fail, notes
from harness.show.report.evidence import gather
from harness.show.report.single import write_single_report
from harness.show.report.write import write_report

OLDER_STATISTICS = (
    "summary.json was made with older statistics (docs/STATISTICS.md: before the block + arm"
    " model, or before one block stopped giving verdicts); this report summarised the tables"
    " again and left it as it was"
)


def main(
    run_dir: Path = typer.Argument(..., help="A run directory (results/<run-id>)."),
    html: bool = typer.Option(False, "--html", help="Also write one self-contained report.html."),
) -> None:
    """Write report.md with PNG plots (and report.html) into the run directory."""
    try:
        path = report_run(run_dir, html=html)
    except BenchError as exc:
        fail(str(exc))
    notes().print(f"report: {path}" + (f" and {path.with_name('report.html')}" if html else ""))


def report_run(run_dir: Path, html: bool = False, results: Path = RESULTS) -> Path:
    """The report of a run directory, written into it: its tables and its summary.json (a run
    never summarised, e.g. one whose server failed to start, is summarised now, once). A
    summary.json made with older statistics is laid out summarised again, in memory: it is
    left as it was, and the report says so."""
    manifest, frames = load_run(run_dir)
    if frames["servers"].empty:
        raise BenchError(
            tables_left_out(run_dir, "cannot be reported again")
            or f"{run_dir} has no servers yet: nothing to report"
        )
    comparison = load_summary(run_dir) or summarise(run_dir)
    if not isinstance(comparison, Comparison):  # one target, or a sweep
        return write_single_report(manifest, comparison, run_dir)
    if comparison.statistics < STATISTICS:
        comparison = summarize(manifest, frames)
        comparison.doubts.append(OLDER_STATISTICS)
    calibration, power = report_context(results, manifest.get("scenario", {}).get("name", ""))
    return write_report(gather(manifest, frames, comparison, calibration, power), run_dir, html)

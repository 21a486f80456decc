"""`bench report RUN_DIR [--html]`: report.md and plots for a pull request, from a run."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from harness.errors import BenchError, fail
from harness.report import write_report


def main(
    run_dir: Path = typer.Argument(..., help="A run directory (results/<run-id>)."),
    html: bool = typer.Option(False, "--html", help="Also write one self-contained report.html."),
) -> None:
    """Write report.md with PNG plots (and report.html) into the run directory."""
    try:
        path = write_report(run_dir, html=html)
    except BenchError as exc:
        fail(str(exc))
    console = Console(stderr=True, highlight=False)
    console.print(f"report: {path}" + (f" and {path.with_name('report.html')}" if html else ""))

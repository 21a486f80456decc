"""`bench report RUN_DIR [--html] [--github [--artifact-url URL]]`: report.md and plots for a
pull request, from a run; with --github also comment.md, the body of the pull request's comment
(harness/show/report/github.py; .github/workflows/bench-pr.yml posts it)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.analysis.compare import STATISTICS
from harness.analysis.comparison import Comparison
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
from harness.show.report.github import write_comment
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
    github: bool = typer.Option(
        False, "--github", help="Also write comment.md: the pull request comment's body."
    ),
    artifact_url: str | None = typer.Option(
        None, help="With --github: where the run directory is uploaded (the plots' link)."
    ),
) -> None:
    """Write report.md with PNG plots (and report.html, comment.md) into the run directory."""
    try:
        if artifact_url is not None and not github:
            raise BenchError("--artifact-url goes with --github (the comment links it)")
        if artifact_url is not None and not artifact_url.startswith(("https://", "http://")):
            raise BenchError(f"--artifact-url must be an http(s) URL, not {artifact_url!r}")
        path = report_run(run_dir, html=html, github=github, artifact_url=artifact_url)
    except BenchError as exc:
        fail(str(exc))
    also = [p for p, on in (("report.html", html), ("comment.md", github)) if on]
    notes().print(f"report: {path}" + "".join(f" and {path.with_name(p)}" for p in also))


def report_run(
    run_dir: Path,
    html: bool = False,
    results: Path = RESULTS,
    github: bool = False,
    artifact_url: str | None = None,
) -> Path:
    """The report of a run directory, written into it: its tables and its summary.json (a run
    never summarised, e.g. one whose server failed to start, is summarised now, once). A
    summary.json made with older statistics is laid out summarised again, in memory: it is
    left as it was, and the report says so. `github`: comment.md too (github.py)."""
    manifest, frames = load_run(run_dir)
    if frames["servers"].empty:
        raise BenchError(
            tables_left_out(run_dir, "cannot be reported again")
            or f"{run_dir} has no servers yet: nothing to report"
        )
    comparison = load_summary(run_dir) or summarise(run_dir)
    if not isinstance(comparison, Comparison):  # one target, or a sweep
        if github:
            raise BenchError(f"{run_dir} compares no arms: --github comments on a bench run")
        return write_single_report(manifest, comparison, run_dir)
    if comparison.statistics < STATISTICS:
        comparison = summarize(manifest, frames)
        comparison.doubts.append(OLDER_STATISTICS)
    calibration, power = report_context(results, manifest.get("scenario", {}).get("name", ""))
    evidence = gather(manifest, frames, comparison, calibration, power)
    path = write_report(evidence, run_dir, html)
    if github:
        write_comment(evidence, run_dir, artifact_url)
    return path

"""`bench run SCENARIO --concurrency C [--abba]`: two arms, fresh servers, a verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.analysis.stats import schedule
from harness.commands.report import report_run
from harness.errors import BenchError
from harness.measure.arms import resolve_arms
from harness.measure.request_sequence import build_requests
from harness.measure.runner import RunPlan, run_schedule
from harness.results import RESULTS, RunDir, new_run_id
from harness.show.comparison import render
from harness.show.console import fail, notes, output
from harness.show.progress import RunProgress


def main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    concurrency: int = typer.Option(..., "--concurrency", "-c", min=1, help="Requests in flight."),
    abba: bool = typer.Option(False, "--abba", help="ABBA and BAAB blocks in turn (else AB, BA)."),
    blocks: int = typer.Option(1, min=1, help="Repeat the block this many times."),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice (A then B)."),
    requests: int | None = typer.Option(None, min=1, help="Measured requests per server."),
    duration: float | None = typer.Option(None, min=0.1, help="Seconds of load per server."),
    warmup: int | None = typer.Option(None, min=0, help="Warmup requests per server."),
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    margin: float = typer.Option(0.05, min=0.0, help="No change: whole CI within +-this."),
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Compare two arms on fresh servers; exit 1 when B's headline figure is slower."""
    console = notes()
    if requests is not None and duration is not None:
        fail("give --requests or --duration, not both")
    try:
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        arm_manifests = [_arm_manifest(a, resolved) for a in arms]
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    for a in arms:
        if any(key.startswith("load.") for key in a.overrides):
            fail(f"arm {a.name} overrides the load; both arms must see the same requests")
    warm = resolved.load.warmup if warmup is None else warmup
    measured = resolved.load.requests if requests is None else requests
    if resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    if arms[0].same_code_as(arms[1]):
        console.print("arms A and B run the same code and settings: this is an A/A check")
    letters = schedule(blocks, abba)
    count = warm + (measured if duration is None else 1_000_000)
    plan = RunPlan(
        scenario=resolved,
        arms={a.letter: a for a in arms},
        letters=letters,
        block_size=4 if abba else 2,
        concurrency=concurrency,
        requests=build_requests(resolved.load, _vocab(resolved), count),
        warmup=warm,
        period=period,
        duration_s=duration,
        shards=shards,
        margin=margin,
    )
    run_id = new_run_id(resolved.name)
    rundir = RunDir(out or RESULTS / run_id)
    rundir.write_manifest(plan.manifest(run_id, " ".join(sys.argv), measured, arm_manifests))
    try:
        with RunProgress(console, len(letters), measured + warm) as progress:
            complete, result = run_schedule(plan, rundir, progress.show)
    except BenchError as exc:
        rundir.update_manifest(complete=False, error=str(exc))
        fail(f"{exc} (partial results in {rundir.path})")
    if report:  # before the exit-code checks, so a regression still gets its report
        console.print(f"report: {report_run(rundir.path)}")
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
        console.print(f"results: {rundir.path}")
    if not complete:
        console.print("[yellow]interrupted: the results above cover what was measured[/]")
        raise typer.Exit(130)
    if result.regression:
        raise typer.Exit(1)


def _arm_manifest(arm, scenario) -> dict:
    """The arm as resolved: its scenario with its overrides applied (none for a URL arm)."""
    resolved = None
    if arm.kind != "url":
        resolved = load_scenario(scenario.name, scenario.size, arm.overrides).to_dict()
    return {**arm.manifest(), "scenario": resolved}


def _vocab(scenario) -> int:
    from engine.models import vocab_size

    return vocab_size(scenario.model)

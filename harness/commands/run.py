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
from harness.measure.preflight import preflight
from harness.measure.request_sequence import build_requests
from harness.measure.runner import STALL_S, RunPlan, run_schedule
from harness.results import RunDir, new_run_id, new_run_path
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
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace the run already in --out."),
    stall_timeout: float = typer.Option(
        STALL_S, min=1, help="Seconds without a finished request before a server has stalled."
    ),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    margin: float = typer.Option(0.05, min=0.0, help="No change: whole CI within +-this."),
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Compare two arms on fresh servers; exit 1 when B's headline figure is slower, 3 when a
    server failed during the run (left out of the comparison), 2 on an error."""
    console = notes()
    if requests is not None and duration is not None:
        fail("give --requests or --duration, not both")
    try:
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        engines = {a.letter: _arm_scenario(a, resolved) for a in arms}
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
        stall_s=stall_timeout,
        margin=margin,
    )
    arm_manifests = [_arm_manifest(a, engines[a.letter]) for a in arms]
    try:
        preflight(plan, engines)  # before any server starts, or any file is written
        rundir = RunDir.fresh(out, overwrite) if out else RunDir(new_run_path(resolved.name))
        run_id = new_run_id(resolved.name) if out else rundir.path.name
        rundir.write_manifest(plan.manifest(run_id, " ".join(sys.argv), measured, arm_manifests))
    except BenchError as exc:
        fail(str(exc))
    try:
        with RunProgress(console, len(letters), measured + warm) as progress:
            complete, result = run_schedule(plan, rundir, progress.show)
    except BenchError as exc:
        if "error" not in rundir.manifest:  # a failed write has recorded its own
            rundir.update_manifest(error=str(exc))
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
    failed = rundir.manifest.get("failed_servers")
    if failed:
        console.print(f"[yellow]failed and left out of the comparison: {', '.join(failed)}[/]")
        raise typer.Exit(4)  # a server failed: not a verdict on the whole schedule
    if result.regression:
        raise typer.Exit(1)


def _arm_scenario(arm, scenario):
    """The scenario the arm's servers run, its overrides applied (None for a URL arm)."""
    if arm.kind == "url":
        return None
    return load_scenario(scenario.source, scenario.size, arm.overrides)


def _arm_manifest(arm, scenario) -> dict:
    """The arm as resolved, with the scenario its servers run (scenarios/<letter>.yaml)."""
    if scenario is None:
        return {**arm.manifest(), "scenario": None, "scenario_file": None}
    file = f"scenarios/{arm.letter}.yaml"
    return {**arm.manifest(), "scenario": scenario.to_dict(), "scenario_file": file}


def _vocab(scenario) -> int:
    from engine.models import vocab_size

    return vocab_size(scenario.model)

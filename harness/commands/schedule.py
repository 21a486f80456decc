"""Running a plan for `bench run`, `bench measure` and `bench sweep`: the run directory, the
manifest, progress, the schedule, a failure said in one line. Not a command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console

from harness.analysis.summary import Summary
from harness.errors import BenchError
from harness.measure.runner import RunPlan, run_schedule
from harness.results import RESULTS, RunDir, new_run_id
from harness.show.console import fail, output
from harness.show.progress import RunProgress


def execute(
    plan: RunPlan,
    console: Console,
    out: Path | None,
    measured: int,
    arms: list[dict],
    **manifest,
) -> tuple[RunDir, bool, Summary]:
    """Run the plan into `out` (default results/<run-id> under the current directory): the
    run directory, whether the schedule finished, and the run's summary."""
    run_id = new_run_id(plan.scenario.name)
    rundir = RunDir(out or RESULTS / run_id)
    command = " ".join(redacted(sys.argv))
    rundir.write_manifest(plan.manifest(run_id, command, measured, arms, **manifest))
    try:
        with RunProgress(console, len(plan.letters), measured + plan.warmup) as progress:
            complete, summary = run_schedule(plan, rundir, progress.show)
    except BenchError as exc:
        rundir.update_manifest(complete=False, error=str(exc))
        fail(f"{exc} (partial results in {rundir.path})")
    return rundir, complete, summary


def conclude(
    console: Console, rundir: RunDir, complete: bool, summary: Summary, shown, as_json: bool
) -> None:
    """Print the summary (JSON, or `shown`, its tables) and where it lies; exit 130 when the
    schedule was cut short. The caller then says whether the figures fail the run (exit 1)."""
    if as_json:
        print(json.dumps(summary.to_json(), indent=2))
    else:
        output().print(shown)
        console.print(f"results: {rundir.path}")
    if not complete:
        console.print("[yellow]interrupted: the results above cover what was measured[/]")
        raise typer.Exit(130)


def redacted(argv: list[str]) -> list[str]:
    """The command line with --header values hidden (they may carry credentials)."""
    out = list(argv)
    for i, word in enumerate(out):
        if word.startswith("--header="):
            out[i] = "--header=" + word.split("=", 1)[1].split(":", 1)[0] + ":***"
        elif word == "--header" and i + 1 < len(out):
            out[i + 1] = out[i + 1].split(":", 1)[0] + ":***"
    return out


def arm_manifest(arm, scenario) -> dict:
    """The arm as resolved: its scenario with its overrides applied (none for a URL arm)."""
    from engine.config import load_scenario

    resolved = None
    if arm.kind != "url":
        resolved = load_scenario(scenario.name, scenario.size, arm.overrides).to_dict()
    return {**arm.manifest(), "scenario": resolved}


def vocab(scenario) -> int:
    from engine.models import vocab_size

    return vocab_size(scenario.model)

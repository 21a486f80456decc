"""`bench measure TARGET`: one server (a scenario's fresh engine, or a URL), no comparison."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.commands.schedule import arm_manifest, conclude, execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve
from harness.show.console import fail, notes
from harness.show.measurement import render


@w.with_load_options()
def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine) or a server's URL."),
    slo_attainment: float = typer.Option(
        0.99, min=0.0, max=1.0, help="Share of requests that must meet --goodput, else exit 1."
    ),
    scenario: str = typer.Option("qwen35", help="For a URL: the scenario whose load to send."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    report: bool = typer.Option(False, "--report", help="Write report.md too."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    load_options: dict | None = None,
) -> None:
    """Measure one target: figures, goodput, phases; exit 1 when an SLO (--goodput) is missed."""
    console = notes()
    url = target.startswith(("http://", "https://"))
    try:
        resolved = load_scenario(scenario if url else target, size)
        arm = resolve("A", target, target if url else "worktree")
        load = w.workload(resolved, vocab(resolved), **load_options)
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if not url and resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    plan = load.plan(resolved, {"A": arm}, ["A"], 1, period, shards)
    manifest = {"kind": "measure", "goodput": load.slos_ms, "slo_attainment": slo_attainment}
    arms = [arm_manifest(arm, resolved)]
    rundir, complete, result = execute(plan, console, out, load.measured, arms, **manifest)
    if report:
        console.print(f"report: {report_run(rundir.path)}")
    conclude(console, rundir, complete, result, render(result), as_json)
    if result.slo_missed:
        raise typer.Exit(1)

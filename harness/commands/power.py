"""`bench power SCENARIO`: how small a slowdown the harness detects on this machine."""

from __future__ import annotations

import json

import typer

from harness.errors import BenchError
from harness.measure.power import PowerPlan, measure
from harness.results import RESULTS, new_run_id, write_power
from harness.scenario import ConfigError, load_scenario
from harness.show.console import fail, notes, output
from harness.show.power import render
from harness.show.progress import RunProgress


def main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    concurrency: int = typer.Option(4, "--concurrency", "-c", min=1, help="Requests in flight."),
    blocks: int = typer.Option(3, min=1, help="ABBA blocks per configuration."),
    requests: int = typer.Option(24, min=1, help="Measured requests per server."),
    warmup: int = typer.Option(4, min=0, help="Warmup requests per server."),
    levels: str = typer.Option("0.1,0.5,1", help="Planted delays, fractions of an iteration."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    ref: str = typer.Option("HEAD", help="Code both arms run: a git ref or 'worktree'."),
    aa_only: bool = typer.Option(False, "--aa-only", help="A/A blocks only, no planted levels."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """A/A blocks and blocks with a planted slowdown: false positives, detectable slowdown, noise."""
    console = notes()
    try:
        fractions = () if aa_only else tuple(float(x) for x in levels.split(",") if x.strip())
        resolved = load_scenario(scenario, size)
    except (ValueError, ConfigError) as exc:
        fail(f"{exc} (--levels takes fractions such as 0.1,0.5,1)")
    if not aa_only and (not fractions or min(fractions) <= 0):
        fail("--levels needs at least one fraction > 0, e.g. 0.1,0.5,1 (or give --aa-only)")
    plan = PowerPlan(resolved, concurrency, blocks, requests, warmup, fractions, ref)
    root = RESULTS / "power" / new_run_id(resolved.name)
    slots = 4 * blocks * (1 + len(fractions))
    try:
        with RunProgress(console, slots, requests + warmup) as progress:
            report = measure(plan, root, progress.show)
    except BenchError as exc:
        fail(str(exc))
    path = write_power(report.to_json())
    if as_json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        output().print(render(report))
        console.print(f"written to {path}; runs in {root}")

"""`bench run SCENARIO --concurrency C [--abba]`: two arms, fresh servers, a verdict."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.commands.schedule import arm_manifest, conclude, execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve_arms
from harness.show.comparison import render
from harness.show.console import fail, notes

HELP = """Compare two arms on fresh servers; exit 1 when B's headline figure is slower.

\b
Arms: --arm NAME=SPEC, twice (A then B). Default: A = the merge-base of HEAD
with main, B = the working tree. SPEC is one of:
  main                  a git ref (of this directory's repository)
  worktree              the working tree, uncommitted changes included
  engine.mixing=true    the working tree with scenario overrides
  http://host:8000      a running OpenAI-compatible server (no spans)
\b
Examples:
  bench run qwen35 -c 64 --abba
  bench run qwen35 -c 64 --abba --blocks 3 --arm base=main --arm new=worktree
  bench run qwen35 -c 64 --arm off=worktree --arm on=engine.mixing=true
  bench run qwen35 --request-rate 20 --arm a=main --arm b=worktree
"""


def _main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    abba: bool = typer.Option(False, "--abba", help="Run A B B A blocks (else A B)."),
    blocks: int = typer.Option(1, min=1, help="Repeat the block this many times."),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice (A then B); see above."),
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    load_options: dict | None = None,
) -> None:
    console = notes()
    try:
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        arm_manifests = [arm_manifest(a, resolved) for a in arms]
        load = w.workload(resolved, vocab(resolved), **load_options)
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    for a in arms:
        if any(key.startswith("load.") for key in a.overrides):
            fail(f"arm {a.name} overrides the load; both arms must see the same requests")
    if resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    if arms[0].same_code_as(arms[1]):
        console.print("arms A and B run the same code and settings: this is an A/A check")
    letters = (["A", "B", "B", "A"] if abba else ["A", "B"]) * blocks
    arms_by_letter = {a.letter: a for a in arms}
    plan = load.plan(resolved, arms_by_letter, letters, 4 if abba else 2, period, shards)
    rundir, complete, result = execute(plan, console, out, load.measured, arm_manifests)
    if report:  # before the exit-code checks, so a regression still gets its report
        console.print(f"report: {report_run(rundir.path)}")
    conclude(console, rundir, complete, result, render(result), as_json)
    if result.regression:
        raise typer.Exit(1)


_main.__doc__ = HELP
main = w.with_load_options(*(name for name in w.OPTIONS if name != "goodput"))(_main)

"""`bench run SCENARIO --concurrency C [--abba]`: two arms, fresh servers, a verdict."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.commands.schedule import execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve_arms
from harness.measure.runner import RunPlan
from harness.show.comparison import render
from harness.show.console import fail, notes, output

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


def main(
    scenario: str = typer.Argument(..., help="Scenario name (bench scenarios lists them)."),
    concurrency: int | None = w.CONCURRENCY,
    abba: bool = typer.Option(False, "--abba", help="Run A B B A blocks (else A B)."),
    blocks: int = typer.Option(1, min=1, help="Repeat the block this many times."),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice (A then B); see above."),
    requests: int | None = w.REQUESTS,
    duration: float | None = w.DURATION,
    warmup: int | None = w.WARMUP,
    request_rate: float | None = w.REQUEST_RATE,
    burstiness: float = w.BURSTINESS,
    input_len: int | None = w.INPUT_LEN,
    output_len: int | None = w.OUTPUT_LEN,
    prompts: Path | None = w.PROMPTS,
    tokenizer: str | None = w.TOKENIZER,
    seed: int | None = w.SEED,
    chat: bool = w.CHAT,
    header: list[str] = w.HEADER,
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    report: bool = typer.Option(False, "--report", help="Write report.md and plots too."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    console = notes()
    try:
        resolved = load_scenario(scenario, size)
        arms = resolve_arms(arm)
        arm_manifests = [_arm_manifest(a, resolved) for a in arms]
        load = w.workload(
            resolved,
            vocab(resolved),
            concurrency=concurrency,
            requests=requests,
            duration=duration,
            warmup=warmup,
            request_rate=request_rate,
            burstiness=burstiness,
            input_len=input_len,
            output_len=output_len,
            prompts=prompts,
            tokenizer=tokenizer,
            seed=seed,
            chat=chat,
            header=header,
            goodput=None,
        )
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    for a in arms:
        if any(key.startswith("load.") for key in a.overrides):
            fail(f"arm {a.name} overrides the load; both arms must see the same requests")
    if resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    if arms[0].same_code_as(arms[1]):
        console.print("arms A and B run the same code and settings: this is an A/A check")
    plan = RunPlan(
        scenario=resolved,
        arms={a.letter: a for a in arms},
        letters=(["A", "B", "B", "A"] if abba else ["A", "B"]) * blocks,
        block_size=4 if abba else 2,
        concurrency=load.concurrency,
        requests=load.requests,
        warmup=load.warmup,
        period=period,
        duration_s=duration,
        shards=shards,
        arrivals=load.arrivals,
        headers=load.headers,
        chat=load.chat,
    )
    rundir, complete, result = execute(plan, console, out, load.measured, arm_manifests)
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


main.__doc__ = HELP


def _arm_manifest(arm, scenario) -> dict:
    """The arm as resolved: its scenario with its overrides applied (none for a URL arm)."""
    resolved = None
    if arm.kind != "url":
        resolved = load_scenario(scenario.name, scenario.size, arm.overrides).to_dict()
    return {**arm.manifest(), "scenario": resolved}

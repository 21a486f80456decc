"""`bench measure TARGET`: one server (a scenario's fresh engine, or a URL), no comparison."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.commands.schedule import execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve
from harness.measure.runner import RunPlan
from harness.show.console import fail, notes, output
from harness.show.measurement import render


def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine) or a server's URL."),
    concurrency: int | None = w.CONCURRENCY,
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
    goodput: str | None = w.GOODPUT,
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
) -> None:
    """Measure one target: figures, goodput, phases; exit 1 when an SLO (--goodput) is missed."""
    console = notes()
    url = target.startswith(("http://", "https://"))
    try:
        resolved = load_scenario(scenario if url else target, size)
        arm = resolve("A", target, target if url else "worktree")
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
            goodput=goodput,
        )
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if not url and resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    plan = RunPlan(
        scenario=resolved,
        arms={"A": arm},
        letters=["A"],
        block_size=1,
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
    manifest = {"kind": "measure", "goodput": load.slos_ms, "slo_attainment": slo_attainment}
    arms = [{**arm.manifest(), "scenario": None if url else resolved.to_dict()}]
    rundir, complete, result = execute(plan, console, out, load.measured, arms, **manifest)
    if report:
        console.print(f"report: {report_run(rundir.path)}")
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
        console.print(f"results: {rundir.path}")
    if not complete:
        console.print("[yellow]interrupted: the results above cover what was measured[/]")
        raise typer.Exit(130)
    if result.slo_missed:
        raise typer.Exit(1)

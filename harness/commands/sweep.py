"""`bench sweep TARGET --rates R1,R2,.. | --concurrencies C1,C2,..`: one steady measurement per
load, the throughput-latency curve (sweep.png) and the saturation point."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.schedule import execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.runner import RunPlan, SlotLoad
from harness.show.console import fail, notes, output
from harness.show.measurement import render_sweep


def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine per point) or a URL."),
    rates: str | None = typer.Option(None, help="Request rates, e.g. 1,2,4,8 (open loop)."),
    concurrencies: str | None = typer.Option(None, help="Concurrencies, e.g. 1,4,16 (closed)."),
    concurrency: int | None = w.CONCURRENCY,
    requests: int | None = w.REQUESTS,
    duration: float | None = w.DURATION,
    warmup: int | None = w.WARMUP,
    burstiness: float = w.BURSTINESS,
    input_len: int | None = w.INPUT_LEN,
    output_len: int | None = w.OUTPUT_LEN,
    prompts: Path | None = w.PROMPTS,
    tokenizer: str | None = w.TOKENIZER,
    seed: int | None = w.SEED,
    chat: bool = w.CHAT,
    header: list[str] = w.HEADER,
    goodput: str | None = w.GOODPUT,
    scenario: str = typer.Option("qwen35", help="For a URL: the scenario whose load to send."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Measure one target at each load in turn; the curve and where it saturates."""
    console = notes()
    url = target.startswith(("http://", "https://"))
    try:
        axis, loads = _loads(rates, concurrencies)
        resolved = load_scenario(scenario if url else target, size)
        arm = resolve("A", target, target if url else "worktree")
        load = w.workload(
            resolved,
            vocab(resolved),
            concurrency=concurrency or (1 if axis == "concurrency" else None),
            requests=requests,
            duration=duration,
            warmup=warmup,
            request_rate=loads[0] if axis == "rate" else None,
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
    if axis == "rate":
        count, seed_ = len(load.requests), load.arrivals.seed
        points = [
            SlotLoad(load.concurrency, ArrivalSchedule(r, burstiness, seed_, count)) for r in loads
        ]
    else:
        points = [SlotLoad(int(c)) for c in loads]
    plan = RunPlan(
        scenario=resolved,
        arms={"A": arm},
        letters=["A"] * len(points),
        block_size=1,
        concurrency=points[0].concurrency,
        requests=load.requests,
        warmup=load.warmup,
        period=period,
        duration_s=duration,
        shards=shards,
        headers=load.headers,
        chat=load.chat,
        points=points,
    )
    manifest = {
        "kind": "sweep",
        "axis": axis,
        "points": [{"server": f"A{i}", "load": x} for i, x in enumerate(loads)],
        "goodput": load.slos_ms,
    }
    arms = [{**arm.manifest(), "scenario": None if url else resolved.to_dict()}]
    rundir, complete, result = execute(plan, console, out, load.measured, arms, **manifest)
    from harness.show.report.curve import draw_sweep  # matplotlib: only when drawing

    plot = draw_sweep(result, rundir.path / "sweep.png")
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render_sweep(result))
        console.print(f"curve: {plot}\nresults: {rundir.path}")
    if not complete:
        raise typer.Exit(130)


def _loads(rates: str | None, concurrencies: str | None) -> tuple[str, list[float]]:
    if (rates is None) == (concurrencies is None):
        raise BenchError("give --rates or --concurrencies (a comma-separated list)")
    axis, text = ("rate", rates) if rates is not None else ("concurrency", concurrencies)
    try:
        loads = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BenchError(f"--{axis}: {text!r} is not a list of numbers") from None
    if not loads or min(loads) <= 0 or (axis == "concurrency" and any(x != int(x) for x in loads)):
        raise BenchError(f"--{axis} values must be > 0 (whole numbers for concurrencies)")
    return axis, sorted(set(loads))

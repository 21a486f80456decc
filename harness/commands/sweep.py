"""`bench sweep TARGET --rates R1,R2,.. | --concurrencies C1,C2,..`: one steady measurement per
load, the throughput-latency curve (sweep.png) and the saturation point."""

from __future__ import annotations

from pathlib import Path

import typer

from engine.config import ConfigError, load_scenario
from harness.commands import workload as w
from harness.commands.schedule import conclude, execute, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.runner import SlotLoad
from harness.show.console import fail, notes
from harness.show.measurement import render_sweep


@w.with_load_options(*(name for name in w.OPTIONS if name != "request_rate"))
def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine per point) or a URL."),
    rates: str | None = typer.Option(None, help="Request rates, e.g. 1,2,4,8 (open loop)."),
    concurrencies: str | None = typer.Option(None, help="Concurrencies, e.g. 1,4,16 (closed)."),
    scenario: str = typer.Option("qwen35", help="For a URL: the scenario whose load to send."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    period: int = typer.Option(100, min=1, help="Span window in worker iterations."),
    shards: int = typer.Option(1, min=1, help="Client processes for the load."),
    out: Path | None = typer.Option(None, help="Run directory (default results/<run-id>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    load_options: dict | None = None,
) -> None:
    """Measure one target at each load in turn; the curve and where it saturates."""
    console = notes()
    url = target.startswith(("http://", "https://"))
    try:
        axis, loads = _loads(rates, concurrencies)
        resolved = load_scenario(scenario if url else target, size)
        arm = resolve("A", target, target if url else "worktree")
        first = {"concurrency": 1} if axis == "concurrency" else {"request_rate": loads[0]}
        load = w.workload(resolved, vocab(resolved), **(load_options | first))
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if axis == "rate":
        count, seed_ = len(load.requests), load.arrivals.seed
        points = [
            SlotLoad(load.concurrency, ArrivalSchedule(r, load.arrivals.burstiness, seed_, count))
            for r in loads
        ]
    else:
        points = [SlotLoad(int(c)) for c in loads]
    plan = load.plan(resolved, {"A": arm}, ["A"] * len(points), 1, period, shards, points)
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
    console.print(f"curve: {plot}")
    conclude(console, rundir, complete, result, render_sweep(result), as_json)


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

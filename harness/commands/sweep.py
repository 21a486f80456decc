"""`bench sweep TARGET --rates R1,R2,.. | --concurrencies C1,C2,..`: one steady measurement per
load, the throughput-latency curve (sweep.png) and the saturation point; with `--arm` twice,
the same sweep for two arms of the scenario TARGET, A B then B A at alternate loads."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from harness.commands import options as o
from harness.commands import schedule as s
from harness.commands import workload as w
from harness.commands.targets import arm_scenarios, is_url, target_arm, vocab
from harness.errors import BenchError
from harness.measure.arms import resolve_arms
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.run_plan import SlotLoad
from harness.scenario import ConfigError, load_scenario
from harness.show.console import fail, notes
from harness.show.measurement import render_sweep


def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine per point) or a URL."),
    rates: str | None = typer.Option(None, help="Request rates, e.g. 1,2,4,8 (open loop)."),
    concurrencies: str | None = typer.Option(None, help="Concurrencies, e.g. 1,4,16 (closed)."),
    arm: list[str] = typer.Option([], "--arm", help="NAME=SPEC, twice: two arms (bench run's)."),
    scenario: str = o.URL_SCENARIO,
    size: str | None = o.SIZE,
    period: int = o.PERIOD,
    shards: int = o.SHARDS,
    out: Path | None = o.OUT,
    overwrite: bool = o.OVERWRITE,
    stall_timeout: float = o.STALL_TIMEOUT,
    time_budget: float | None = o.TIME_BUDGET,
    cluster: str | None = o.CLUSTER,
    as_json: bool = o.AS_JSON,
    # the load (options.py), gathered in w.LoadOptions below
    concurrency: int | None = o.CONCURRENCY,
    requests: int | None = o.REQUESTS,
    duration: float | None = o.DURATION,
    warmup: int | None = o.WARMUP,
    burstiness: float = o.BURSTINESS,
    input_len: int | None = o.INPUT_LEN,
    output_len: int | None = o.OUTPUT_LEN,
    prompts: Path | None = o.PROMPTS,
    tokenizer: str | None = o.TOKENIZER,
    seed: int | None = o.SEED,
    chat: bool = o.CHAT,
    header: list[str] = o.HEADER,
    goodput: str | None = o.GOODPUT,
) -> None:
    """Measure one target at each load in turn; the curve and where it saturates."""
    console = notes()
    try:
        axis, loads = _loads(rates, concurrencies)
        if arm and is_url(target):
            raise BenchError("with --arm, TARGET is the scenario; give a URL as an arm's SPEC")
        if arm:
            resolved, arms = load_scenario(target, size), resolve_arms(arm)
        else:
            resolved, one = target_arm(target, scenario, size)
            arms = [one]
        if resolved.load.api != "completions":
            raise BenchError(
                f"bench sweep draws tok/s curves; {resolved.name}'s load is {resolved.load.api}:"
                " measure each load with bench measure"
            )
        options = w.LoadOptions.given(locals())
        # the run's concurrency is the most in flight at any point (the manifest's and the
        # checks'); each point's own load is in `points` below
        swept = {"concurrency": int(max(loads))} if axis == "concurrency" else {}
        swept = swept or {"request_rate": loads[0]}
        load = w.workload(resolved, vocab(resolved), replace(options, **swept))
        engines = arm_scenarios(arms, resolved)
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    # each load once per arm, A B then B A, so drift over the sweep falls on both arms alike
    orders = [[a.letter for a in arms][:: 1 if i % 2 == 0 else -1] for i in range(len(loads))]
    letters = [letter for order in orders for letter in order]
    at = [x for x, order in zip(loads, orders, strict=True) for _ in order]
    if axis == "rate":
        count, seed_ = len(load.requests), load.arrivals.seed
        burst = load.arrivals.burstiness
        points = [SlotLoad(load.concurrency, ArrivalSchedule(r, burst, seed_, count)) for r in at]
    else:
        points = [SlotLoad(int(c)) for c in at]
    by_letter = {a.letter: a for a in arms}
    plan = load.plan(
        resolved, by_letter, letters, len(arms), period, shards, points, stall_s=stall_timeout,
        time_budget_s=time_budget,
    )  # fmt: skip
    manifest = {
        "kind": "sweep",
        "axis": axis,
        "points": [
            {"server": f"{x}{i}", "letter": x, "load": v}
            for i, (x, v) in enumerate(zip(letters, at, strict=True))
        ],
        "goodput": load.slos_ms,
    }
    rundir, complete, result = s.execute(
        plan, engines, console, out, overwrite, load.measured, cluster=cluster, **manifest
    )
    from harness.show.report.curve import draw_sweep  # matplotlib: only when drawing

    plot = draw_sweep(result, rundir.path / "sweep.png")
    console.print(f"curve: {plot}")
    s.conclude(console, rundir, complete, result, render_sweep(result), as_json)


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

"""`bench measure TARGET`: one server (a scenario's fresh engine, or a URL), no comparison."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.commands import options as o
from harness.commands import schedule as s
from harness.commands import workload as w
from harness.commands.report import report_run
from harness.commands.targets import arm_scenarios, is_url, target_arm, vocab
from harness.errors import BenchError, ExitCode
from harness.scenario import ConfigError
from harness.show.console import fail, notes
from harness.show.measurement import render


def main(
    target: str = typer.Argument(..., help="A scenario (a fresh engine) or a server's URL."),
    slo_attainment: float = typer.Option(
        0.99, min=0.0, max=1.0, help="Share of requests that must meet --goodput, else exit 1."
    ),
    scenario: str = o.URL_SCENARIO,
    size: str | None = o.SIZE,
    period: int = o.PERIOD,
    shards: int = o.SHARDS,
    out: Path | None = o.OUT,
    overwrite: bool = o.OVERWRITE,
    stall_timeout: float = o.STALL_TIMEOUT,
    report: bool = typer.Option(False, "--report", help="Write report.md too."),
    clients: int = typer.Option(
        1,
        min=1,
        help="Client hosts for a URL's load: Ray actors on --cluster's nodes (default: a local"
        " Ray), each driving its share of -c; their clocks measured and aligned (docs/SCALE.md).",
    ),
    cluster: str | None = o.CLUSTER,
    as_json: bool = o.AS_JSON,
    # the load (options.py), gathered in w.LoadOptions below
    concurrency: int | None = o.CONCURRENCY,
    requests: int | None = o.REQUESTS,
    duration: float | None = o.DURATION,
    warmup: int | None = o.WARMUP,
    request_rate: float | None = o.REQUEST_RATE,
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
    """Measure one target: figures, goodput, phases; exit 1 when an SLO (--goodput) is missed.

    Exit 4 when its server failed, 2 on an error, 3 on a crash, 130 when interrupted."""
    console = notes()
    try:
        resolved, arm = target_arm(target, scenario, size)
        engines = arm_scenarios([arm], resolved)
        options = w.LoadOptions.given(locals())
        load = w.workload(resolved, vocab(resolved), options)
    except (ConfigError, BenchError) as exc:
        fail(str(exc))
    if not is_url(target) and resolved.size_reason != "asked for":
        console.print(f"size [bold]{resolved.size}[/] ({resolved.size_reason})")
    plan = load.plan(resolved, {"A": arm}, ["A"], 1, period, shards, stall_s=stall_timeout)
    manifest = {"kind": "measure", "goodput": load.slos_ms, "slo_attainment": slo_attainment}
    if clients > 1:
        plan, manifest["clients"] = _on_clients(target, clients, cluster, plan)
        cluster = None  # the clients run there; the slot itself runs here
    try:
        rundir, complete, result = s.execute(
            plan, engines, console, out, overwrite, load.measured, cluster=cluster, **manifest
        )
    finally:
        if plan.clients is not None:
            plan.clients.close()
    if report:
        console.print(f"report: {report_run(rundir.path)}")
    s.conclude(console, rundir, complete, result, render(result), as_json)
    if result.slo_missed:
        raise typer.Exit(ExitCode.SLOWER)


def _on_clients(target: str, clients: int, cluster: str | None, plan):
    """The plan with its load driven from `clients` Ray actors, and their manifest entries."""
    from dataclasses import replace

    try:
        if not is_url(target):
            raise BenchError("--clients drives a running server from several hosts: give its URL")
        if clients > plan.concurrency:
            raise BenchError(f"--clients {clients} is more than -c {plan.concurrency} lanes")
        from harness.cluster.connect import connect

        connect(cluster or "auto")
        from harness.cluster.clients import ClientPool

        pool = ClientPool(clients)
    except BenchError as exc:
        fail(str(exc))
    return replace(plan, clients=pool), pool.manifest()

"""`bench nightly [--since REV] [--publish]`: asv over main's new commits; flag the steps."""

from __future__ import annotations

import json

import typer
from rich.console import Console, Group
from rich.table import Table

from harness.errors import BenchError, fail
from harness.nightly import NightlyResult, nightly


def main(
    since: str | None = typer.Option(None, help="Measure every commit of main after REV."),
    publish: bool = typer.Option(False, "--publish", help="Write the asv HTML too."),
    machine: str | None = typer.Option(None, help="asv machine name (default: hostname)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Record each new commit of main with asv; exit 1 when asv's step detection finds a
    regression, 2 when the suite failed on main's tip."""
    try:
        result = nightly(since, publish, machine)
    except BenchError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        Console().print(render(result))
    if result.regressions:
        raise typer.Exit(1)
    if result.tip_failed:
        raise typer.Exit(2)


def render(result: NightlyResult) -> Group:
    measured = ", ".join(c[:8] for c in result.measured) or "none (all measured)"
    lines = [f"{result.branch} on machine {result.machine}: measured {measured}"]
    if result.failed:
        failed = ", ".join(c[:8] for c in result.failed)
        lines.append(f"[yellow]asv reported failed benchmarks at {failed}[/] (see its output)")
    if result.html:
        lines.append(f"HTML: {result.html}")
    if not result.regressions:
        return Group(*lines, "[green]no regression[/]")
    table = Table(title="regressions (asv step detection; every figure is a cost)")
    for column in ("benchmark", "commits", "before", "after", "change"):
        table.add_column(column)
    for r in result.regressions:
        table.add_row(r.benchmark, f"{r.before[:8]}..{r.after[:8]}", f"{r.old:.4g}",
                      f"{r.new:.4g}", f"{r.ratio - 1:+.1%}")  # fmt: skip
    return Group(*lines, table)

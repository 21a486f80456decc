"""`bench nightly [--since REV] [--publish] [--cluster ADDR]`: asv over main's new commits; flag
new steps."""

from __future__ import annotations

import json

import typer

from harness.errors import BenchError, ExitCode
from harness.measure.nightly import nightly
from harness.show.console import fail, output
from harness.show.nightly import render


def main(
    since: str | None = typer.Option(None, help="Measure every commit of main after REV."),
    publish: bool = typer.Option(False, "--publish", help="Write the asv HTML too."),
    machine: str | None = typer.Option(None, help="asv machine name (default: hostname)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
    cluster: str | None = typer.Option(
        None,
        "--cluster",
        help="Record each commit as a Ray task on one GPU (or a CPU): 'auto' (a local Ray),"
        " ray://HOST:PORT or HOST:PORT; this process alone writes asv's results (docs/SCALE.md).",
    ),
) -> None:
    """Record each new commit of main with asv; exit 1 when a new step up is found.

    A step is reported (exit 1) on the night its test first could be made; later nights list
    it as known. Exit 2 when the suite failed on main's tip, or a cluster lost a commit."""
    try:
        result = nightly(since, publish, machine, cluster)
    except BenchError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
    if result.new_regressions:
        raise typer.Exit(ExitCode.SLOWER)
    if result.tip_failed or result.lost:
        raise typer.Exit(ExitCode.ERROR)

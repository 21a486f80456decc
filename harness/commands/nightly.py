"""`bench nightly [--since REV] [--publish]`: asv over main's new commits; flag new steps."""

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
) -> None:
    """Record each new commit of main with asv; exit 1 when a new step up is found.

    A step is reported (exit 1) on the night its test first could be made; later nights list
    it as known. Exit 2 when the suite failed on main's tip."""
    try:
        result = nightly(since, publish, machine)
    except BenchError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        output().print(render(result))
    if result.new_regressions:
        raise typer.Exit(ExitCode.SLOWER)
    if result.tip_failed:
        raise typer.Exit(ExitCode.ERROR)

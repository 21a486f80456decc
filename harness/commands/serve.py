"""`bench serve`: `python -m engine serve` with the harness's defaults, in the foreground; the
server dies with it, even when `bench` is killed with SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys

import typer

from engine import env
from harness.measure.server import die_with_parent, port_in_use
from harness.show.console import fail


def main(
    scenario: str = typer.Argument(..., help="Scenario name or YAML path."),
    size: str | None = typer.Option(None, help="Model size (default: by machine)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind."),
    port: int = typer.Option(8000, help="TCP port."),
    overrides: str | None = typer.Option(None, "--set", help="key=value,... scenario overrides."),
    period: int = typer.Option(0, min=0, help="Phase timing period in iterations (0: off)."),
    span_file: str | None = typer.Option(None, help="Append span records to this JSONL file."),
) -> None:
    """Start an engine server (API + worker) until Ctrl-C."""
    if port_in_use(port, host):
        fail(f"port {port} is in use; pick another with --port")
    cmd = [sys.executable, "-m", "engine", "serve", scenario, "--host", host, "--port", str(port)]
    if size:
        cmd += ["--size", size]
    if overrides:
        cmd += ["--set", overrides]
    variables = {**os.environ, **env.timing_environment(period, span_file=span_file)}
    try:
        code = subprocess.call(cmd, env=variables, preexec_fn=die_with_parent())
    except KeyboardInterrupt:
        code = 130
    raise typer.Exit(code)

"""`bench calibrate`: the load generator's own error, measured against the mock server."""

from __future__ import annotations

import json

import typer

from harness.errors import BenchError
from harness.measure.calibrate import Settings, calibrate
from harness.results import write_calibration
from harness.show.calibration import render
from harness.show.console import fail, output


def main(
    concurrency: int = typer.Option(256, help="Requests in flight."),
    output_tokens: int = typer.Option(256, help="Tokens per response."),
    itl_ms: float = typer.Option(5.0, help="The mock's time between tokens."),
    ttft_ms: float = typer.Option(20.0, help="The mock's time to first token."),
    duration: float = typer.Option(10.0, help="Seconds of steady load in each of the two runs."),
    shards: int = typer.Option(1, help="Client processes (1 gives the one-core figures)."),
    mock_shards: int = typer.Option(1, help="Mock processes sharing its port."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Drive the mock with the closed loop; report TTFT/ITL error and the client's tokens/s."""
    if min(concurrency, output_tokens, shards, mock_shards) < 1 or duration <= 0:
        fail("--concurrency, --output-tokens, --shards, --mock-shards and --duration must be > 0")
    settings = Settings(concurrency, output_tokens, itl_ms, ttft_ms, duration, shards, mock_shards)
    try:
        result = calibrate(settings)
    except BenchError as e:
        fail(str(e))
    path = write_calibration(result)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        render(result, path, output())

"""`bench calibrate`: the load generator's own error, measured against the mock server."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from harness.calibrate import Settings, calibrate, write
from harness.errors import BenchError, fail


def main(
    concurrency: int = typer.Option(256, help="Requests in flight."),
    output_tokens: int = typer.Option(256, help="Tokens per response."),
    itl_ms: float = typer.Option(5.0, help="The mock's time between tokens."),
    ttft_ms: float = typer.Option(20.0, help="The mock's time to first token."),
    duration: float = typer.Option(10.0, help="Seconds of steady load per run."),
    shards: int = typer.Option(1, help="Client processes (1: the one-core figures)."),
    mock_shards: int = typer.Option(1, help="Mock processes sharing its port."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Drive the mock with the closed loop and report TTFT/ITL error and client throughput."""
    if min(concurrency, output_tokens, shards, mock_shards) < 1 or duration <= 0:
        fail(
            "--concurrency, --output-tokens, --shards, --mock-shards and --duration must be positive"
        )
    try:
        result = calibrate(
            Settings(concurrency, output_tokens, itl_ms, ttft_ms, duration, shards, mock_shards)
        )
    except BenchError as e:
        fail(str(e))
    path = write(result)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        render(result, path)


def render(result: dict, path) -> None:
    lat, thr, met = result["latency"], result["throughput"], result["met"]
    s = result["settings"]
    table = Table(
        title=f"calibration: C={s['concurrency']}, {s['output_tokens']} tokens, ttft {s['ttft_ms']} ms, itl {s['itl_ms']} ms, {s['shards']} client process(es)"
    )
    table.add_column("figure")
    table.add_column("p50", justify="right")
    table.add_column("p99", justify="right")
    table.add_column("target")
    for name, key, target in [
        ("TTFT error (measured - set), ms", "ttft_error_ms", "p50 <= 1, p99 <= 5"),
        ("TTFT client overhead (measured - mock's actual), ms", "ttft_client_overhead_ms", ""),
        ("ITL error (measured - set), ms", "itl_error_ms", ""),
        ("send lag (sent - lane free), ms", "send_lag_ms", ""),
    ]:
        table.add_row(name, f"{lat[key]['p50']:.3f}", f"{lat[key]['p99']:.3f}", target)
    late = lat["mock_lateness_ms"]
    table.add_row("mock's own lateness, ms", f"{late['p50']:.3f}", f"{late['p99']:.3f}", "")
    table.add_row(
        "tokens/s at the set pace",
        f"{lat['tokens_per_s']:,.0f}",
        f"of {lat['expected_tokens_per_s']:,.0f}",
        "",
    )
    table.add_row(
        "client CPU at the set pace",
        f"{lat['client_cores']:.2f} cores",
        f"{lat['client_cpu_us_per_token']:.1f} us/token",
        "",
    )
    table.add_row(
        "max tokens/s (itl 0)",
        f"{thr['tokens_per_s']:,.0f}",
        f"{thr['client_cpu_us_per_token']:.1f} us/token",
        ">= 50,000 on one core",
    )
    table.add_row("failures", str(lat["failures"] + thr["failures"]), "", "0")
    console = Console()
    console.print(table)
    verdict = ", ".join(
        f"{k}: {'[green]met[/]' if v else '[red]not met[/]'}" for k, v in met.items()
    )
    console.print(f"{verdict}\nwritten to {path}")

"""`bench calibrate`: the load generator's own error, measured against the mock server."""

from __future__ import annotations

import json
from pathlib import Path

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
    path = write(result)
    if as_json:
        print(json.dumps(result, indent=2))
    else:
        render(result, path)


def render(result: dict, path: Path) -> None:
    s, lat, thr = result["settings"], result["latency"], result["throughput"]
    table = Table(title=f"calibration: C={s['concurrency']}, {s['output_tokens']} tokens, "
                  f"TTFT {s['ttft_ms']} ms, ITL {s['itl_ms']} ms, {s['shards']} client process(es)")  # fmt: skip
    for column in ("figure", "p50", "p99", "target"):
        table.add_column(column, justify="left" if column in ("figure", "target") else "right")
    rows = [("TTFT measured - set, ms", "ttft_error_ms", "p50 <= 1, p99 <= 5"),
            ("  of which: client send -> mock read", "to_mock_ms", ""),
            ("  of which: mock's own lateness", "mock_ttft_error_ms", ""),
            ("  of which: mock write -> client read", "to_client_ms", ""),
            ("ITL measured - set, ms", "itl_error_ms", ""),
            ("send lag (sent - lane free), ms", "send_lag_ms", "")]  # fmt: skip
    for name, key, target in rows:
        table.add_row(name, f"{lat[key]['p50']:.3f}", f"{lat[key]['p99']:.3f}", target)
    table.add_section()
    table.add_row("tokens/s at the set pace", f"{lat['tokens_per_s']:,.0f}",
                  f"of {lat['expected_tokens_per_s']:,.0f}", "")  # fmt: skip
    table.add_row(
        "one-core ceiling, one token per read", f"{lat['tokens_per_s_per_core']:,.0f}", "tok/s", ""
    )
    for name, run in (("at the set pace", lat), ("flat out (ITL 0)", thr)):
        table.add_row(f"client CPU {name}", f"{run['client_cores']:.2f} cores",
                      f"{run['client_cpu_us_per_token']:.1f} us/token", "")  # fmt: skip
    table.add_row("max tokens/s read (ITL 0)", f"{thr['tokens_per_s']:,.0f}",
                  f"mock {thr['mock_cores']:.2f} cores", ">= 50,000 on one core")  # fmt: skip
    table.add_row("failures", str(lat["failures"] + thr["failures"]), "", "0")
    console = Console()
    console.print(table)
    met = ", ".join(
        f"{k} {'[green]met[/]' if v else '[red]not met[/]'}" for k, v in result["met"].items()
    )
    console.print(met)
    if result["doubtful"]:
        console.print(f"[yellow]doubtful:[/] {result['doubtful']}")
    console.print(f"written to {path}")

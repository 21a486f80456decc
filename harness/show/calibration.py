"""`bench calibrate`'s result as a rich table: the client's TTFT and ITL error, its parts, and
the tokens per second it reads."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

ROWS = [  # figure, key in the latency result, target
    ("TTFT measured - set, ms", "ttft_error_ms", "p50 <= 1, p99 <= 5"),
    ("  of which: client send -> mock read", "to_mock_ms", ""),
    ("  of which: mock's own lateness", "mock_ttft_error_ms", ""),
    ("  of which: mock write -> client read", "to_client_ms", ""),
    ("ITL measured - set, ms", "itl_error_ms", ""),
    ("send lag (sent - lane free), ms", "send_lag_ms", ""),
]


def render(result: dict, path: Path, console: Console) -> None:
    s, lat, thr = result["settings"], result["latency"], result["throughput"]
    table = Table(
        title=f"calibration: C={s['concurrency']}, {s['output_tokens']} tokens, "
        f"TTFT {s['ttft_ms']} ms, ITL {s['itl_ms']} ms, {s['shards']} client process(es)"
    )
    for column in ("figure", "p50", "p99", "target"):
        table.add_column(column, justify="left" if column in ("figure", "target") else "right")
    for name, key, target in ROWS:
        table.add_row(name, f"{lat[key]['p50']:.3f}", f"{lat[key]['p99']:.3f}", target)
    table.add_section()
    expected = f"of {lat['expected_tokens_per_s']:,.0f}"
    table.add_row("tokens/s at the set pace", f"{lat['tokens_per_s']:,.0f}", expected, "")
    ceiling = f"{lat['tokens_per_s_per_core']:,.0f}"
    table.add_row("one-core ceiling, one token per read", ceiling, "tok/s", "")
    for name, run in (("at the set pace", lat), ("flat out (ITL 0)", thr)):
        cores, per_token = f"{run['client_cores']:.2f} cores", run["client_cpu_us_per_token"]
        table.add_row(f"client CPU {name}", cores, f"{per_token:.1f} us/token", "")
    mock = f"mock {thr['mock_cores']:.2f} cores"
    table.add_row(
        "max tokens/s read (ITL 0)", f"{thr['tokens_per_s']:,.0f}", mock, ">= 50,000 on one core"
    )
    table.add_row("failures", str(lat["failures"] + thr["failures"]), "", "0")
    console.print(table)
    met = ", ".join(
        f"{k} {'[green]met[/]' if v else '[red]not met[/]'}" for k, v in result["met"].items()
    )
    console.print(met)
    if result["doubtful"]:
        console.print(f"[yellow]doubtful:[/] {result['doubtful']}")
    console.print(f"written to {path}")

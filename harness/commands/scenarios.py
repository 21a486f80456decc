"""`bench scenarios`: the scenarios with their sizes and load."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from engine.config import ConfigError, load_scenario, scenario_names
from harness.errors import fail


def collect() -> list[dict]:
    rows = []
    for name in scenario_names():
        default = load_scenario(name)
        for size in default.sizes:
            s = load_scenario(name, size)
            rows.append({
                "scenario": name, "size": size, "default": size == default.size,
                "device": s.engine.device, "dtype": s.engine.dtype,
                "prompt_tokens": list(s.load.prompt_tokens),
                "output_tokens": list(s.load.output_tokens), "requests": s.load.requests,
                "warmup": s.load.warmup, "headline": s.headline, "description": s.description,
            })  # fmt: skip
    return rows


def main(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the scenarios (scenarios/*.yaml) with their sizes and load profiles."""
    try:
        rows = collect()
    except ConfigError as exc:
        fail(str(exc))
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    table = Table("scenario", "size", "device", "prompt", "output", "requests", "headline")
    for r in rows:
        size = r["size"] + (" (default here)" if r["default"] else "")
        prompt, output = ("{}-{}".format(*r[k]) for k in ("prompt_tokens", "output_tokens"))
        table.add_row(
            r["scenario"],
            size,
            r["device"],
            prompt,
            output,
            f"{r['requests']} (+{r['warmup']} warmup)",
            r["headline"],
        )
    Console().print(table)

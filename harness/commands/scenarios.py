"""`bench scenarios`: the scenarios with their sizes and load."""

from __future__ import annotations

import json

import typer

from harness.scenario import ConfigError, load_scenario, scenario_names
from harness.show.console import fail, output
from harness.show.scenarios import render


def collect() -> list[dict]:
    rows = []
    for name in scenario_names():
        default = load_scenario(name)
        for size in default.sizes:
            s = load_scenario(name, size)
            rows.append(
                {
                    "scenario": name,
                    "size": size,
                    "default": size == default.size,
                    "device": s.engine.device,
                    "dtype": s.engine.dtype,
                    "prompt_tokens": list(s.load.prompt_tokens),
                    "output_tokens": list(s.load.output_tokens),
                    "requests": s.load.requests,
                    "warmup": s.load.warmup,
                    "headline": s.headline,
                    "description": s.description,
                }
            )
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
    output().print(render(rows))

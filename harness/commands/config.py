"""`bench config`: every engine setting (`engine.<name>` in a scenario or `--set`), its
owner, default and meaning, from the engine's registry (engine/config/whole.py)."""

from __future__ import annotations

import json

import typer

from harness.show.config import render, setting_rows
from harness.show.console import output


def main(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """List the engine's settings by owner: name, default, meaning (docs/CONFIG.md)."""
    rows = setting_rows()
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    output().print(render(rows))

"""`bench`: registers the commands; each lives in harness/commands/<verb>.py."""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    help="Benchmark and compare serving-engine builds: ABBA runs, verdicts, reports.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMANDS = [
    # (verb, module under harness.commands)
    ("mock", "mock"),
    ("calibrate", "calibrate"),
    ("run", "run"),
    ("scenarios", "scenarios"),
    ("serve", "serve"),
    ("power", "power"),
    ("nightly", "nightly"),
    ("report", "report"),
    ("compare", "compare"),
]

for verb, module in COMMANDS:
    app.command(verb)(importlib.import_module(f"harness.commands.{module}").main)


def main() -> None:
    app()

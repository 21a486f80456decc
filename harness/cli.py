"""`bench`: registers the commands; each lives in harness/commands/<verb>.py.

Exit codes: 0 done, 1 B slower (or an SLO missed, for measure), 2 bad usage, 3 an internal
error (a traceback: a bug to report), 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
import traceback

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
    ("measure", "measure"),
    ("sweep", "sweep"),
    ("export", "export"),
    ("scenarios", "scenarios"),
    ("serve", "serve"),
    ("power", "power"),
    ("nightly", "nightly"),
    ("report", "report"),
    ("compare", "compare"),
]

for verb, module in COMMANDS:
    app.command(verb)(importlib.import_module(f"harness.commands.{module}").main)


INTERNAL_ERROR = 3


def main() -> None:
    """The `bench` entry point: a crash exits 3, never 1 (which says "B is slower")."""
    try:
        app(prog_name="bench")
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception:
        traceback.print_exc()
        print("bench: internal error (exit 3); the traceback above is a bug", file=sys.stderr)
        sys.exit(INTERNAL_ERROR)

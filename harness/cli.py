"""`bench`: registers the commands; each lives in harness/commands/<verb>.py.

Exit codes (harness.errors.ExitCode; docs/RELIABILITY.md): 0 done, 1 B slower (or an SLO
missed, for measure), 2 bad usage or an error, 3 an internal error (a traceback: a bug to
report), 4 a server failed during the run, 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
import traceback

import typer

from harness.errors import ExitCode

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


def main() -> None:
    """The `bench` entry point: a crash exits 3, never 1 (which says "B is slower")."""
    try:
        app(prog_name="bench")
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except Exception:
        traceback.print_exc()
        print("bench: internal error (exit 3); the traceback above is a bug", file=sys.stderr)
        sys.exit(ExitCode.INTERNAL)

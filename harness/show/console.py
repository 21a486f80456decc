"""The terminal: one way to fail a command (one line saying what was wrong and what to do,
non-zero exit), and the consoles results and notes go to."""

from __future__ import annotations

import os
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from harness.errors import ExitCode

# Written to a log or a pipe (no terminal, no COLUMNS), rich would take 80 columns and wrap a
# table's cells mid-number ("(-61.6..+62" / ".1%)"); at this width every table fits whole.
LOG_WIDTH = 160


def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = LOG_WIDTH
    return console


_err = _console(stderr=True)


def fail(message: str, code: int = ExitCode.ERROR) -> NoReturn:
    _err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def notes() -> Console:
    """Progress, notes and paths: stderr, so stdout holds only the result (e.g. --json)."""
    return _console(stderr=True)


def output() -> Console:
    """A command's result: stdout."""
    return _console()

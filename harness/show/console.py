"""The terminal: one way to fail a command (one line saying what was wrong and what to do,
non-zero exit), and the consoles results and notes go to."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from harness.errors import ExitCode

_err = Console(stderr=True, highlight=False)


def fail(message: str, code: int = ExitCode.ERROR) -> NoReturn:
    _err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)


def notes() -> Console:
    """Progress, notes and paths: stderr, so stdout holds only the result (e.g. --json)."""
    return Console(stderr=True, highlight=False)


def output() -> Console:
    """A command's result: stdout."""
    return Console()

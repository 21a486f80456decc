"""One way to fail a command: one line saying what was wrong and what to do, non-zero exit."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

_err = Console(stderr=True, highlight=False)


class BenchError(Exception):
    """An error the user can act on; its message is the whole story, in one line."""


def fail(message: str, code: int = 2) -> NoReturn:
    _err.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    raise typer.Exit(code)

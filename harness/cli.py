"""`bench`: registers the commands; each lives in harness/commands/<verb>.py.

Exit codes (harness.errors.ExitCode; docs/RELIABILITY.md): 0 done, 1 B slower (or an SLO
missed, for measure), 2 bad usage or an error, 3 an internal error (a traceback: a bug to
report), 4 a server failed during the run, 130 interrupted.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import click
import typer
import typer.core

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
    ("config", "config"),
    ("serve", "serve"),
    ("power", "power"),
    ("nightly", "nightly"),
    ("report", "report"),
    ("compare", "compare"),
]


WORDS = {"int": "N", "float": "X", "Path": "PATH", "bool": None}


def _value_word(param: click.Parameter) -> str | None:
    """What an option's value is, as --help shows it: a plain word, or nothing for a flag."""
    if param.param_type_name == "argument":
        return None
    described = param.type_descriptor
    if described.is_choice:
        return "|".join(map(str, described.choices or ()))
    bare = param.bare_type()
    return WORDS.get(bare.removeprefix("list[").removesuffix("]"), "TEXT")


class PlainHelp(typer.core.TyperCommand):
    """--help without typer's type tags (`<bool>`, `<list[str]>`, `<int range> [x>=1]`): a
    value's plain word (N, X, PATH, TEXT), nothing for a flag; a bad value still gets click's
    one-line error naming the bound."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for param in self.params:
            _plain(param)

    def get_help_option(self, ctx: click.Context) -> click.Option | None:
        option = super().get_help_option(ctx)
        return option if option is None else _plain(option)


def _plain(param: click.Parameter) -> click.Parameter:
    if hasattr(param, "type_descriptor"):  # a typer that shows no tags (< 0.25) has none
        param.display_type_rich = lambda ctx, word=_value_word(param): word
        param._get_number_range_help_str = lambda: None
    return param


for verb, module in COMMANDS:
    app.command(verb, cls=PlainHelp)(importlib.import_module(f"harness.commands.{module}").main)


class _ReaderMayLeave:
    """stdout or stderr whose reader may go away (`bench run ... | head`). Once it has, what is
    written goes nowhere and the command carries on to its own exit code: left alone, click
    would exit 1 on the broken pipe, and 1 says "B is slower"."""

    def __init__(self, stream):
        self._stream, self.gone = stream, False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._leave()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._leave()

    def _leave(self) -> None:
        """The descriptor now points at the null device, so the interpreter's last flush of
        what is still buffered succeeds too."""
        self.gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._stream.fileno())
        os.close(null)

    def __getattr__(self, name):
        return getattr(self._stream, name)


def main() -> None:
    """The `bench` entry point: a crash exits 3, never 1 (which says "B is slower"), and a
    reader that leaves early changes no exit code."""
    sys.stdout, sys.stderr = _ReaderMayLeave(sys.stdout), _ReaderMayLeave(sys.stderr)
    try:
        app(prog_name="bench")
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except Exception:
        traceback.print_exc()
        print("bench: internal error (exit 3); the traceback above is a bug", file=sys.stderr)
        sys.exit(ExitCode.INTERNAL)

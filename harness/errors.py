"""The one error a command reports without a traceback (show/console.py prints it), and the
exit codes every command uses (docs/RELIABILITY.md, "Exit codes")."""

from __future__ import annotations

from enum import IntEnum


class BenchError(Exception):
    """An error the user can act on; its message is the whole story, in one line."""


class ExitCode(IntEnum):
    OK = 0
    SLOWER = 1  # B's headline figure is slower (bench measure: an SLO missed)
    ERROR = 2  # bad usage, or an error the user can act on (a BenchError)
    INTERNAL = 3  # a crash: a traceback, a bug to report
    SERVER_FAILED = 4  # a server died, stalled or measured nothing; or an arm has none left
    INTERFERENCE = 5  # the arms saw different loads from outside the run: no verdict
    INTERRUPTED = 130  # Ctrl-C, SIGTERM or SIGHUP: the results cover what was measured

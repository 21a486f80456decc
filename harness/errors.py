"""The one error a command reports without a traceback (show/console.py prints it)."""

from __future__ import annotations


class BenchError(Exception):
    """An error the user can act on; its message is the whole story, in one line."""

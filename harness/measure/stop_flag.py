"""Ctrl-C, SIGTERM and SIGHUP during a schedule (`StopFlag`): the load in progress stops, the
server is stopped, what was measured is written, and the run winds down; `Interrupted` ends a
server's start, which has no load to stop."""

from __future__ import annotations

import signal

from harness.measure.server import ServerProcess


class Interrupted(Exception):
    """A signal came while no load ran (a server starting): the slot ends at once."""


class StopFlag:
    """Ctrl-C, SIGTERM or SIGHUP (the terminal closed): the first sets the flag (and stops the
    load in progress); the run winds down. SIGKILL cannot be caught: the servers then die with
    the harness (server.die_with_parent)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.set = False
        self.server: ServerProcess | None = None
        self._loop = None
        self._event = None

    def bind(self, loop, event) -> None:
        self._loop, self._event = loop, event
        if self.set and event is not None:
            event.set()

    def _handler(self, *_):
        self.set = True
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)
        elif self.server is not None:
            raise Interrupted()

    def installed(self):
        flag = self

        class _Ctx:
            def __enter__(self):
                self.previous = {sig: signal.signal(sig, flag._handler) for sig in flag.SIGNALS}

            def __exit__(self, *_):
                for sig, handler in self.previous.items():
                    signal.signal(sig, handler)

        return _Ctx()

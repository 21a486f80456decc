"""The per-server IPC directories (`engine-ipc-*` under the temp directory).

The API server makes its own at start and removes it at exit; a worker that outlives its server
removes it on the way out; and a server starting reclaims those whose owner died without
either (SIGKILL of the whole group). The owner is named by pid and start time, so a pid
the system has handed to another process does not keep a stale directory alive.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "engine-ipc-"
OWNER_FILE = "owner"  # "<pid> <start time>" of the API server that made the directory


def create() -> str:
    path = tempfile.mkdtemp(prefix=PREFIX)
    Path(path, OWNER_FILE).write_text(_identity(os.getpid()))
    return path


def remove(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


def reclaim_stale(parent: str | None = None) -> list[str]:
    """Remove the IPC directories (in the temp directory) whose owner is gone; their paths.

    One without a readable owner file (another user's, one being made right now, or one from
    an engine before owner files) is left alone.
    """
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            owner = (path / OWNER_FILE).read_text()
        except OSError:
            continue
        if _owner_gone(owner):
            remove(str(path))
            removed.append(str(path))
    return removed


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux); "?" where unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name before ")" may hold spaces


def _identity(pid: int) -> str:
    return f"{pid} {_start_time(pid)}"


def _owner_gone(owner: str) -> bool:
    fields = owner.split()
    if len(fields) != 2 or not fields[0].isdigit():
        return False  # half written, or not ours to judge
    pid, started = int(fields[0]), fields[1]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    return started != "?" and _start_time(pid) not in ("?", started)

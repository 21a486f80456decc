"""A server process for one slot of the schedule: start, wait for /health, stop.

The server runs in its own process group, so stopping it (SIGTERM, then SIGKILL after a
grace period) takes its worker with it and leaves no orphans. It also dies with the harness:
the kernel sends it SIGTERM when the thread that started it exits (PR_SET_PDEATHSIG), so a
`bench` killed with SIGKILL leaves no server running.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from harness.errors import BenchError


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def model_card(url: str, headers: dict[str, str] | None = None) -> dict | None:
    """The first model an external OpenAI-compatible server lists at /v1/models (None if it
    lists none): its `id`, and `max_model_len` where the server says it (vLLM, this engine).
    `headers` go with the request (a server behind auth)."""
    request = urllib.request.Request(f"{url}/v1/models", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            data = json.loads(resp.read()).get("data") or []
        card = data[0] if data else None
        if card is not None and not isinstance(card.get("id"), str):
            raise ValueError("a model without an id")
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise BenchError(f"cannot reach {url}/v1/models ({exc}); is the server up?") from None
    return card


def served_model(url: str, headers: dict[str, str] | None = None) -> str | None:
    """The first model an external OpenAI-compatible server lists (None if it lists none)."""
    card = model_card(url, headers)
    return None if card is None else card["id"]


def exit_text(code: int) -> str:
    """A process's exit code as a person reads it: `1`, or `-9 (SIGKILL)`."""
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM, cpus: set[int] | None = None):
    """A `preexec_fn` that has the kernel send `sig` to the child when the thread that started
    it exits, the harness killed with SIGKILL included; a child whose parent is already gone
    signals itself; with `cpus`, it pins the child to them. Linux only (elsewhere it does
    nothing). The child makes system calls and takes no lock, so it is safe beside the
    harness's threads."""
    parent = os.getpid()
    prctl = _LIBC.prctl if _LIBC is not None else None

    def set_signal() -> None:
        if cpus:
            os.sched_setaffinity(0, cpus)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
            if os.getppid() != parent:
                os.kill(os.getpid(), sig)

    return set_signal


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


ORPHAN_GRACE_S = 3.0  # an orphaned worker removes its IPC directory and exits well within it


def group_members(pgid: int) -> list[int]:
    """The live processes of a process group (zombies, already dead, do not count); none
    where there is no /proc to read."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _ppid, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            members.append(int(stat.parent.name))
    return members


class ServerProcess:
    def __init__(
        self,
        scenario: str,
        *,
        size: str | None = None,
        overrides: str | None = None,
        port: int | None = None,
        cwd: str | Path | None = None,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        server_id: str | None = None,
        python: str = sys.executable,
        command: list[str] | None = None,
        cpus: tuple[int, ...] | None = None,
    ):
        """`command`: another server's argv in place of `engine serve` (a benchmark's own
        assembly, e.g. benchmarks/bench_api.py), listening on `port`; then `scenario`, `size`,
        `overrides` and `server_id` are not used. `cpus`: the cores the API server is pinned
        to from its start (a CPU run's layout, cpu_layout.py; None: not pinned)."""
        self.cpus = set(cpus) if cpus else None
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else None
        cmd = [python, "-m", "engine", "serve", scenario, "--port", str(self.port)]
        if size:
            cmd += ["--size", size]
        if overrides:
            cmd += ["--set", overrides]
        if server_id:
            cmd += ["--server-id", server_id]
        self.cmd = command or cmd
        self.cwd = str(cwd) if cwd else None
        self.env = {**os.environ, **(env or {})}
        if self.cwd:  # run the engine of that tree, not the one installed here
            self.env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [self.cwd, self.env.get("PYTHONPATH")])
            )
        self.proc: subprocess.Popen | None = None
        self._log = None

    def start(self) -> ServerProcess:
        if port_in_use(self.port):
            raise BenchError(f"port {self.port} is in use; free it or let bench pick a port")
        self._log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.cmd,
            cwd=self.cwd,
            env=self.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(cpus=self.cpus),
        )
        return self

    def exited(self) -> int | None:
        """The exit code when the server has exited (on its own, or stopped), else None."""
        return None if self.proc is None else self.proc.poll()

    def last_log_line(self) -> str | None:
        """The last line the server logged, without its time stamp (None: no log, or empty)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path else []
        except OSError:
            return None
        last = next((line.strip() for line in reversed(lines) if line.strip()), None)
        return None if last is None else _TIME_STAMP.sub("", last)[:300]

    def wait_healthy(self, timeout: float = 180.0, poll_s: float = 0.05) -> None:
        """Return once /health answers 200, polled every `poll_s` (a refused connect costs ~0.1
        ms; a coarser poll adds to each start); BenchError if the server exits first or
        `timeout` passes (then it is stopped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"server exited with code {self.proc.returncode} before becoming healthy; "
                    f"see {self.log_path or 'its output'}"
                )
            if self.answers_health():
                return
            time.sleep(poll_s)
        self.stop()
        raise BenchError(
            f"server not healthy after {timeout:.0f} s; see {self.log_path or 'its output'}"
        )

    def answers_health(self, timeout: float = 2.0) -> bool:
        """/health answers 200 now (a server whose worker is gone answers 503)."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the server has exited, waiting up to `timeout` s; else None."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 10.0, orphan_grace: float = ORPHAN_GRACE_S) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; the exit code. What the
        server left behind (a worker whose server died: it cleans up on SIGHUP) gets
        `orphan_grace` seconds to exit before it is killed."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            _signal_group(self.proc.pid, signal.SIGCONT)  # a stopped process takes it too
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        deadline = time.monotonic() + orphan_grace
        while group_members(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(self.proc.pid, signal.SIGKILL)
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        self.start()
        self.wait_healthy()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_TIME_STAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")  # logging's asctime


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

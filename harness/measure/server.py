"""A server process for one slot of the schedule: start, wait for /health, stop.

The server runs in its own process group, so stopping it (SIGTERM, then SIGKILL after a
grace period) takes its worker with it and leaves no orphans.
"""

from __future__ import annotations

import json
import os
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


def served_model(url: str, headers: dict[str, str] | None = None) -> str | None:
    """The first model an external OpenAI-compatible server lists (None if it lists none)."""
    request = urllib.request.Request(f"{url}/v1/models", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            data = json.loads(resp.read()).get("data") or []
    except (OSError, ValueError) as exc:
        raise BenchError(f"cannot reach {url}/v1/models ({exc}); is the server up?") from None
    return data[0]["id"] if data else None


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


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
    ):
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
        self.cmd = cmd
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
        )
        return self

    def wait_healthy(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(
                    f"server exited with code {self.proc.returncode} before becoming healthy; "
                    f"see {self.log_path or 'its output'}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        self.stop()
        raise BenchError(
            f"server not healthy after {timeout:.0f} s; see {self.log_path or 'its output'}"
        )

    def stop(self, grace: float = 10.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        _signal_group(self.proc.pid, signal.SIGKILL)  # anything the server left behind
        if self._log not in (None, subprocess.DEVNULL):
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        self.start()
        self.wait_healthy()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass

"""`python -m engine serve`: one API server process and one worker process.

The API server binds its port first (a port in use fails at once), starts the worker as a
fresh interpreter, then imports the API (engine/api/serving.py: aiohttp and the routes, while
the worker imports torch) and answers /health with 200 once the worker reports Ready. SIGINT or
SIGTERM ends the open streams (abort) and stops both within 2 s, removes the per-server IPC
directory and frees the port. A worker that dies (or a link to it that fails) ends every
open stream with an error event, and the server exits with code 1 and one log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import asdict

from engine import ipc_dirs
from engine.config import Served
from engine.tokenizer import TokenizerError, tokenizer_for
from engine.worker.template import start_worker

log = logging.getLogger("engine.serve")


class ServeError(RuntimeError):
    pass


def _bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ServeError(
            f"cannot listen on {host}:{port} ({exc.strerror}); pick another --port"
        ) from None
    sock.listen(1024)
    return sock


WorkerCommand = Callable[[str], list[str]]  # the IPC directory -> the worker's argv


def _worker_command(served: Served, ipc_path: str, server_id: str, period: int = 0) -> list[str]:
    """The worker's argv: the model and engine settings, the size, and the phase-timing
    `period` (engine.env.phase_timing_period, read once by `python -m engine serve`)."""
    spec = {
        "model": asdict(served.model),
        "engine": asdict(served.engine),
        "size": served.size,
        "period": period,
    }
    return [
        sys.executable,
        "-m",
        "engine.worker.main",
        "--spec",
        json.dumps(spec),
        "--ipc-dir",
        ipc_path,
        "--server-id",
        server_id,
    ]


def serve(
    served: Served,
    host: str,
    port: int,
    server_id: str | None = None,
    worker_command: WorkerCommand | None = None,
    period: int = 0,
) -> int:
    """Serve until stopped; the exit code. `worker_command(ipc_path)`: the worker process's
    argv in place of the engine's worker (benchmarks/bench_api.py's stand-in); `period`: the
    worker's phase-timing period in iterations (0: off)."""
    try:
        make_tokenizer = tokenizer_for(served.model.tokenizer, served.model.path)
    except TokenizerError as exc:
        raise ServeError(str(exc)) from None
    sock = _bind(host, port)
    reclaimed = ipc_dirs.reclaim_stale()
    if reclaimed:
        log.info("removed %d IPC directories left by servers that died", len(reclaimed))
    ipc_path = ipc_dirs.create()
    server_id = server_id or str(sock.getsockname()[1])
    log.info(
        "starting scenario=%s size=%s (%s) device=%s",
        served.name,
        served.size,
        served.size_reason,
        served.engine.device,
    )
    command = worker_command or (lambda ipc: _worker_command(served, ipc, server_id, period))
    worker = None
    try:
        worker = start_worker(command(ipc_path))
        # Imported once the worker runs: its start (torch's import, ~1.5 s on 2 cores) overlaps
        # aiohttp's and the API's (~0.2 s) instead of following it.
        from engine.api.serving import run_api

        return asyncio.run(run_api(served, make_tokenizer, sock, ipc_path, worker))
    finally:
        if worker is not None and worker.poll() is None:  # run_api never ran: it stops its own
            worker.kill()
            worker.wait()
        sock.close()
        ipc_dirs.remove(ipc_path)

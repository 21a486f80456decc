"""`python -m engine serve`: one API server process and one worker process.

The API server binds its port first (a port in use fails at once), starts the worker as a
fresh interpreter, and answers /health with 200 once the worker reports Ready. SIGINT or
SIGTERM ends the open streams (abort) and stops both within 2 s, removes the per-server IPC
directory and frees the port. A worker that dies (or a link to it that fails) ends every
open stream with an error event, and the server exits with code 1 and one log line.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict

from aiohttp import web

from engine import ipc_dirs
from engine.api.server import build_app, on_ready
from engine.api.worker_client import WorkerClient
from engine.config import Scenario
from engine.tokenizer import Tokenizer, TokenizerError, check_vocabulary, load_tokenizer

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


def _worker_command(scenario: Scenario, ipc_path: str, server_id: str) -> list[str]:
    spec = {
        "model": asdict(scenario.model),
        "engine": asdict(scenario.engine),
        "size": scenario.size,
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


# How long each part of a stop may take; together well under 2 s (docs/RELIABILITY.md).
HANDLERS_GRACE_S = 0.25  # open handlers finish writing their last event (aiohttp waits 2x)
WORKER_EXIT_S = 1.0  # the worker exits after Shutdown, else it is killed


async def _serve(
    scenario: Scenario,
    tokenizer: Tokenizer,
    sock: socket.socket,
    ipc_path: str,
    server_id: str,
    worker_command: WorkerCommand | None,
) -> int:
    host, port = sock.getsockname()[:2]
    client = WorkerClient(ipc_path)
    client.start()
    max_body = max(1 << 20, scenario.engine.max_model_len * 16 + (64 << 10))
    app = build_app(client, scenario.name, max_body)
    runner = web.AppRunner(
        app, handler_cancellation=True, access_log=None, shutdown_timeout=HANDLERS_GRACE_S
    )
    await runner.setup()
    await web.SockSite(runner, sock).start()
    command = worker_command or (lambda ipc: _worker_command(scenario, ipc, server_id))
    worker = subprocess.Popen(command(ipc_path))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopped = asyncio.ensure_future(stop.wait())
    exited = asyncio.ensure_future(asyncio.to_thread(worker.wait))  # one waiter thread
    ends = [stopped, exited, client.lost]
    code = 0
    try:
        await asyncio.wait([client.ready, *ends], return_when=asyncio.FIRST_COMPLETED)
        if not any(end.done() for end in ends):
            ready = client.ready.result()
            try:
                check_vocabulary(tokenizer, ready.vocab_size)
            except TokenizerError as exc:
                log.error("%s", exc)
                return 2
            on_ready(app, ready.vocab_size, ready.max_model_len, tokenizer, ready.speech)
            log.info(
                "listening on http://%s:%d  scenario=%s size=%s device=%s parameters=%s "
                "tokenizer=%s",
                host,
                port,
                scenario.name,
                ready.size,
                ready.device,
                f"{ready.parameters:,}",
                tokenizer.name,
            )
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            client.stop()  # open streams end with finish_reason "abort"
        else:  # the worker died, or the link to it failed: every open stream ends in error
            if exited.done():
                client.fail(f"the worker exited with code {worker.returncode}")
            log.error("%s; stopping", client.lost.result())
            code = 1
    finally:
        await runner.cleanup()  # the open handlers finish their last event; the port is freed
        client.shutdown_worker()
        await _wait_worker(worker, exited)
        client.close()
        stopped.cancel()
    return code


async def _wait_worker(proc: subprocess.Popen, exited: asyncio.Future) -> None:
    """Give the worker WORKER_EXIT_S to exit after Shutdown, then kill it."""
    try:
        await asyncio.wait_for(asyncio.shield(exited), WORKER_EXIT_S)
    except TimeoutError:
        log.warning("the worker did not exit within %g s of Shutdown; killing it", WORKER_EXIT_S)
        proc.kill()
        await exited


def serve(
    scenario: Scenario,
    host: str,
    port: int,
    server_id: str | None = None,
    worker_command: WorkerCommand | None = None,
) -> int:
    """Serve until stopped; the exit code. `worker_command(ipc_path)`: the worker process's
    argv in place of the engine's worker (benchmarks/bench_api.py's stand-in)."""
    try:
        tokenizer = load_tokenizer(scenario.model.tokenizer, scenario.model.path)
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
        scenario.name,
        scenario.size,
        scenario.size_reason,
        scenario.engine.device,
    )
    try:
        return asyncio.run(_serve(scenario, tokenizer, sock, ipc_path, server_id, worker_command))
    finally:
        sock.close()
        ipc_dirs.remove(ipc_path)

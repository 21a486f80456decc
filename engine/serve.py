"""`python -m engine serve`: one API server process and one worker process.

The API server binds its port first (a port in use fails at once), starts the worker as a
fresh interpreter, and answers /health with 200 once the worker reports Ready. SIGINT or
SIGTERM stops both, removes the per-server IPC directory and frees the port.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict

from aiohttp import web

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


def _worker_command(scenario: Scenario, ipc_dir: str, server_id: str) -> list[str]:
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
        ipc_dir,
        "--server-id",
        server_id,
    ]


async def _serve(
    scenario: Scenario, tokenizer: Tokenizer, sock: socket.socket, ipc_dir: str, server_id: str
) -> int:
    host, port = sock.getsockname()[:2]
    client = WorkerClient(ipc_dir)
    client.start()
    max_body = max(1 << 20, scenario.engine.max_model_len * 16 + (64 << 10))
    app = build_app(client, scenario.name, max_body)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    worker = subprocess.Popen(_worker_command(scenario, ipc_dir, server_id))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    code = 0
    stopped = asyncio.ensure_future(stop.wait())
    exited = asyncio.ensure_future(asyncio.to_thread(worker.wait))  # one waiter thread
    try:
        await asyncio.wait([client.ready, stopped, exited], return_when=asyncio.FIRST_COMPLETED)
        if client.ready.done():
            ready = client.ready.result()
            try:
                check_vocabulary(tokenizer, ready.vocab_size)
            except TokenizerError as exc:
                log.error("%s", exc)
                return 2
            on_ready(app, ready.vocab_size, ready.max_model_len, tokenizer)
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
            await asyncio.wait([stopped, exited], return_when=asyncio.FIRST_COMPLETED)
        if worker.poll() is not None:
            log.error("the worker exited with code %s; stopping", worker.returncode)
            code = 1
    finally:
        client.close()
        await runner.cleanup()
        _stop_worker(worker)
    return code


def _stop_worker(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=5)  # it got Shutdown
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def serve(scenario: Scenario, host: str, port: int, server_id: str | None = None) -> int:
    try:
        tokenizer = load_tokenizer(scenario.model.tokenizer, scenario.model.path)
    except TokenizerError as exc:
        raise ServeError(str(exc)) from None
    sock = _bind(host, port)
    ipc_dir = tempfile.mkdtemp(prefix="engine-ipc-")
    server_id = server_id or str(sock.getsockname()[1])
    log.info(
        "starting scenario=%s size=%s (%s) device=%s",
        scenario.name,
        scenario.size,
        scenario.size_reason,
        scenario.engine.device,
    )
    try:
        return asyncio.run(_serve(scenario, tokenizer, sock, ipc_dir, server_id))
    finally:
        sock.close()
        shutil.rmtree(ipc_dir, ignore_errors=True)

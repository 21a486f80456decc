"""The API server's life once its worker is spawned (engine/serve.py spawns it first, so the
worker's start, torch's import above all, overlaps these imports: aiohttp and the API). It
answers /health with 200 once the worker reports Ready; SIGINT or SIGTERM ends the open streams
(abort) and stops both within 2 s; a worker that dies, stalls (it is killed then) or whose link
fails ends every open stream with an error event and the exit code 1, with one log line. Its
connections are guarded (connections.py).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import subprocess
from collections.abc import Callable

from engine.api.connections import connection_cap, listen, runner
from engine.api.metrics import EngineMetrics
from engine.api.server import build_app, on_ready
from engine.api.worker_client import WorkerClient
from engine.config import Served
from engine.tokenizer import Tokenizer, TokenizerError, check_vocabulary

# the server's log lines keep one name, whichever module writes them (docs/RELIABILITY.md)
log = logging.getLogger("engine.serve")

# How long each part of a stop may take; together well under 2 s (docs/RELIABILITY.md).
HANDLERS_GRACE_S = 0.25  # open handlers finish writing their last event (aiohttp waits 2x)
WORKER_EXIT_S = 1.0  # the worker exits after Shutdown, else it is killed


async def run_api(
    served: Served,
    make_tokenizer: Callable[[int], Tokenizer],
    sock: socket.socket,
    ipc_path: str,
    worker: subprocess.Popen,
) -> int:
    """Serve the API on `sock` for `worker` (spawned, its IPC under `ipc_path`) until a stop
    or the worker's end; the exit code. `make_tokenizer(vocab_size)`: the tokenizer, made once
    the worker reports the model's vocabulary (engine.tokenizer.tokenizer_for)."""
    host, port = sock.getsockname()[:2]
    guards, name = served.engine.parts.api, served.name
    metrics = EngineMetrics(name)
    client = WorkerClient(ipc_path, guards.stall_timeout_s, on_step=metrics.step)
    client.start()
    max_body = max(1 << 20, served.engine.parts.cache.max_model_len * 16 + (64 << 10))
    app = build_app(client, name, max_body, guards.body_timeout_s, metrics)
    app_runner = runner(app, guards.idle_timeout_s, HANDLERS_GRACE_S)
    await app_runner.setup()
    listener = await listen(app_runner, sock, connection_cap(guards.max_connections))
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
            tokenizer = make_tokenizer(ready.vocab_size)
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
                name,
                ready.size,
                ready.device,
                f"{ready.parameters:,}",
                tokenizer.name,
            )
            await asyncio.wait(ends, return_when=asyncio.FIRST_COMPLETED)
        if stopped.done():
            client.stop()  # open streams end with finish_reason "abort"
        else:  # the worker died, stalled, or the link to it failed: every stream ends in error
            if exited.done():
                client.fail(f"the worker exited with code {worker.returncode}")
            log.error("%s; stopping", client.lost.result())
            if client.stalled:
                worker.kill()  # it would not read a Shutdown
            code = 1
    finally:
        listener.close()  # no new connection
        await app_runner.cleanup()  # the open handlers finish their last event; the port is freed
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

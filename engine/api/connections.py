"""The API server's connections: how long one may idle, how many may be open, and what the log
says when the process runs out of them (docs/RELIABILITY.md fault 16).

- A connection that has sent no whole request head `idle_timeout_s` after it opened or after
  its last response is closed: aiohttp's keep-alive timer, which also covers a head sent in
  part (it fires unless a request is being handled). A body is the handler's to time and
  decode (body.py: `body_timeout_s`, a 408).
- At most `max_connections` open (lowered to what the file limit allows, the soft limit raised
  toward the hard one first); one more is answered 503 and closed, without reaching aiohttp.
- The event loop's accept errors (out of descriptors: asyncio retries a second later and logs
  a traceback each time) make one log line a burst.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time

from aiohttp import web

log = logging.getLogger("engine.serve")

RESERVED_FDS = 128  # for the worker link, logs, the tokenizer: never given to connections
ACCEPT_BURST_S = 10.0  # accept errors closer together than this are one burst
REFUSAL = (
    b'{"error": {"message": "too many open connections; retry later", "type": "server_error",'
    b' "param": null}}'
)
REFUSAL_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(REFUSAL), REFUSAL)
)
REFUSAL_LINGER_S = 1.0  # a refused connection is closed this long after its 503 at most
# A request answered before its body was all read (a 408, a 413) has its connection closed
# after reading the rest this long at most (aiohttp's default: 10 s, which a body that never
# comes held for good).
LINGER_S = 1.0


def runner(app: web.Application, idle_timeout_s: float, grace_s: float) -> web.AppRunner:
    """The app's runner: handlers cancelled when their client goes, no access log, open
    handlers given `grace_s` at a stop, idle connections closed after `idle_timeout_s`, the
    rest of a body answered early read for LINGER_S at most, bodies left encoded for the
    handler to decode (body.py)."""
    return web.AppRunner(
        app,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=grace_s,
        keepalive_timeout=idle_timeout_s,
        lingering_time=LINGER_S,
        auto_decompress=False,
    )


def connection_cap(wanted: int) -> int:
    """`wanted`, or fewer where the file limit cannot hold them beside RESERVED_FDS (its soft
    limit raised toward the hard one first)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + RESERVED_FDS
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_FDS))


async def listen(runner: web.AppRunner, sock: socket.socket, cap: int) -> asyncio.Server:
    """Serve `runner` (set up) on the bound `sock`, `cap` connections at most."""
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(AcceptErrors())
    server = runner.server
    assert server is not None, "runner.setup() first"

    def protocol() -> asyncio.BaseProtocol:
        # aiohttp's own count: a connection leaves it when its handler has ended
        return _Refused() if len(server.connections) >= cap else server()

    return await loop.create_server(protocol, sock=sock, backlog=1024)


class _Refused(asyncio.Protocol):
    """One connection over the cap: a 503, then closed (what it sent is not read)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.write(REFUSAL_RESPONSE)
        transport.write_eof()  # the 503, then FIN: the client reads it before the close
        asyncio.get_running_loop().call_later(REFUSAL_LINGER_S, transport.close)

    def eof_received(self) -> bool:
        return False  # closes the transport


class AcceptErrors:
    """The event loop's exception handler: accept errors (out of descriptors or memory) make
    one warning line per burst; anything else goes to asyncio's default handler."""

    def __init__(self):
        self.last = -ACCEPT_BURST_S
        self.missed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        if not context.get("message", "").startswith("socket.accept() out of system"):
            loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self.last >= ACCEPT_BURST_S:
            more = f" ({self.missed} more in the last burst)" if self.missed else ""
            log.warning(
                "cannot accept connections: %s; retrying each second, this line once a burst%s",
                getattr(exc, "strerror", None) or exc,
                more,
            )
            self.missed = 0
        else:
            self.missed += 1
        self.last = now

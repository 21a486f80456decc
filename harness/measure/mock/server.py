"""A mock OpenAI-compatible streaming server: set TTFT, inter-token latency and length.

It speaks the engine's SSE: one `data:` event per token (`choices[0].token_ids: [id]` and
`text`), then a final event with `finish_reason` and `usage` and no token, then `data: [DONE]`.
One token pacer (pacer.py) writes every reply's tokens on schedule. The mock measures its own
lateness (write time minus due time) and reports it at `/stats` (stats.py), so calibration can
tell the client's error from the mock's. Times are `time.perf_counter()` (CLOCK_MONOTONIC on
Linux, so they compare across processes).

Output length: `max_tokens` when the request sets it with `ignore_eos`; with `max_tokens` but
without `ignore_eos`, the shorter of `max_tokens` and the set length (the set length plays the
EOS); without `max_tokens`, the set length.
"""

from __future__ import annotations

import asyncio
import gc
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web

from harness.measure.event_loop import run_loop
from harness.measure.mock.pacer import PacedReply, TokenPacer, token_id
from harness.measure.mock.stats import MockStats

HEAD = b'{"id":"cmpl-%s","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'


@dataclass(frozen=True)
class MockConfig:
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    output_tokens: int = 256
    model: str = "mock"
    # The most tokens any reply streams, whatever the request asks; 0 makes a broken server
    # that answers 200 with no tokens (a run against it must fail, never pass).
    max_output: int | None = None

    def length(self, max_tokens: int | None, ignore_eos: bool) -> tuple[int, str]:
        """Tokens to send and the finish reason."""
        n, finish = self._asked(max_tokens, ignore_eos)
        if self.max_output is not None and n > self.max_output:
            return self.max_output, "stop"
        return n, finish

    def _asked(self, max_tokens: int | None, ignore_eos: bool) -> tuple[int, str]:
        if max_tokens is None:
            return self.output_tokens, "stop"
        if ignore_eos or max_tokens <= self.output_tokens:
            return max_tokens, "length"
        return self.output_tokens, "stop"


class Mock:
    """The mock's handlers, its stats, and (made inside the serving loop) its token pacer."""

    def __init__(self, config: MockConfig):
        self.config, self.stats = config, MockStats()
        self.pacer: TokenPacer | None = None
        self.arrivals: dict[asyncio.BaseTransport, float] = {}  # filled by _Arrivals

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/stats", self.stats_view)
        return app

    async def completions(self, request: web.Request) -> web.StreamResponse:
        arrival, stats = self.arrivals.get(request.transport) or time.perf_counter(), self.stats
        body = msgspec.json.decode(await request.read())
        n, finish = self.config.length(body.get("max_tokens"), bool(body.get("ignore_eos")))
        final = self._final(
            n, finish, len(body.get("prompt") or []), stream=bool(body.get("stream"))
        )
        rid = request.headers.get("X-Request-Id", str(stats.arrivals))
        stats.arrivals += 1
        stats.change(+1)
        try:
            if not body.get("stream"):
                await asyncio.sleep((self.config.ttft_ms + (n - 1) * self.config.itl_ms) / 1e3)
                return web.json_response(final)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            first = last = None
            if n > 0:
                if self.pacer is None:
                    self.pacer = TokenPacer(self.config.itl_ms / 1e3, stats)
                head = HEAD % (rid.encode(), self.config.model.encode())
                reply = PacedReply(request.transport, head, arrival + self.config.ttft_ms / 1e3, n)
                self.pacer.add(reply)
                last, first = await reply.done, reply.first
                if last is None:  # the client went away
                    stats.finished(rid, arrival, first, None, reply.sent)
                    return resp
            stats.finished(rid, arrival, first, last, n)
            await resp.write_eof(b"data: %s\n\ndata: [DONE]\n\n" % msgspec.json.encode(final))
            return resp
        finally:
            stats.change(-1)

    def _final(self, n: int, finish: str, prompt_tokens: int, stream: bool) -> dict:
        text = "" if stream else "".join(f" t{token_id(k)}" for k in range(n))
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
        return {
            "id": "cmpl-mock",
            "object": "text_completion",
            "created": 0,
            "model": self.config.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": usage | {"total_tokens": prompt_tokens + n},
        }

    async def health(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.config.model, "object": "model"}]}
        )

    async def stats_view(self, request: web.Request) -> web.Response:
        """Counts and lateness (?since=&until= limit it to tokens due then); ?requests adds the
        per-request rows, ?trace the concurrent streams over time."""
        q = request.query
        out = self.stats.summary(float(q.get("since", "-inf")), float(q.get("until", "inf")))
        if "requests" in q:
            out["requests"] = self.stats.requests()
        if "trace" in q:
            out["trace"] = self.stats.trace()
        return web.json_response(out)


class _Arrivals(asyncio.Protocol):
    """aiohttp's protocol, noting when each connection's bytes last arrived: the mock's TTFT
    runs from when a request reached the process, not from when aiohttp got round to its handler
    (a few turns of the event loop later: most of a millisecond under load). On a keep-alive
    connection the client sends a request only after the previous response, so the last bytes
    before the handler runs are the request's own."""

    def __init__(self, inner: asyncio.Protocol, arrivals: dict[asyncio.BaseTransport, float]):
        self.inner, self.arrivals = inner, arrivals

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self.arrivals[self.transport] = time.perf_counter()
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.arrivals.pop(self.transport, None)
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


class MockServer:
    """The mock in the running event loop: `async with MockServer(config) as m: m.url, m.stats`."""

    def __init__(self, config: MockConfig = MockConfig(), host: str = "127.0.0.1", port: int = 0):
        self.mock = Mock(config)
        self.host, self.port = host, port
        self.runner = web.AppRunner(self.mock.app(), access_log=None, shutdown_timeout=1.0)

    @property
    def stats(self) -> MockStats:
        return self.mock.stats

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> MockServer:
        await self.runner.setup()
        protocols, arrivals = self.runner.server, self.mock.arrivals
        self.listener = await asyncio.get_running_loop().create_server(
            lambda: _Arrivals(protocols(), arrivals),
            self.host,
            self.port,
            reuse_port=self.port != 0,
        )
        self.port = self.listener.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        self.listener.close()
        await self.runner.cleanup()  # closes the connections
        await self.listener.wait_closed()


def run(
    config: MockConfig, host: str, port: int, shards: int = 1, ready: Callable | None = None
) -> None:
    """Serve until SIGINT or SIGTERM. With shards > 1, that many processes share the port
    (SO_REUSEPORT; each keeps its own /stats)."""
    import multiprocessing as mp

    ctx, blob = mp.get_context("spawn"), msgspec.msgpack.encode(config)
    others = [
        ctx.Process(target=_serve_blob, args=(blob, host, port), daemon=True)
        for _ in range(shards - 1)
    ]
    for p in others:
        p.start()
    try:
        _serve(config, host, port, ready)
    finally:
        for p in others:
            p.terminate()
            p.join()


def _serve_blob(blob: bytes, host: str, port: int) -> None:
    _serve(msgspec.msgpack.decode(blob, type=MockConfig), host, port, None)


def _serve(config: MockConfig, host: str, port: int, ready: Callable | None) -> None:
    async def main() -> None:
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        async with MockServer(config, host, port) as server:
            if ready is not None:
                ready(server)
            gc.freeze()  # startup objects out of the collector's view: shorter pauses
            await stop.wait()

    run_loop(main())

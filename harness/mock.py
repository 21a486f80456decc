"""A mock OpenAI-compatible streaming server: set TTFT, inter-token latency and length.

It speaks the engine's SSE: one `data:` event per token (`choices[0].token_ids: [id]` and
`text`), then a final event with `finish_reason` and `usage` and no token, then `data: [DONE]`.

One scheduler drives every stream. It keeps a heap of (due time, stream) and on each wake
writes every token that is due, so a token costs one heap operation and one socket write, not
one sleep per token per stream. Token k of a stream is due at arrival + ttft + k * itl,
anchored to the arrival so lateness never accumulates. The mock measures its own lateness
(write time minus due time) and reports it at `/stats`, so calibration can tell the client's
error from the mock's. Times are `time.perf_counter()` (CLOCK_MONOTONIC on Linux, so they
compare across processes).

Output length: `max_tokens` when the request sets it with `ignore_eos`; with `max_tokens` but
without `ignore_eos`, the shorter of `max_tokens` and the set length (the set length plays the
EOS); without `max_tokens`, the set length.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import signal
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
import numpy as np
from aiohttp import web

# Event-loop timers have millisecond resolution (uvloop rounds to the nearest ms), so a wake
# writes every token due within the next half millisecond instead of re-arming for it.
EARLY_S = 0.0005
BATCH = 32  # tokens written per turn of the event loop, so a burst does not hold up arrivals
VOCAB = 32000
KEEP = 1 << 20  # samples kept per series, so a long-running mock stays bounded in memory
HEAD = b'{"id":"cmpl-%s","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'
TOKEN = b'data: %s"text":" t%d","token_ids":[%d],"logprobs":null,"finish_reason":null}]}\n\n'


@dataclass(frozen=True)
class MockConfig:
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    output_tokens: int = 256
    model: str = "mock"

    def length(self, max_tokens: int | None, ignore_eos: bool) -> tuple[int, str]:
        """Tokens to send and the finish reason."""
        if max_tokens is None:
            return self.output_tokens, "stop"
        if ignore_eos or max_tokens <= self.output_tokens:
            return max_tokens, "length"
        return self.output_tokens, "stop"


class MockStats:
    """What the mock saw: arrivals, concurrent streams over time, its own lateness.

    Samples live in arrays, which the garbage collector never scans (no pauses); each series
    keeps its last KEEP to 2 * KEEP samples."""

    def __init__(self) -> None:
        self.arrivals = self.active = self.max_active = self.tokens = 0
        self.trace_s, self.trace_active = array("d"), array("i")  # on each change of `active`
        self.due_s, self.lateness_s = array("d"), array("d")  # every token: due, write - due
        # one row per finished request: id; arrival, first and last token written (nan: none)
        self.request_ids: list[str] = []
        self.request_times, self.request_tokens = array("d"), array("i")

    def change(self, delta: int) -> None:
        self.active += delta
        self.max_active = max(self.max_active, self.active)
        self.trace_s.append(time.perf_counter())
        self.trace_active.append(self.active)
        _trim(self.trace_s, self.trace_active)

    def late(self, due: float, seconds: float, tokens: int) -> None:
        self.tokens += tokens
        self.due_s.extend([due] * tokens)
        self.lateness_s.extend([seconds] * tokens)
        _trim(self.due_s, self.lateness_s)

    def finished(
        self, rid: str, arrival: float, first: float | None, last: float | None, n: int
    ) -> None:
        nan = float("nan")
        self.request_ids.append(rid)
        self.request_times.extend(
            (arrival, nan if first is None else first, nan if last is None else last)
        )
        self.request_tokens.append(n)
        if len(self.request_ids) > 2 * KEEP:
            del self.request_ids[:KEEP], self.request_times[: 3 * KEEP], self.request_tokens[:KEEP]

    def summary(self, since: float = float("-inf"), until: float = float("inf")) -> dict:
        """Counts, and the lateness of the tokens due in [since, until] (perf_counter times)."""
        due = np.array(self.due_s)
        late = np.array(self.lateness_s)[(due >= since) & (due <= until)] * 1e3
        p50, p99 = np.percentile(late, [50, 99]).tolist() if late.size else (None, None)
        top = float(late.max()) if late.size else None
        return {"arrivals": self.arrivals, "active": self.active, "max_active": self.max_active,
                "tokens": self.tokens, "lateness_ms": {"p50": p50, "p99": p99, "max": top}}  # fmt: skip

    def requests(self) -> list[tuple]:
        """(id, arrival, first token written, last token written, tokens); None where none."""
        t = [None if x != x else x for x in self.request_times]
        return list(
            zip(self.request_ids, t[0::3], t[1::3], t[2::3], self.request_tokens, strict=True)
        )

    def trace(self) -> list[tuple[float, int]]:
        return list(zip(self.trace_s, self.trace_active, strict=True))


def _trim(*series: array) -> None:
    if len(series[0]) > 2 * KEEP:
        for s in series:
            del s[:KEEP]


class _Stream:
    __slots__ = ("transport", "head", "due", "left", "sent", "first", "done")

    def __init__(self, transport: asyncio.Transport, head: bytes, due: float, tokens: int):
        self.transport, self.head, self.due, self.left = transport, head, due, tokens
        self.sent = 0
        self.first: float | None = None
        self.done = asyncio.get_running_loop().create_future()  # the last write time, or None


class Scheduler:
    """Writes every stream's tokens on schedule from one timer. Token frames go straight to the
    transport as HTTP chunks (the response was prepared chunked), so writing never waits."""

    def __init__(self, itl_s: float, stats: MockStats):
        self.itl_s, self.stats = itl_s, stats
        self.heap: list[tuple[float, int, _Stream]] = []
        self.seq = itertools.count()
        self.timer: asyncio.Handle | None = None
        self.wake = float("inf")

    def add(self, stream: _Stream) -> None:
        heapq.heappush(self.heap, (stream.due, next(self.seq), stream))
        if stream.due < self.wake:
            self._arm(stream.due)

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.wake = when
        self.timer = asyncio.get_running_loop().call_later(when - time.perf_counter(), self._fire)

    def _fire(self) -> None:
        self.timer, self.wake = None, float("inf")
        heap, written = self.heap, 0
        while heap and heap[0][0] <= time.perf_counter() + EARLY_S:
            if written >= BATCH:  # let arrivals in before writing the rest
                self.wake = heap[0][0]
                self.timer = asyncio.get_running_loop().call_soon(self._fire)
                return
            due, _, s = heapq.heappop(heap)
            if s.transport.is_closing():  # the client went away
                if not s.done.done():
                    s.done.set_result(None)
                continue
            burst = s.left if self.itl_s == 0 else 1  # no gap between tokens: all at once
            s.transport.writelines([_token_frame(s.head, s.sent + k) for k in range(burst)])
            now = time.perf_counter()
            self.stats.late(due, now - due, burst)
            written += burst
            s.first = s.first or now
            s.sent += burst
            s.left -= burst
            if s.left > 0:
                s.due = due + self.itl_s
                heapq.heappush(heap, (s.due, next(self.seq), s))
            elif not s.done.done():
                s.done.set_result(now)
        if heap:
            self._arm(heap[0][0])


def _token_frame(head: bytes, k: int) -> bytes:
    """The k-th token's SSE event as one HTTP chunk."""
    token = (k * 7919 + 17) % VOCAB
    data = TOKEN % (head, token, token)
    return b"%x\r\n%s\r\n" % (len(data), data)


class Mock:
    """The mock's handlers, its stats, and (made inside the serving loop) its scheduler."""

    def __init__(self, config: MockConfig):
        self.config, self.stats = config, MockStats()
        self.scheduler: Scheduler | None = None
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
                if self.scheduler is None:
                    self.scheduler = Scheduler(self.config.itl_ms / 1e3, stats)
                head = HEAD % (rid.encode(), self.config.model.encode())
                stream = _Stream(request.transport, head, arrival + self.config.ttft_ms / 1e3, n)
                self.scheduler.add(stream)
                last, first = await stream.done, stream.first
                if last is None:  # the client went away
                    stats.finished(rid, arrival, first, None, stream.sent)
                    return resp
            stats.finished(rid, arrival, first, last, n)
            await resp.write_eof(b"data: %s\n\ndata: [DONE]\n\n" % msgspec.json.encode(final))
            return resp
        finally:
            stats.change(-1)

    def _final(self, n: int, finish: str, prompt_tokens: int, stream: bool) -> dict:
        text = "" if stream else "".join(f" t{(k * 7919 + 17) % VOCAB}" for k in range(n))
        return {"id": "cmpl-mock", "object": "text_completion", "created": 0, "model": self.config.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                          "total_tokens": prompt_tokens + n}}  # fmt: skip

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
    from harness.loadgen import run_loop

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

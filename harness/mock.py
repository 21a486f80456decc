"""A mock OpenAI-compatible streaming server: set TTFT, inter-token latency and length.

One scheduler drives every stream. It keeps a heap of (due time, stream) and, on each wake,
writes every token that is due, so a token costs one heap operation and one socket write, not
one sleep per token per stream. Token k of a stream is due at arrival + ttft + k * itl, anchored
to the arrival so lateness never accumulates. The mock measures its own lateness (write time
minus due time) and reports it at `/stats`, so calibration can tell the client's error from the
mock's. Times are `time.perf_counter()` (CLOCK_MONOTONIC on Linux: comparable across processes).

Output length: `max_tokens` when the request sets it with `ignore_eos`; with `max_tokens` but no
`ignore_eos`, the shorter of `max_tokens` and the set length (the set length plays the EOS);
without `max_tokens`, the set length.
"""

from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import json
import time
from array import array
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


@dataclass(frozen=True)
class MockConfig:
    ttft_ms: float = 20.0
    itl_ms: float = 5.0
    output_tokens: int = 256
    model: str = "mock"

    def length(self, max_tokens: int | None, ignore_eos: bool) -> tuple[int, str]:
        if max_tokens is None:
            return self.output_tokens, "stop"
        if ignore_eos or max_tokens <= self.output_tokens:
            return max_tokens, "length"
        return self.output_tokens, "stop"


class MockStats:
    """What the mock saw: arrivals, concurrent streams over time, its own schedule lateness.

    Samples live in arrays (the garbage collector never scans them, so they cause no pauses);
    each series keeps its last KEEP to KEEP * 2 samples.
    """

    def __init__(self) -> None:
        self.arrivals = self.active = self.max_active = self.tokens = 0
        self.trace_s, self.trace_active = array("d"), array("i")  # on each change of `active`
        self.lateness_s = array("d")  # write time - due time, every token
        # one row per finished request: id, arrival, first and last token written (nan: none)
        self.request_ids: list[str] = []
        self.request_times, self.request_tokens = array("d"), array("i")

    def change(self, delta: int) -> None:
        self.active += delta
        self.max_active = max(self.max_active, self.active)
        self.trace_s.append(time.perf_counter())
        self.trace_active.append(self.active)
        _trim(self.trace_s, self.trace_active)

    def finished(self, rid: str, arrival: float, first: float | None, last: float | None, n: int) -> None:
        self.request_ids.append(rid)
        self.request_times.extend((arrival, _nan(first), _nan(last)))
        self.request_tokens.append(n)
        if len(self.request_ids) > 2 * KEEP:
            del self.request_ids[:KEEP], self.request_times[: 3 * KEEP], self.request_tokens[:KEEP]

    def late(self, seconds: float, tokens: int) -> None:
        self.tokens += tokens
        if tokens == 1:
            self.lateness_s.append(seconds)
        else:
            self.lateness_s.extend([seconds] * tokens)
        _trim(self.lateness_s)

    def summary(self) -> dict:
        late = np.frombuffer(self.lateness_s, dtype=np.float64) * 1e3
        q = np.percentile(late, [50, 99]).tolist() if late.size else [None, None]
        top = float(late.max()) if late.size else None
        return {
            "arrivals": self.arrivals,
            "active": self.active,
            "max_active": self.max_active,
            "tokens": self.tokens,
            "lateness_ms": {"p50": q[0], "p99": q[1], "max": top},
        }

    def requests(self) -> list[tuple]:
        """(id, arrival, first token written, last token written, tokens); None where none."""
        t = [None if x != x else x for x in self.request_times]
        return list(zip(self.request_ids, t[0::3], t[1::3], t[2::3], self.request_tokens, strict=True))

    def trace(self) -> list[tuple[float, int]]:
        return list(zip(self.trace_s, self.trace_active, strict=True))


def _nan(x: float | None) -> float:
    return float("nan") if x is None else x


def _trim(*series: array) -> None:
    if len(series[0]) > 2 * KEEP:
        for s in series:
            del s[:KEEP]


class _Stream:
    __slots__ = ("transport", "head", "due", "left", "sent", "first", "done")

    def __init__(self, transport: asyncio.Transport, head: bytes, due: float, tokens: int):
        self.transport = transport
        self.head = head  # the event's JSON up to the choice's text
        self.due = due
        self.left = tokens
        self.sent = 0
        self.first: float | None = None
        self.done: asyncio.Future = asyncio.get_running_loop().create_future()


class Scheduler:
    """Writes every stream's tokens on schedule from one timer."""

    def __init__(self, itl_s: float, stats: MockStats):
        self.itl_s = itl_s
        self.stats = stats
        self.heap: list[tuple[float, int, _Stream]] = []
        self.seq = itertools.count()
        self.timer: asyncio.TimerHandle | None = None
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
        heap, stats, written = self.heap, self.stats, 0
        while heap and heap[0][0] <= time.perf_counter() + EARLY_S:
            if written >= BATCH:  # let arrivals in before writing the rest
                self.wake = heap[0][0]
                self.timer = asyncio.get_running_loop().call_soon(self._fire)
                return
            due, _, s = heapq.heappop(heap)
            if s.transport.is_closing():  # the client went away
                s.done.done() or s.done.set_result(None)
                continue
            burst = s.left if self.itl_s == 0 else 1  # no gap between tokens: write them at once
            if burst == 1:
                s.transport.write(_token_frame(s.head, s.sent))
            else:
                s.transport.writelines([_token_frame(s.head, s.sent + k) for k in range(burst)])
            now = time.perf_counter()
            stats.late(now - due, burst)
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
    data = b'data: %s"text":" t%d","token_ids":[%d],"logprobs":null,"finish_reason":null}]}\n\n'
    data %= (head, token, token)
    return b"%x\r\n%s\r\n" % (len(data), data)


def make_app(config: MockConfig) -> web.Application:
    stats = MockStats()
    app = web.Application()
    app["stats"] = stats
    app["config"] = config
    app["scheduler"] = None  # made on the first request, inside the serving loop

    async def completions(request: web.Request) -> web.StreamResponse:
        arrival = time.perf_counter()
        body = msgspec.json.decode(await request.read())
        n, finish = config.length(body.get("max_tokens"), bool(body.get("ignore_eos")))
        prompt_tokens = len(body.get("prompt") or [])
        rid = request.headers.get("X-Request-Id", str(stats.arrivals))
        stats.arrivals += 1
        stats.change(+1)
        try:
            if not body.get("stream"):
                await asyncio.sleep((config.ttft_ms + (n - 1) * config.itl_ms) / 1e3)
                return web.json_response(_completion(config, n, finish, prompt_tokens))
            return await _stream(request, arrival, rid, n, finish, prompt_tokens)
        finally:
            stats.change(-1)

    async def _stream(request, arrival, rid, n, finish, prompt_tokens) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if n <= 0:
            last, first = None, None
        else:
            if app["scheduler"] is None:
                app["scheduler"] = Scheduler(config.itl_ms / 1e3, stats)
            head = b'{"id":"cmpl-%s","object":"text_completion","created":0,"model":"%s","choices":[{"index":0,'
            stream = _Stream(
                request.transport,
                head % (rid.encode(), config.model.encode()),
                arrival + config.ttft_ms / 1e3,
                n,
            )
            app["scheduler"].add(stream)
            last, first = await stream.done, stream.first
            if last is None:  # the client went away
                stats.finished(rid, arrival, first, None, stream.sent)
                return resp
        stats.finished(rid, arrival, first, last, n)
        final = _completion(config, n, finish, prompt_tokens, stream=True)
        await resp.write_eof(
            b"data: %s\n\ndata: [DONE]\n\n" % json.dumps(final, separators=(",", ":")).encode()
        )
        return resp

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(_: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": config.model, "object": "model"}]}
        )

    async def stats_view(request: web.Request) -> web.Response:
        out = stats.summary()
        if "requests" in request.query:
            out["requests"] = stats.requests()
        if "trace" in request.query:
            out["trace"] = stats.trace()
        return web.json_response(out)

    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats_view)
    return app


def _completion(config: MockConfig, n: int, finish: str, prompt_tokens: int, stream=False) -> dict:
    text = "" if stream else "".join(f" t{(k * 7919 + 17) % VOCAB}" for k in range(n))
    return {
        "id": "cmpl-mock",
        "object": "text_completion",
        "created": 0,
        "model": config.model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        },
    }


class MockServer:
    """The mock inside the current event loop (tests): `async with MockServer(cfg) as m: m.url`."""

    def __init__(self, config: MockConfig = MockConfig(), host: str = "127.0.0.1", port: int = 0):
        self.app = make_app(config)
        self.host, self.port = host, port
        self.runner = web.AppRunner(self.app, access_log=None, shutdown_timeout=1.0)

    @property
    def stats(self) -> MockStats:
        return self.app["stats"]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def __aenter__(self) -> MockServer:
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port, reuse_port=self.port != 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


async def serve(config: MockConfig, host: str, port: int, ready=None) -> None:
    """Serve until cancelled or signalled (SIGINT/SIGTERM)."""
    import signal

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with MockServer(config, host, port) as server:
        if ready is not None:
            ready(server)
        gc.freeze()  # startup objects out of the collector's view: shorter pauses while serving
        await stop.wait()


def run(config: MockConfig, host: str, port: int, shards: int = 1, ready=None) -> None:
    """Run the mock; with shards > 1, that many processes share the port (SO_REUSEPORT)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    others = [
        ctx.Process(target=_run_one, args=(config, host, port), daemon=True)
        for _ in range(shards - 1)
    ]
    for p in others:
        p.start()
    try:
        _run_one(config, host, port, ready)
    finally:
        for p in others:
            p.terminate()
            p.join()


def _run_one(config: MockConfig, host: str, port: int, ready=None) -> None:
    from harness.loadgen import run_loop

    run_loop(serve(config, host, port, ready))

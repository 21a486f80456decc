"""The closed loop: exactly C in flight, the same sequence for every arm (INVARIANTS 40), the raw
facts it records, failures recorded and survived, interruption, SSE from other servers, shards.

No test asserts an upper time bound: these run on loaded two-core CI machines."""

from __future__ import annotations

import asyncio
import json
from collections import Counter

import pytest
from aiohttp import web

from harness.analysis.schema import Slot
from harness.measure.event_loop import run_loop
from harness.measure.loadgen import run_load
from harness.measure.mock.server import MockConfig, MockServer
from harness.measure.request_sequence import RequestSpec, build_requests
from harness.scenario import LoadProfile

LOAD = LoadProfile(prompt_tokens=(4, 12), output_tokens=(6, 6), requests=0, warmup=0, seed=7)


def _in_flight(records, t: float) -> int:
    """Requests holding a lane at t: from when the lane was free for them to their end."""
    return sum(r.intended_send_s <= t < r.end_s for r in records)


def _mean_active(trace: list[tuple[float, int]], a: float, b: float) -> float:
    """Time-weighted mean of the mock's streams in flight over [a, b]."""
    total, (t_prev, active) = 0.0, (a, 0)
    for t, n in trace:
        if t > a:
            total += (min(t, b) - max(t_prev, a)) * active
        if t >= b:
            break
        t_prev, active = t, n
    else:
        total += (b - max(t_prev, a)) * active
    return total / (b - a)


def test_sequence_is_fixed_by_the_seed():
    a = build_requests(LOAD, vocab_size=100, count=50)
    b = build_requests(LOAD, vocab_size=100, count=80)
    c = build_requests(LOAD, vocab_size=100, count=50, seed=8)
    assert list(a) == list(b)[:50]  # a longer sequence extends a shorter one
    assert list(a) != list(c)
    assert [r.index for r in a] == list(range(50))
    for r in b:
        assert 4 <= len(r.prompt) <= 12 and r.max_tokens == 6
        assert all(0 <= t < 100 for t in r.prompt)
    assert len({len(r.prompt) for r in b}) > 1 and len({t for r in b for t in r.prompt}) > 50


def test_exactly_c_in_flight_and_raw_facts():
    concurrency, count, warmup, ttft_ms = 4, 24, 4, 5.0
    requests = build_requests(LOAD, vocab_size=100, count=count)

    async def main():
        async with MockServer(MockConfig(ttft_ms=ttft_ms, itl_ms=1.0)) as mock:
            progress = []
            where = Slot("pr", "B", "B3", 2, 3)
            result = await run_load(
                mock.url,
                requests,
                concurrency,
                warmup,
                where,
                progress.append,
                progress_interval_s=0.01,
            )
            return result, mock.stats, progress

    result, stats, progress = run_loop(main())
    records = result.records
    assert [r.index for r in records] == list(range(count))
    assert all(r.ok for r in records), [r.error for r in records if not r.ok]
    assert [r.warmup for r in records] == [True] * warmup + [False] * (count - warmup)
    assert {(r.arm, r.letter, r.server, r.block, r.slot) for r in records} == {
        ("pr", "B", "B3", 2, 3)
    }
    # the server never saw more than C streams, and saw every request once
    assert stats.max_active == concurrency and stats.arrivals == count
    # the client held exactly C lanes busy through the steady window
    a, b = result.steady_start_s, result.steady_end_s
    assert a is not None and a < b and not result.interrupted
    moments = [r.send_s for r in records if a <= r.send_s < b] + [a, (a + b) / 2]
    assert all(_in_flight(records, t) == concurrency for t in moments)
    assert max(r.end_s for r in records if r.warmup) <= a  # no warmup request in the window
    # and the server saw C streams through it, but for the moments between one stream's end and
    # the next one's arrival (a generous bound: no timing assertion)
    assert _mean_active(stats.trace(), result.t0_perf + a, result.t0_perf + b) > concurrency / 2
    for r in records:
        assert r.status == 200 and r.finish_reason == "length"
        assert r.prompt_tokens == len(requests[r.index].prompt)
        assert r.output_tokens == r.max_tokens == len(r.token_times_s) == 6
        assert r.intended_send_s <= r.send_s < r.first_token_s <= r.token_times_s[-1] <= r.end_s
        assert r.token_times_s == sorted(r.token_times_s)
        assert (
            r.first_token_s - r.send_s >= (ttft_ms - 0.5) / 1e3
        )  # the mock's TTFT, less its early window
    assert progress and progress[-1].done == count and progress[-1].tokens == 6 * count
    assert progress[-1].in_flight == 0 and result.client_cpu_s > 0


def test_same_seed_same_requests_for_every_arm():
    requests = build_requests(LOAD, vocab_size=100, count=12)
    seen: list[list] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen[-1].append((int(request.headers["X-Request-Id"]), body["prompt"], body["max_tokens"]))
        return await _sse(request, [b'{"choices":[{"text":"a"}]}'])

    async def main():
        async with _Server(handler) as url:
            for arm in ("A", "B"):
                seen.append([])
                await run_load(url, requests, 3, slot=Slot(arm, arm, f"{arm}0", 0, 0))

    run_loop(main())
    assert (
        sorted(seen[0]) == sorted(seen[1]) == [(r.index, r.prompt, r.max_tokens) for r in requests]
    )


async def _sse(
    request: web.Request, events: list[bytes], chunk: int | None = None
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    raw = b"".join(b"data: " + e + b"\n\n" for e in [*events, b"[DONE]"])
    step = chunk or len(raw)
    for i in range(0, len(raw), step):
        await resp.write(raw[i : i + step])
    await resp.write_eof()
    return resp


class _Server:
    """A one-handler aiohttp server on a free loopback port: `async with _Server(h) as url`."""

    def __init__(self, handler):
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        app.router.add_post("/v1/audio/speech", handler)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)

    async def __aenter__(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        await self.runner.cleanup()


def test_failures_are_recorded_and_the_loop_goes_on():
    arrivals = Counter()

    async def handler(request: web.Request) -> web.StreamResponse:
        n = int(request.headers["X-Request-Id"]) % 4
        arrivals[n] += 1
        if n == 1:
            return web.Response(status=500, text="boom")
        if n == 2:
            return web.json_response({"error": "bad prompt"}, status=400)
        if n == 3:  # two tokens, then the connection drops mid-stream
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b'data: {"choices":[{"text":"a"}]}\n\n' * 2)
            request.transport.close()
            return resp
        return await _sse(request, [b'{"choices":[{"text":"a"}]}'])

    async def main():
        async with _Server(handler) as url:
            return await run_load(url, [RequestSpec(i, [1, 2], 3) for i in range(20)], 3)

    result = run_loop(main())
    by_kind = {k: [r for r in result.records if r.index % 4 == k] for k in range(4)}
    assert len(result.records) == 20 and sum(arrivals.values()) == 20
    assert all(r.ok and r.output_tokens == 1 for r in by_kind[0])
    assert all(r.status == 500 and r.error.startswith("HTTP 500: boom") for r in by_kind[1])
    assert all(r.status == 400 and "bad prompt" in r.error for r in by_kind[2])
    for r in by_kind[3]:
        assert r.status == 200 and not r.ok and r.end_s is not None
        assert len(r.token_times_s) == 2


def test_unreachable_server_fails_every_request_without_raising():
    import socket

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    requests = [RequestSpec(i, [1], 2) for i in range(6)]
    result = run_loop(run_load(f"http://127.0.0.1:{port}", requests, 2))
    assert len(result.records) == 6
    assert all(r.status == 0 and "Connect" in r.error for r in result.records)


def test_stop_event_returns_what_was_measured():
    concurrency = 3

    async def main():
        async with MockServer(MockConfig(ttft_ms=1, itl_ms=10, output_tokens=10_000)) as mock:
            stop = asyncio.Event()
            asyncio.get_running_loop().call_later(0.3, stop.set)
            requests = [RequestSpec(i, [1], 10_000) for i in range(10)]
            return await run_load(mock.url, requests, concurrency, stop_event=stop)

    result = run_loop(main())
    assert result.interrupted
    assert len(result.records) == concurrency  # the first C, cut in flight
    for r in result.records:
        assert r.error == "interrupted" and r.status == 200
        assert 0 < len(r.token_times_s) < 10_000 and r.end_s >= r.token_times_s[-1]
    assert result.steady_end_s is not None and result.steady_end_s >= result.steady_start_s


@pytest.mark.parametrize("shards", [1, 2])
def test_send_for_s_stops_sending_then_drains(shards):
    """--duration: no request is sent after the deadline; those in flight finish normally."""
    concurrency, send_for = 4, 0.4

    async def main():
        async with MockServer(MockConfig(ttft_ms=1, itl_ms=5, output_tokens=20)) as mock:
            requests = [RequestSpec(i, [1], 20) for i in range(100_000)]
            return await run_load(
                mock.url, requests, concurrency, send_for_s=send_for, shards=shards
            )

    result = run_loop(main())
    assert not result.interrupted
    assert result.records and all(r.ok and r.output_tokens == 20 for r in result.records)
    assert max(r.send_s for r in result.records) < send_for
    assert len(result.records) < 100_000
    assert result.steady_end_s is not None and result.steady_end_s >= send_for


def test_openai_style_streams_from_other_servers():
    """vLLM/SGLang style: text only, CRLF, comments, odd chunking, usage in its own last event
    (and a usage count that disagrees with what was streamed: output_tokens trusts usage)."""
    events = [
        b'{"choices":[{"index":0,"text":" a","finish_reason":null}]}',
        b'{"choices":[{"index":0,"text":"","finish_reason":null}]}',  # no token
        b'{"choices":[{"index":0,"text":" b", "token_ids": [5, 6]}]}',  # two tokens
        b'{"choices":[{"index":0,"text":" c","finish_reason":"length"}],"usage":null}',
        b'{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":5}}',
    ]

    async def handler(request: web.Request) -> web.StreamResponse:
        body = json.loads(await request.read())
        assert body["stream"] and body["ignore_eos"] and body["model"] == "m"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        raw = b": keep-alive\r\n\r\n" + b"".join(b"data: " + e + b"\r\n\r\n" for e in events)
        raw += b"data: [DONE]\r\n\r\n"
        for i in range(0, len(raw), 7):
            await resp.write(raw[i : i + 7])
        await resp.write_eof()
        return resp

    async def main():
        async with _Server(handler) as url:
            return await run_load(
                url + "/v1/completions", [RequestSpec(0, [1, 2], 8)], 1, model="m"
            )

    (r,) = run_loop(main()).records
    assert r.ok and r.finish_reason == "length"
    assert len(r.token_times_s) == 4 and r.output_tokens == 5


def test_stream_without_done_is_a_failure():
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"text":"a"}]}\n\n')
        await resp.write_eof()
        return resp

    async def main():
        async with _Server(handler) as url:
            return await run_load(url, [RequestSpec(0, [1], 1)], 1)

    (r,) = run_loop(main()).records
    assert r.error == "stream ended before [DONE]" and len(r.token_times_s) == 1


def test_speech_replies_are_recorded_as_pcm_bytes_as_they_arrive():
    """A speech load posts token-id inputs of exact length (ignore_eos) to /v1/audio/speech
    and records each piece of PCM's arrival and size; a body cut short is a failure."""
    bodies = []

    async def handler(request: web.Request) -> web.StreamResponse:
        bodies.append(json.loads(await request.read()))
        resp = web.StreamResponse(headers={"Content-Type": "audio/pcm"})
        await resp.prepare(request)
        for size in (4096, 4096, 1000):
            await resp.write(b"\x01" * size)
            await asyncio.sleep(0.02)
        if request.headers["X-Request-Id"] == "1":
            request.transport.close()  # no end of the chunked body
            return resp
        await resp.write_eof()
        return resp

    async def main():
        async with _Server(handler) as url:
            specs = [RequestSpec(0, [5, 6], 35), RequestSpec(1, [7], 28)]
            return await run_load(url, specs, 1, api="speech")

    good, cut = run_loop(main()).records
    assert bodies[0] == {
        "input": [5, 6], "response_format": "pcm", "max_tokens": 35, "ignore_eos": True,
        "temperature": 0.0,
    }  # fmt: skip
    assert good.ok and sum(good.audio_bytes) == 9192 and len(good.audio_times_s) >= 3
    assert good.first_token_s == good.audio_times_s[0] <= good.end_s
    assert good.audio_times_s == sorted(good.audio_times_s) and not good.token_times_s
    assert not cut.ok and "closed the connection" in cut.error


@pytest.mark.slow
def test_shards_keep_c_in_flight_in_total():
    concurrency, count = 6, 30
    requests = build_requests(LOAD, vocab_size=100, count=count)

    async def main():
        async with MockServer(MockConfig(ttft_ms=5, itl_ms=2)) as mock:
            result = await run_load(mock.url, requests, concurrency, warmup=6, shards=2)
            return result, mock.stats

    result, stats = run_loop(main())
    assert result.shards == 2
    assert [r.index for r in result.records] == list(range(count))
    assert all(r.ok and r.output_tokens == 6 for r in result.records)
    assert stats.max_active == concurrency and stats.arrivals == count
    a, b = result.steady_start_s, result.steady_end_s
    assert a is not None and a < b
    assert all(_in_flight(result.records, t) == concurrency for t in (a, (a + b) / 2))


def test_a_bug_in_a_lane_is_raised_not_recorded(monkeypatch):
    from harness.measure import sse

    def broken(self):
        raise RuntimeError("bug")

    monkeypatch.setattr(sse.ResponseReader, "finish", broken)

    async def main():
        async with MockServer(MockConfig(ttft_ms=1, itl_ms=1, output_tokens=2)) as mock:
            await run_load(mock.url, [RequestSpec(i, [1], 2) for i in range(4)], 2)

    with pytest.raises(RuntimeError, match="bug"):
        run_loop(main())

"""The mock server: the SSE format the engine speaks, its length rules, its schedule and stats."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from harness.measure.event_loop import run_loop
from harness.measure.mock.server import MockConfig, MockServer

ROOT = Path(__file__).resolve().parent.parent


def test_length_rules():
    config = MockConfig(output_tokens=10)
    assert config.length(None, False) == (10, "stop")
    assert config.length(None, True) == (10, "stop")
    assert config.length(25, True) == (25, "length")  # ignore_eos: exactly max_tokens
    assert config.length(4, False) == (4, "length")
    assert config.length(25, False) == (10, "stop")  # the set length plays the EOS


async def _stream(url: str, body: dict) -> list[bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/event-stream")
            raw = await resp.read()
    return [e for e in raw.split(b"\n\n") if e]


def test_sse_format_matches_the_engine():
    async def main():
        async with MockServer(MockConfig(ttft_ms=2, itl_ms=1, output_tokens=50)) as mock:
            body = {"prompt": [1, 2, 3], "max_tokens": 5, "ignore_eos": True, "stream": True}
            return await _stream(mock.url, body)

    events = run_loop(main())
    assert all(e.startswith(b"data: ") for e in events)
    assert events[-1] == b"data: [DONE]"
    payloads = [json.loads(e[6:]) for e in events[:-1]]
    tokens, final = payloads[:-1], payloads[-1]
    assert len(tokens) == 5
    for p in tokens:
        choice = p["choices"][0]
        assert len(choice["token_ids"]) == 1 and choice["text"] and choice["finish_reason"] is None
    assert final["choices"][0]["finish_reason"] == "length"
    assert "token_ids" not in final["choices"][0] and final["choices"][0]["text"] == ""
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}


def test_health_models_and_non_streaming():
    async def main():
        async with MockServer(MockConfig(ttft_ms=1, itl_ms=0, output_tokens=3, model="m")) as mock:
            async with aiohttp.ClientSession() as session:
                async with session.get(mock.url + "/health") as resp:
                    assert resp.status == 200
                async with session.get(mock.url + "/v1/models") as resp:
                    models = await resp.json()
                async with session.post(mock.url + "/v1/completions", json={"prompt": [1]}) as resp:
                    completion = await resp.json()
            return models, completion

    models, completion = run_loop(main())
    assert models["data"][0]["id"] == "m"
    assert completion["usage"]["completion_tokens"] == 3
    assert completion["choices"][0]["finish_reason"] == "stop"


def test_schedule_and_stats():
    """Tokens never come before their due time (less the half-millisecond early window); the
    mock counts arrivals, concurrent streams and per-request rows. No upper time bounds."""
    ttft_ms, itl_ms, n, streams = 5.0, 2.0, 10, 8

    async def one(session, url, rid):
        start = time.perf_counter()
        body = {"prompt": [7], "max_tokens": n, "ignore_eos": True, "stream": True}
        headers = {"X-Request-Id": rid}
        async with session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            await resp.read()
        return time.perf_counter() - start

    async def main():
        import asyncio

        async with MockServer(MockConfig(ttft_ms=ttft_ms, itl_ms=itl_ms)) as mock:
            async with aiohttp.ClientSession() as session:
                spans = await asyncio.gather(
                    *(one(session, mock.url, str(i)) for i in range(streams))
                )
                async with session.get(mock.url + "/stats?requests&trace") as resp:
                    return spans, await resp.json()

    spans, stats = run_loop(main())
    floor = (ttft_ms + (n - 1) * itl_ms - 0.5) / 1e3
    assert all(s >= floor for s in spans)
    assert stats["arrivals"] == streams and stats["max_active"] == streams
    assert stats["tokens"] == streams * n and stats["active"] == 0
    assert sorted(row[0] for row in stats["requests"]) == sorted(str(i) for i in range(streams))
    for _, arrival, first, last, tokens in stats["requests"]:
        assert tokens == n and arrival < first <= last
        assert first - arrival >= (ttft_ms - 0.5) / 1e3
    assert stats["lateness_ms"]["p50"] is not None
    assert [active for _, active in stats["trace"]][-1] == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_bench_mock_command_serves_and_stops():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-c",
        "from harness.cli import main; main()",
        "mock",
        "--port",
        str(port),
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    assert sock.recv(100).startswith(b"HTTP/1.1 200")
                    break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "bench mock did not start"
                time.sleep(0.1)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err.decode()
    assert f"127.0.0.1:{port}" in err.decode()


@pytest.mark.slow
def test_calibrate_small_run():
    """`bench calibrate` end to end at a small size: it runs, and its figures are well formed."""
    from harness.measure.calibrate import Settings, calibrate

    result = calibrate(
        Settings(concurrency=8, output_tokens=16, itl_ms=2, ttft_ms=5, duration_s=0.5)
    )
    lat, thr = result["latency"], result["throughput"]
    assert lat["failures"] == thr["failures"] == 0
    assert lat["mock_max_streams"] == 8
    assert lat["tokens_per_s"] > 0 and thr["tokens_per_s"] > 0
    assert set(result["met"]) == {
        "ttft_error_p50",
        "ttft_error_p99",
        "tokens_per_s_one_core",
        "no_failures",
    }
    # the three parts add up to the whole (medians of sums are not sums of medians: means are)
    parts = sum(lat[k]["mean"] for k in ("to_mock_ms", "mock_ttft_error_ms", "to_client_ms"))
    assert (
        abs(parts - lat["ttft_error_ms"]["mean"]) < 1e-6
        or lat["to_mock_ms"]["n"] != lat["ttft_error_ms"]["n"]
    )

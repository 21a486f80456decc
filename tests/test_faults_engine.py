"""Faults injected into the engine; each test makes one happen and asserts what the user sees,
within a bound, with no process left behind (docs/RELIABILITY.md, INVARIANTS 19-23).

The fast tests run the real API server in this process, on the real ZMQ link, against a
stand-in worker they control. The `slow` ones start `python -m engine serve` and kill, stop
or stall its processes.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import logging
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import pytest
import zmq
from aiohttp.test_utils import make_mocked_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.bench_api import one_token_each
from engine import ipc_dirs
from engine.api import connections
from engine.api.server import build_app, errors_as_json, on_ready
from engine.api.worker_client import WorkerClient
from engine.config import ConfigError, EngineConfig
from engine.messages import (
    Abort,
    AddRequest,
    GetStats,
    Heartbeat,
    Ready,
    Shutdown,
    StepFrames,
    WorkerStats,
    decode_to_worker,
    encode,
)
from engine.tokenizer import ByteTokenizer
from engine.worker.heartbeat import HEARTBEAT_S
from harness.measure.server import ServerProcess, group_members
from harness.scenario import load_scenario
from tests.conftest import Api

VOCAB, MAX_LEN = 4096, 512
STREAM_TIMEOUT_S = 10  # a stream that hangs fails the test instead of the suite


# --- a stand-in worker, and the API server in this process --------------------------------


class FakeWorker(threading.Thread):
    """The worker's side of the ZMQ link: Ready, then one token per tick for each running
    request and a heartbeat every HEARTBEAT_S; stats answered unless `hold_stats` is set; `raw`
    bytes sent as they are; nothing at all while `paused` is set (a stalled worker)."""

    def __init__(self, ipc: str, tick_s: float = 0.005):
        super().__init__(daemon=True)
        self.ipc, self.tick_s = ipc, tick_s
        self.hold_stats = threading.Event()
        self.paused = threading.Event()
        self.longest_step_s = tick_s  # what its heartbeats report
        self.stats_asked = 0
        self.raw: queue.Queue[bytes] = queue.Queue()
        self.done = threading.Event()

    def run(self) -> None:
        ctx = zmq.Context()
        inbox, outbox = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
        inbox.bind(f"ipc://{self.ipc}/to_worker")
        outbox.connect(f"ipc://{self.ipc}/from_worker")
        outbox.send(encode(Ready("fake", "tiny", "cpu", 1, VOCAB, MAX_LEN, [])))
        running: dict[int, int] = {}
        held = 0
        beat = time.monotonic()
        while not self.done.is_set():
            if self.paused.is_set():
                time.sleep(self.tick_s)
                continue
            if time.monotonic() - beat >= HEARTBEAT_S:
                beat = time.monotonic()
                outbox.send(encode(Heartbeat(self.longest_step_s)))
            while inbox.poll(0):
                msg = decode_to_worker(inbox.recv())
                if isinstance(msg, AddRequest):
                    running[msg.rid] = msg.max_tokens
                elif isinstance(msg, Abort):
                    running.pop(msg.rid, None)
                elif isinstance(msg, GetStats):
                    held += 1
                    self.stats_asked += 1
                elif isinstance(msg, Shutdown):
                    self.done.set()
            while held and not self.hold_stats.is_set():
                outbox.send(encode(WorkerStats(8, 8, 4, 4, len(running), 0)))
                held -= 1
            while not self.raw.empty():
                outbox.send(self.raw.get())
            frames = one_token_each(running, VOCAB)
            if frames:
                outbox.send(encode(StepFrames(frames)))
            time.sleep(self.tick_s)
        inbox.close(0)
        outbox.close(0)
        ctx.term()


class InProcessServer:
    """build_app + WorkerClient on an event loop in a thread, serving on a free port with the
    production runner and connection guards (engine/api/connections.py). `settings`: engine
    settings in place of the defaults (the guards' timeouts and cap)."""

    def __init__(self, **settings):
        self.ipc = tempfile.mkdtemp(prefix="faults-")
        self.config = EngineConfig(**settings)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.api = Api(self.port)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> InProcessServer:
        self.thread.start()
        self.client, self.runner = self.run(self._start())
        self.worker = FakeWorker(self.ipc)
        self.worker.start()
        self.run(self._ready())
        return self

    def run(self, coro, timeout: float = 10):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn, *args) -> None:
        """Run fn(*args) on the server's loop, as the server itself would."""

        async def call():
            fn(*args)

        self.run(call())

    async def _start(self):
        config = self.config
        client = WorkerClient(self.ipc, config.stall_timeout_s)
        client.start()
        app = build_app(client, "fake", 1 << 20, config.body_timeout_s)
        runner = connections.runner(app, config.idle_timeout_s, 0.25)
        await runner.setup()
        self.listener = await connections.listen(runner, self.sock, config.max_connections)
        return client, runner

    async def _stop(self) -> None:
        self.listener.close()
        await self.runner.cleanup()

    async def _ready(self) -> None:
        ready = await asyncio.wait_for(self.client.ready, 10)
        on_ready(self.runner.app, ready.vocab_size, ready.max_model_len, ByteTokenizer())

    def __exit__(self, *exc) -> None:
        self.run(self._stop())
        self.worker.done.set()
        self.worker.join(5)
        self.call(self.client.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()
        shutil.rmtree(self.ipc, ignore_errors=True)


@pytest.fixture
def server():
    with InProcessServer() as server:
        yield server


class Stream:
    """A streaming completion read line by line from a raw socket, bounded in time."""

    def __init__(self, port: int, **body):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=STREAM_TIMEOUT_S)
        payload = json.dumps(dict(body, stream=True)).encode()
        self.sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(payload) + payload
        )
        self.file = self.sock.makefile("rb")
        status = self.file.readline()
        assert b" 200 " in status, status
        self.events: list[str] = []
        self.next_event()  # the first token: the request is running

    def next_event(self) -> str | None:
        for line in self.file:
            if line.startswith(b"data: "):
                self.events.append(line[6:].strip().decode())
                return self.events[-1]
        return None

    def rest(self) -> list[str]:
        """Every event up to the end of the response (it must end: the socket times out)."""
        while self.next_event() not in (None, "[DONE]"):
            pass
        self.sock.close()
        return self.events

    def ending(self) -> tuple[dict, str]:
        """The last event before [DONE], and the last event."""
        events = self.rest()
        return json.loads(events[-2]), events[-1]


def _raw_request(port: int, head: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(head)
    return sock


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# --- 1. a stats caller that gives up; a reader that dies -----------------------------------


def test_a_stats_call_aborted_under_load_leaves_every_stream_running(server):
    """`curl -m 0.002 .../v1/engine/stats` under load: the caller is gone when the answer
    comes; the reader drops that answer and goes on routing frames (RELIABILITY 1)."""
    streams = [Stream(server.port, prompt=[1, 2], max_tokens=200) for _ in range(8)]
    server.worker.hold_stats.set()
    sock = _raw_request(server.port, b"GET /v1/engine/stats HTTP/1.1\r\nHost: engine\r\n\r\n")
    _wait_for(lambda: server.worker.stats_asked == 1, 5, "the stats request")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # a reset: the caller gives up before the answer
    time.sleep(0.3)  # the server sees the reset and cancels the caller's wait
    server.worker.hold_stats.clear()  # the answer arrives for a caller that has gone
    for stream in streams:
        final, done = stream.ending()
        assert done == "[DONE]" and final["choices"][0]["finish_reason"] == "length"
        assert final["usage"]["completion_tokens"] == 200
    status, stats = server.api.request("GET", "/v1/engine/stats", timeout=5)
    assert status == 200 and stats["total_pages"] == 8
    assert server.api.request("GET", "/health", timeout=5)[0] == 200


def test_a_message_the_reader_cannot_decode_is_dropped(server):
    stream = Stream(server.port, prompt=[1], max_tokens=50)
    server.worker.raw.put(b"\xc1 not msgpack")
    final, done = stream.ending()
    assert done == "[DONE]" and final["usage"]["completion_tokens"] == 50


def test_a_reader_that_stops_ends_every_stream_and_says_so(server, caplog):
    """Whatever stops the reader (here its socket closed under it, which cancels it quietly)
    is a lost worker: streams end with an error and /health turns 503 (RELIABILITY 1)."""
    streams = [Stream(server.port, prompt=[1], max_tokens=400) for _ in range(3)]
    server.call(server.client.from_worker.close, 0)
    for stream in streams:
        error, done = stream.ending()
        assert done == "[DONE]" and "link to the worker" in error["error"]["message"]
    status, body = server.api.request("GET", "/health", timeout=5)
    assert status == 503 and "link to the worker" in body["reason"]
    assert "the reader of worker messages stopped" in caplog.text


# --- 3. the worker lost, or the server stopping --------------------------------------------


def test_a_lost_worker_ends_every_stream_with_an_error_and_health_says_503(server):
    streams = [Stream(server.port, prompt=[1], max_tokens=400) for _ in range(4)]
    started = time.monotonic()
    server.call(server.client.fail, "the worker exited with code -9")
    for stream in streams:
        error, done = stream.ending()
        assert done == "[DONE]"
        assert error["error"] == {
            "message": "the worker exited with code -9",
            "type": "server_error",
        }
    assert time.monotonic() - started < 1
    status, body = server.api.request("GET", "/health", timeout=5)
    assert status == 503 and body["status"] == "unavailable"
    status, body = server.api.complete(prompt=[1], max_tokens=2)
    assert status == 503 and "exited" in body["error"]["message"]
    assert server.api.request("GET", "/v1/engine/stats", timeout=5)[0] == 503


def test_a_stopping_server_ends_every_stream_with_abort(server):
    streams = [Stream(server.port, prompt=[1], max_tokens=400) for _ in range(4)]
    collected: list = []
    thread = threading.Thread(
        target=lambda: collected.append(server.api.complete(prompt=[1], max_tokens=400))
    )
    thread.start()
    _wait_for(lambda: server.client.in_flight == 5, 5, "five requests in flight")
    server.call(server.client.stop)
    for stream in streams:
        final, done = stream.ending()
        assert done == "[DONE]" and final["choices"][0]["finish_reason"] == "abort"
        assert 0 < final["usage"]["completion_tokens"] < 400
    thread.join(5)
    status, body = collected[0]
    assert status == 503 and body["error"]["message"] == "the server is stopping"


# --- 4. any request body: a 4xx or a 200, never a 500 --------------------------------------

DEEP = 100_000
PATHOLOGICAL = [
    b"[" * DEEP + b"]" * DEEP,  # RecursionError in the parser
    b'{"prompt": [1], "user": ' + b"[" * 990 + b"]" * 990 + b"}",  # parses; deep under a key
    b'{"prompt": [1], "n": ' + b"[" * 990 + b"]" * 990 + b"}",  # and named in an error message
    b'{"prompt": [1], "max_tokens": ' + b"9" * 5000 + b"}",  # over Python's 4300 digits
    b'{"prompt": [1], "temperature": ' + b"9" * 400 + b"}",  # an int no float can hold
    b'{"prompt": [1], "temperature": 1e999}',  # inf
    b'{"prompt": [1], "temperature": NaN}',
    b'{"prompt": [1], "top_p": -Infinity}',
    b'{"prompt": [1], "top_p": 1e-400}',  # 0.0
    b'{"prompt": [1], "seed": -' + b"9" * 30 + b"}",
    b'{"prompt": [1], "model": ["qwen35"]}',
    b'{"prompt": [1], "model": {"a": [1]}}',
    b'{"prompt": [1e308]}',
    b'{"prompt": [1], "stream_options": [1]}',
    b'{"prompt": [1], "' + b"k" * 100_000 + b'": 1}',
    b'{"prompt": [1], "user": "\\ud800"}',  # a lone surrogate
    b'{"prompt": [1], "\\udfff": 1}',
    b"\xff\xfe\x00\x00garbage",  # looks like UTF-32, is not
    b'{"prompt": [1], "user": "\xe9"}',  # not UTF-8
    b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark
    b"",
    b"null",
    b'"a string"',
    b"1e999999",
    b'{"prompt": [1]} trailing',
    b'{"prompt": [1],}',
]
REFUSALS = {400, 404, 413}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
near_valid = st.fixed_dictionaries(
    {},
    optional={
        "prompt": st.lists(st.integers(-2, VOCAB + 2), max_size=6) | json_values,
        "max_tokens": st.sampled_from([-1, 0, 1, 2, 8, MAX_LEN, MAX_LEN + 1]) | json_values,
        "temperature": st.floats() | st.integers() | json_values,
        "top_p": st.floats() | json_values,
        "top_k": st.integers() | json_values,
        "seed": st.integers() | json_values,
        "logprobs": st.sampled_from([None, True, False, 0, 1]) | json_values,
        "stream": st.booleans() | json_values,
        "model": st.sampled_from(["fake", "other"]) | json_values,
        "ignore_eos": st.booleans() | json_values,
        "n": st.sampled_from([1, 2]) | json_values,
        "stop": json_values,
    },
)
bodies = st.one_of(
    near_valid.map(lambda body: json.dumps(body).encode()),  # NaN and Infinity included
    json_values.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=64),
    st.sampled_from(PATHOLOGICAL),
)


def _post(port: int, raw: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", "/v1/completions", body=raw)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.fixture(scope="module")
def shared_server():
    with InProcessServer() as server:
        yield server


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=bodies)
def test_any_request_body_gets_a_refusal_or_a_completion(shared_server, raw):
    """Fuzzed and pathological bodies: 200 or a 4xx with a JSON error, never a 500
    (RELIABILITY 4)."""
    status, body = _post(shared_server.port, raw)
    assert status == 200 or status in REFUSALS, (status, body[:300])
    if status != 200:
        error = json.loads(body)["error"]
        assert error["message"] and len(error["message"]) < 1000


# --- 5. IPC directories --------------------------------------------------------------------


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_ipc_directories_are_reclaimed_and_live_ones_kept(tmp_path):
    def made(name: str, owner: str | None) -> Path:
        path = tmp_path / f"{ipc_dirs.PREFIX}{name}"
        path.mkdir()
        (path / "from_worker").write_text("")
        if owner is not None:
            (path / ipc_dirs.OWNER_FILE).write_text(owner)
        return path

    me = f"{os.getpid()} {ipc_dirs._start_time(os.getpid())}"
    alive = made("alive", me)
    dead = made("dead", f"{_dead_pid()} 12345")
    reused = made("reused", f"{os.getpid()} 1")  # our pid, another process's start time
    no_owner = made("no-owner", None)
    half_written = made("half-written", "")
    other = tmp_path / "not-ours"
    other.mkdir()
    removed = ipc_dirs.reclaim_stale(str(tmp_path))
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert alive.exists() and no_owner.exists() and half_written.exists() and other.exists()


# --- 15. a stalled worker (INVARIANTS 72) --------------------------------------------


def test_a_stalled_worker_ends_every_stream_and_health_names_the_cause():
    """The worker falls silent (SIGSTOP's effect: no frame, no heartbeat): within
    stall_timeout_s past its longest step every open stream ends with an error event and
    [DONE], /health is 503 naming the stall, and a new request is a 503 at once (RELIABILITY
    15)."""
    with InProcessServer(stall_timeout_s=0.5) as server:
        streams = [Stream(server.port, prompt=[1], max_tokens=400) for _ in range(4)]
        server.worker.paused.set()
        paused = time.monotonic()
        for stream in streams:
            error, done = stream.ending()
            assert done == "[DONE]" and "the worker stalled" in error["error"]["message"]
        assert time.monotonic() - paused < HEARTBEAT_S + 0.5 + 1
        status, body = server.api.request("GET", "/health", timeout=5)
        assert status == 503 and "the worker stalled: nothing from it for" in body["reason"]
        asked = time.monotonic()
        status, body = server.api.complete(prompt=[1], max_tokens=2)
        assert status == 503 and "stalled" in body["error"]["message"]
        assert time.monotonic() - asked < 0.5
        assert server.client.stalled and server.client.lost.done()


def test_a_worker_whose_steps_are_long_is_not_stalled():
    """Silence shorter than stall_timeout_s plus the longest step the heartbeats report is a
    long step, not a stall: the streams run to their end."""
    with InProcessServer(stall_timeout_s=0.5) as server:
        server.worker.longest_step_s = 1.0
        time.sleep(2 * HEARTBEAT_S)  # a heartbeat carries it
        streams = [Stream(server.port, prompt=[1], max_tokens=100) for _ in range(2)]
        server.worker.paused.set()
        time.sleep(1.6)  # past a heartbeat and stall_timeout_s, within them and the longest step
        server.worker.paused.clear()
        for stream in streams:
            final, done = stream.ending()
            assert done == "[DONE]" and final["choices"][0]["finish_reason"] == "length"
        assert not server.client.stalled
        assert server.api.request("GET", "/health", timeout=5)[0] == 200


def test_an_idle_worker_with_a_heartbeat_is_not_stalled():
    with InProcessServer(stall_timeout_s=0.3) as server:
        time.sleep(1.0)  # idle: no frame at all, heartbeats only
        assert server.api.request("GET", "/health", timeout=5)[0] == 200
        assert server.api.complete(prompt=[1], max_tokens=3)[0] == 200


# --- 16. connections: idle, half-sent, too many (INVARIANTS 73) ----------------------

GUARDED = dict(idle_timeout_s=0.5, body_timeout_s=0.5, max_connections=6)


@pytest.fixture(scope="module")
def guarded():
    with InProcessServer(**GUARDED) as server:
        yield server


def _closed_within(sock: socket.socket, seconds: float) -> bytes:
    """What the server sent before it closed the connection, which it must within `seconds`."""
    sock.settimeout(seconds)
    received = b""
    started = time.monotonic()
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the connection was still open {time.monotonic() - started:.1f} s on")
    finally:
        sock.close()
    return received


@pytest.mark.parametrize(
    "sent",
    [b"", b"POST /v1/completions HTTP/1.1\r\nHost: e", b"GET /health HTTP/1.1\r\n"],
    ids=["nothing", "half-a-head", "no-blank-line"],
)
def test_a_connection_without_a_whole_head_is_closed_after_the_idle_timeout(guarded, sent):
    sock = _raw_request(guarded.port, sent)
    started = time.monotonic()
    assert _closed_within(sock, 3) == b""
    assert time.monotonic() - started >= GUARDED["idle_timeout_s"] * 0.9


def test_a_kept_alive_connection_is_closed_when_idle(guarded):
    sock = _raw_request(guarded.port, b"GET /health HTTP/1.1\r\nHost: e\r\n\r\n")
    answered = _closed_within(sock, 3)  # answered, then closed once idle
    assert answered.startswith(b"HTTP/1.1 200") and b'"ok"' in answered


def test_a_body_shorter_than_its_content_length_is_a_408(guarded):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: e\r\nContent-Length: 100\r\n\r\n"
    sock = _raw_request(guarded.port, head + b'{"prompt": [1]')
    started = time.monotonic()
    answer = _closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive whole within 0.5 s" in answer
    assert time.monotonic() - started < GUARDED["body_timeout_s"] + connections.LINGER_S + 1


def test_connections_over_the_cap_get_a_503_and_the_server_recovers(guarded):
    held = [_raw_request(guarded.port, b"") for _ in range(GUARDED["max_connections"])]
    _wait_for(lambda: len(guarded.runner.server.connections) >= len(held), 2, "the held ones")
    started = time.monotonic()
    refused = _raw_request(guarded.port, b"GET /health HTTP/1.1\r\nHost: e\r\n\r\n")
    answer = _closed_within(refused, 3)
    assert answer.startswith(b"HTTP/1.1 503") and b"too many open connections" in answer
    assert time.monotonic() - started < 1.5
    for sock in held:
        sock.close()
    _wait_for(lambda: not guarded.runner.server.connections, 3, "the held ones to go")
    assert guarded.api.complete(prompt=[1], max_tokens=2)[0] == 200


def test_accept_errors_make_one_log_line_a_burst(caplog):
    errors = connections.AcceptErrors()
    loop = asyncio.new_event_loop()
    out_of_files = OSError(24, "Too many open files")
    context = {"message": "socket.accept() out of system resource", "exception": out_of_files}
    with caplog.at_level("WARNING", logger="engine.serve"):
        for _ in range(50):
            errors(loop, context)
        errors.last -= connections.ACCEPT_BURST_S  # the burst ends; the next one starts
        errors(loop, context)
    loop.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "engine.serve"]
    assert len(lines) == 2 and all("Too many open files" in line for line in lines)
    assert "(49 more in the last burst)" in lines[1] and not any(r.exc_info for r in caplog.records)


# --- 17. bodies and fields that would get a 500 or pass unchecked (INVARIANTS 20) ----------


def _post_raw(port: int, path: str, body: bytes, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


CHAT = "/v1/chat/completions"
REFUSED_FIELDS = [
    ("/v1/completions", b'{"prompt": "a\\ud800b"}', "prompt", "lone surrogate"),
    (CHAT, b'{"messages": [{"role": "user", "content": "\\udfff"}]}', "messages", "surrogate"),
    ("/v1/completions", b'{"prompt": [1], "n": true}', "n", "n=True"),
    ("/v1/completions", b'{"prompt": [1], "echo": 0}', "echo", "echo=0"),
    ("/v1/completions", b'{"prompt": [1], "best_of": 1.0}', "best_of", "best_of=1.0"),
    ("/v1/completions", b'{"prompt": [1], "presence_penalty": false}', "presence_penalty", ""),
    (CHAT, b'{"messages": [{"role": "user", "content": "x"}], "logprobs": 0}', "logprobs", ""),
]


@pytest.mark.parametrize("path,body,param,message", REFUSED_FIELDS)
def test_fields_that_cannot_be_used_are_a_400_naming_them(
    shared_server, path, body, param, message
):
    status, reply = _post_raw(shared_server.port, path, body)
    assert status == 400 and reply["error"]["param"] == param, reply
    assert message in reply["error"]["message"]


def test_a_huge_value_is_echoed_as_a_short_prefix(shared_server):
    body = {"messages": [{"role": "r" * 100_000, "content": "x"}]}
    status, reply = _post_raw(shared_server.port, CHAT, json.dumps(body).encode())
    assert status == 400 and "messages[0].role" in reply["error"]["message"]
    assert len(reply["error"]["message"]) < 200


GOOD = json.dumps({"prompt": [1, 2], "max_tokens": 2}).encode()


@pytest.mark.parametrize(
    "encoding,body,status,text",
    [
        ("gzip", b"not gzip at all", 400, "not valid gzip"),
        ("deflate", b"\x00\x01", 400, "not valid deflate"),
        ("gzip", gzip.compress(GOOD, mtime=0)[:-6], 400, "not valid gzip"),  # truncated
        ("br", GOOD, 400, "Content-Encoding 'br' is not supported"),
        ("gzip, gzip", GOOD, 400, "is not supported"),
        ("gzip", gzip.compress(b" " * (2 << 20), mtime=0), 413, "too large once decoded"),
        ("gzip", gzip.compress(GOOD, mtime=0), 200, ""),
        ("deflate", zlib.compress(GOOD), 200, ""),
        ("identity", GOOD, 200, ""),
    ],
)
def test_a_body_is_decoded_from_its_content_encoding_or_refused(
    shared_server, caplog, encoding, body, status, text
):
    headers = {"Content-Encoding": encoding, "Content-Type": "application/json"}
    got, reply = _post_raw(shared_server.port, "/v1/completions", body, headers)
    assert got == status, reply
    if status != 200:
        assert text in reply["error"]["message"]
        assert reply["error"]["param"] == ("Content-Encoding" if status == 400 else None)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_client_that_goes_away_is_logged_at_debug(caplog):
    """The handler's write finds the connection reset (a client closing at the stream's end):
    one debug line, no error and no traceback."""

    async def reset(request):
        raise ConnectionResetError("Cannot write to closing transport")

    async def call():
        request = make_mocked_request("POST", "/v1/completions")
        return await errors_as_json(request, reset)

    with caplog.at_level("DEBUG", logger="engine.api"):
        response = asyncio.run(call())
    assert response.status == 499
    assert [r.levelname for r in caplog.records if r.name == "engine.api"] == ["DEBUG"]
    assert "went away" in caplog.records[-1].getMessage()


def test_streams_cut_by_their_clients_log_no_error(server, caplog):
    streams = [Stream(server.port, prompt=[1], max_tokens=400) for _ in range(6)]
    for stream in streams:  # a reset, as a client killed mid-stream
        stream.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        stream.sock.close()
    _wait_for(lambda: server.client.in_flight == 0, 5, "every cut request to be released")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# --- 18. configs that would hang ------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides,named",
    [
        ({"engine.state_slots": 0}, "engine.state_slots"),
        ({"engine.max_rows": 0, "engine.max_tokens_per_step": 0}, "engine.max_rows"),
        ({"engine.max_tokens_per_step": 0}, "engine.max_tokens_per_step"),
        ({"engine.kv_pages": 0}, "engine.kv_pages"),
        ({"engine.stall_timeout_s": 0}, "engine.stall_timeout_s"),
        ({"engine.idle_timeout_s": "soon"}, "engine.idle_timeout_s"),
        ({"engine.max_connections": 0}, "engine.max_connections"),
    ],
)
def test_a_config_that_would_hang_is_refused_where_it_is_made(overrides, named):
    with pytest.raises(ConfigError, match=named):
        load_scenario("qwen35", "tiny", overrides)


def test_engine_serve_refuses_a_config_that_would_hang_at_once():
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "engine", "serve", "qwen35", "--size", "tiny", "--set",
         "engine.state_slots=0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "error: engine.state_slots must be at least 1, got 0"
    assert time.monotonic() - started < 30


# --- end to end: `python -m engine serve` -------------------------------------------------


def _server(tmp: str, log: Path, **kwargs) -> ServerProcess:
    return ServerProcess("qwen35", size="tiny", env={"TMPDIR": tmp}, log_path=log, **kwargs).start()


def _worker_pid(server: ServerProcess) -> int:
    found = subprocess.run(["pgrep", "-P", str(server.proc.pid)], capture_output=True, text=True)
    pids = [int(p) for p in found.stdout.split()]
    assert len(pids) == 1, pids
    return pids[0]


def _assert_group_gone(pgid: int, timeout: float = 5) -> None:
    _wait_for(lambda: not group_members(pgid), timeout, f"process group {pgid} to end")


def _exit_code_within(server: ServerProcess, seconds: float) -> int:
    try:
        return server.proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server was still running {seconds} s after the fault")


def _log_after(log: Path, marker: str) -> list[str]:
    lines = log.read_text().splitlines()
    start = max(i for i, line in enumerate(lines) if marker in line)
    return lines[start + 1 :]


@pytest.fixture
def engine_server(short_tmp, tmp_path):
    """A healthy `python -m engine serve` (log in tmp_path/server.log, IPC under short_tmp);
    afterwards none of its processes is left."""
    server = _server(short_tmp, tmp_path / "server.log")
    try:
        server.wait_healthy(90)
        yield server
    finally:
        server.stop()
    _assert_group_gone(server.proc.pid)


def _streams(port: int, n: int, max_tokens: int = 400) -> list[Stream]:
    body = dict(max_tokens=max_tokens, ignore_eos=True)
    return [Stream(port, prompt=[i + 1] * 4, **body) for i in range(n)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_killed_worker_ends_streams_at_once_and_the_server_exits_1(engine_server, short_tmp):
    streams = _streams(engine_server.port, 4)
    os.kill(_worker_pid(engine_server), signal.SIGKILL)
    killed = time.monotonic()
    for stream in streams:
        error, done = stream.ending()
        assert done == "[DONE]" and error["error"]["type"] == "server_error"
        assert "the worker exited with code -9" in error["error"]["message"]
    assert time.monotonic() - killed < 2
    assert _exit_code_within(engine_server, 2 - (time.monotonic() - killed)) == 1
    after = _log_after(engine_server.log_path, "listening on")
    assert len(after) == 1 and "the worker exited with code -9; stopping" in after[0], after
    _assert_group_gone(engine_server.proc.pid)
    assert not list(Path(short_tmp).glob("engine-ipc-*"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stopped_worker_is_declared_stalled_killed_and_the_server_exits_1(short_tmp, tmp_path):
    """The issue's reproduction: SIGSTOP of the worker under streams. With stall_timeout_s 1:
    every stream ends with the error event within ~2 s, /health says why until the port
    closes, the worker is killed (a stopped one reads no Shutdown), exit 1, nothing left
    (RELIABILITY 15)."""
    server = _server(short_tmp, tmp_path / "server.log", overrides="engine.stall_timeout_s=1")
    try:
        server.wait_healthy(90)
        streams = _streams(server.port, 4)
        os.kill(_worker_pid(server), signal.SIGSTOP)
        stopped = time.monotonic()
        for stream in streams:
            error, done = stream.ending()
            assert done == "[DONE]" and "the worker stalled" in error["error"]["message"]
        assert time.monotonic() - stopped < 1 + HEARTBEAT_S + 1.5
        assert _exit_code_within(server, 3) == 1
        after = _log_after(server.log_path, "listening on")
        assert len(after) == 1 and "the worker stalled: nothing from it for" in after[0], after
    finally:
        server.stop()
    _assert_group_gone(server.proc.pid)
    assert not list(Path(short_tmp).glob("engine-ipc-*"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sigterm_with_streams_open_aborts_them_and_exits_0_within_2s(engine_server, short_tmp):
    streams = _streams(engine_server.port, 3)
    os.killpg(engine_server.proc.pid, signal.SIGTERM)  # as the harness stops a server
    stopped = time.monotonic()
    for stream in streams:
        final, done = stream.ending()
        assert done == "[DONE]" and final["choices"][0]["finish_reason"] == "abort"
    assert _exit_code_within(engine_server, 2) == 0
    assert time.monotonic() - stopped < 2
    _assert_group_gone(engine_server.proc.pid)
    assert not list(Path(short_tmp).glob("engine-ipc-*"))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_stats_call_aborted_while_the_worker_stalls_wedges_nothing(engine_server):
    """The issue's reproduction, made certain: the worker is stopped (SIGSTOP) while the stats
    caller gives up, so the answer comes after the caller has gone (RELIABILITY 1)."""
    api = Api(engine_server.port)
    streams = _streams(engine_server.port, 8, max_tokens=60)
    worker = _worker_pid(engine_server)
    os.kill(worker, signal.SIGSTOP)
    try:
        sock = _raw_request(engine_server.port, b"GET /v1/engine/stats HTTP/1.1\r\nHost: e\r\n\r\n")
        time.sleep(0.2)
        sock.close()
        time.sleep(0.3)
    finally:
        os.kill(worker, signal.SIGCONT)
    for stream in streams:
        final, done = stream.ending()
        assert done == "[DONE]" and final["usage"]["completion_tokens"] == 60
    status, stats = api.request("GET", "/v1/engine/stats", timeout=5)
    assert status == 200 and stats["running"] == 0
    assert api.request("GET", "/health", timeout=5)[0] == 200


@pytest.mark.slow
def test_tiny_temperature_and_top_p_sample_safely_end_to_end(tiny_server):
    """Values the validation admits that could crash the worker unguarded (RELIABILITY 2)."""
    prompt = [3, 1, 4, 1, 5]
    status, greedy = tiny_server.complete(
        prompt=prompt, max_tokens=6, temperature=0, ignore_eos=True
    )
    assert status == 200
    for sampling in (
        dict(temperature=1e-40),
        dict(temperature=5e-324, seed=3),
        dict(top_p=1e-300),
        dict(top_p=5e-324, temperature=2.0, seed=1),
    ):
        status, body = tiny_server.complete(
            prompt=prompt, max_tokens=6, ignore_eos=True, **sampling
        )
        assert status == 200, (sampling, body)
        assert body["choices"][0]["token_ids"] == greedy["choices"][0]["token_ids"], sampling
    status, body = tiny_server.complete(prompt=prompt, max_tokens=6, temperature=1e300, top_k=5)
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 6


@pytest.mark.slow
@pytest.mark.parametrize("raw", PATHOLOGICAL, ids=[str(i) for i in range(len(PATHOLOGICAL))])
def test_pathological_bodies_are_refused_end_to_end(tiny_server, raw):
    status, body = tiny_server.request("POST", "/v1/completions", raw, timeout=30)
    assert status == 200 or status in REFUSALS, (status, body)
    ok, good = tiny_server.complete(prompt=[1, 2], max_tokens=2)
    assert ok == 200 and len(good["choices"][0]["token_ids"]) == 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_ipc_directories_of_killed_servers_are_removed(short_tmp, tmp_path):
    """SIGKILL of the whole group leaves the directory; the next server reclaims it. SIGKILL of
    the API server alone: its worker removes it on the way out (RELIABILITY 5)."""
    first = _server(short_tmp, tmp_path / "first.log")
    try:
        first.wait_healthy(90)
        (left,) = Path(short_tmp).glob("engine-ipc-*")
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(5)
        _assert_group_gone(first.proc.pid)
        assert left.exists()
    finally:
        first.stop()
    second = _server(short_tmp, tmp_path / "second.log")
    try:
        second.wait_healthy(90)
        assert not left.exists()
        (own,) = Path(short_tmp).glob("engine-ipc-*")
        second.proc.send_signal(signal.SIGKILL)
        second.proc.wait(5)
        _wait_for(lambda: not own.exists(), 10, "the orphaned worker to remove the directory")
        _assert_group_gone(second.proc.pid)
    finally:
        second.stop()

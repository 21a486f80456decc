"""The engine end to end over HTTP: outputs, bad input, abort, and the pool returning full."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import torch

from engine.models import build_model
from harness.measure.server import free_port, port_in_use

pytestmark = pytest.mark.slow

VOCAB = 4096


@pytest.fixture(scope="module")
def reference_model():
    return build_model("qwen35", "tiny", 0, "float32", "cpu")


def greedy_reference(model, prompt: list[int], n: int) -> list[int]:
    tokens = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            logits = model.forward_full(torch.tensor(tokens))
            tokens.append(int(logits[-1].argmax()))
    return tokens[len(prompt) :]


def test_greedy_batch_equals_full_forward(tiny_server, reference_model):
    """Prompts of different lengths arriving at different times, batched by the engine, give
    token for token what a plain full-sequence forward gives (INVARIANTS 6)."""
    prompts = [
        [(i * 37 + j * 11) % VOCAB for j in range(n)]
        for i, n in enumerate([3, 17, 40, 9, 64, 1, 25, 33])
    ]
    results: dict[int, list[int]] = {}

    def run(i):
        time.sleep(0.03 * i)
        status, body = tiny_server.complete(
            prompt=prompts[i], max_tokens=12, temperature=0, ignore_eos=True
        )
        assert status == 200, body
        results[i] = body["choices"][0]["token_ids"]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, prompt in enumerate(prompts):
        assert results[i] == greedy_reference(reference_model, prompt, 12), f"prompt {i}"


@pytest.mark.parametrize(
    "sampling", [dict(temperature=0), dict(temperature=0.9, top_p=0.9, top_k=50, seed=7)]
)
def test_tokens_do_not_depend_on_the_batch(tiny_server, sampling):
    prompt = [5, 6, 7, 8, 9, 10]
    alone = tiny_server.complete(prompt=prompt, max_tokens=10, ignore_eos=True, **sampling)[1]
    results = []

    def noise(i):
        tiny_server.complete(
            prompt=[i + 1] * (5 + 3 * i), max_tokens=15, ignore_eos=True, temperature=1.0
        )

    threads = [threading.Thread(target=noise, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    results.append(
        tiny_server.complete(prompt=prompt, max_tokens=10, ignore_eos=True, **sampling)[1]
    )
    for t in threads:
        t.join()
    assert results[0]["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]


def test_ignore_eos_gives_exactly_max_tokens_streamed(tiny_server):
    events = tiny_server.stream(prompt=[1, 2, 3], max_tokens=23, ignore_eos=True, logprobs=True)
    tokens = [t for e in events for t in e["choices"][0]["token_ids"]]
    assert len(tokens) == 23
    assert all(len(e["choices"][0]["token_ids"]) == 1 for e in events[:-1])
    assert all(e["choices"][0]["logprobs"]["token_logprobs"][0] <= 0 for e in events[:-1])
    final = events[-1]
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 23, "total_tokens": 26}


def test_max_tokens_one_stops_at_prefill(tiny_server):
    status, body = tiny_server.complete(prompt=[4, 5], max_tokens=1)
    assert status == 200 and len(body["choices"][0]["token_ids"]) == 1
    assert body["choices"][0]["finish_reason"] == "length"


BAD = [
    (400, b'{"prompt": [1, 2, 3], "max_tokens": 4', None),  # malformed JSON
    (400, {"prompt": [1, "x"]}, "prompt"),
    (400, {"prompt": [1, 2.5]}, "prompt"),
    (400, {"prompt": [1, VOCAB]}, "prompt"),
    (400, {"prompt": [-1]}, "prompt"),
    (400, {"prompt": []}, "prompt"),
    (400, {"prompt": ""}, "prompt"),
    (400, {"prompt": ["two", "prompts"]}, "prompt"),
    (400, {"max_tokens": 4}, "prompt"),
    (400, {"prompt": [1] * 1000, "max_tokens": 100}, "max_tokens"),
    (400, {"prompt": [1], "max_tokens": 0}, "max_tokens"),
    (400, {"prompt": [1], "max_tokens": 2.0}, "max_tokens"),
    (400, {"prompt": [1], "max_tokens": True}, "max_tokens"),
    (400, {"prompt": [1], "temperature": -0.1}, "temperature"),
    (400, {"prompt": [1], "top_p": 0}, "top_p"),
    (400, {"prompt": [1], "top_p": 1.5}, "top_p"),
    (400, {"prompt": [1], "top_k": 2**31}, "top_k"),
    (400, {"prompt": [1], "seed": 2**63}, "seed"),
    (400, {"prompt": [1], "n": 2}, "n"),
    (400, {"prompt": [1], "best_of": 3}, "best_of"),
    (400, {"prompt": [1], "stop": ["\n"]}, "stop"),
    (400, {"prompt": [1], "response_format": {"type": "json_object"}}, "response_format"),
    (400, {"prompt": [1], "logprobs": 5}, "logprobs"),
    (400, {"prompt": [1], "frobnicate": 1}, "frobnicate"),
    (400, [1, 2, 3], None),
    (404, {"prompt": [1], "model": "gpt-4"}, "model"),
    (413, b'{"prompt": [' + b"1, " * 1_000_000 + b"1]}", None),
]


@pytest.mark.parametrize("status,body,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_refused_and_the_server_keeps_serving(tiny_server, status, body, param):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    got, err = tiny_server.request("POST", "/v1/completions", raw)
    assert got == status, err
    if err is not None:
        assert err["error"]["message"]
        assert err["error"]["param"] == param
    ok, good = tiny_server.complete(prompt=[1, 2], max_tokens=2)
    assert ok == 200 and len(good["choices"][0]["token_ids"]) == 2


def test_disconnect_mid_stream_aborts_and_frees_the_pool(tiny_server):
    before = tiny_server.wait_idle()
    conn = http.client.HTTPConnection("127.0.0.1", tiny_server.port, timeout=30)
    body = {"prompt": list(range(1, 50)), "max_tokens": 900, "ignore_eos": True, "stream": True}
    conn.request("POST", "/v1/completions", body=json.dumps(body).encode())
    resp = conn.getresponse()
    assert resp.status == 200
    for _ in range(3):  # a few token events arrive, then the client goes away
        assert resp.readline().startswith(b"data: ")
        resp.readline()
    during = tiny_server.stats()
    assert during["running"] == 1 and during["free_pages"] < during["total_pages"]
    conn.sock.close()
    conn.close()
    after = tiny_server.wait_idle()
    assert after["running"] == 0
    assert after["free_pages"] == after["total_pages"] == before["total_pages"]
    assert after["free_slots"] == after["total_slots"]


def test_finish_frees_every_page_and_slot_under_admission_pressure(tiny_server):
    """More requests than rows: the rest wait for admission; all finish; the pool is full."""
    done = []

    def run(i):
        status, body = tiny_server.complete(
            prompt=[i + 1] * (10 + i), max_tokens=20 + i, ignore_eos=True
        )
        done.append((status, len(body["choices"][0]["token_ids"]), 20 + i))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s == 200 and n == want for s, n, want in done) and len(done) == 40
    stats = tiny_server.wait_idle()
    assert stats["free_pages"] == stats["total_pages"]
    assert stats["free_slots"] == stats["total_slots"]
    assert stats["max_in_flight"] >= 16  # requests waited beyond the 16 running rows


def test_forced_eos_ends_with_stop(reference_model):
    """Without ignore_eos, an EOS token ends the reply with finish_reason 'stop' (the EOS
    here is the token greedy decoding reaches at position 3)."""
    prompt = [11, 12, 13, 14]
    expect = greedy_reference(reference_model, prompt, 8)
    eos = expect[3]
    from harness.measure.server import ServerProcess

    with ServerProcess("qwen35", size="tiny", overrides=f"model.eos_token_ids=[{eos}]") as server:
        from tests.conftest import Api

        api = Api(server.port)
        stop_at = expect.index(eos)
        status, body = api.complete(prompt=prompt, max_tokens=8, temperature=0)
        assert body["choices"][0]["token_ids"] == expect[: stop_at + 1]
        assert body["choices"][0]["finish_reason"] == "stop"
        status, body = api.complete(prompt=prompt, max_tokens=8, temperature=0, ignore_eos=True)
        assert body["choices"][0]["token_ids"] == expect
        assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.fresh_worker  # finds the worker as the API server's child
def test_sigterm_stops_both_processes_and_frees_the_port():
    port = free_port()
    tmp = Path(tempfile.mkdtemp(prefix="ts-"))  # its own: other servers come and go in /tmp
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine", "serve", "qwen35", "--size", "tiny", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(tmp)},
    )
    from tests.conftest import Api

    api = Api(port)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if api.request("GET", "/health", timeout=2)[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
    worker_pids = [int(p) for p in children.stdout.split()]
    assert worker_pids, "no worker process"
    assert len(list(tmp.glob("engine-ipc-*"))) == 1
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    for pid in worker_pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not port_in_use(port)
    assert not list(tmp.glob("engine-ipc-*"))
    shutil.rmtree(tmp)


def test_port_in_use_is_one_line_error():
    port = free_port()
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "engine",
                "serve",
                "qwen35",
                "--size",
                "tiny",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 2
    assert "cannot listen" in proc.stderr and "Traceback" not in proc.stderr

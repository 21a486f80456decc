"""POST /v1/audio/speech end to end on the tiny Orpheus: raw 24 kHz PCM streamed as the codec
decodes it, exactly its windows' samples; bad input a 4xx naming the field (INVARIANTS 10);
a client that goes away mid-stream frees both nodes' state (INVARIANTS 7)."""

from __future__ import annotations

import http.client
import json
import time

import pytest

from engine.models.orpheus import SAMPLES_PER_FRAME, windows_for
from harness.measure.server import ServerProcess
from tests.conftest import Api

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def orpheus():
    server = ServerProcess("orpheus", size="tiny", overrides="engine.max_rows=8")
    with server:
        yield Api(server.port)


def speak(api: Api, body) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=120)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    try:
        conn.request("POST", "/v1/audio/speech", body=raw)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def test_speech_streams_the_pcm_of_its_windows(orpheus):
    for body, tokens in (
        ({"input": "Hello there.", "max_tokens": 42, "ignore_eos": True}, 42),
        ({"input": [72, 105, 33], "voice": "leo", "max_tokens": 27, "ignore_eos": True}, 27),
        ({"input": "Hi", "max_tokens": 36, "ignore_eos": True, "temperature": 0.8, "seed": 3}, 36),
    ):
        status, headers, pcm = speak(orpheus, body)
        assert status == 200, pcm[:300]
        assert headers["Content-Type"] == "audio/pcm" and headers["X-Sample-Rate"] == "24000"
        assert headers["Transfer-Encoding"] == "chunked"
        assert len(pcm) == 2 * SAMPLES_PER_FRAME * windows_for(tokens)
    greedy = {"input": "Again.", "max_tokens": 35, "ignore_eos": True, "temperature": 0}
    assert speak(orpheus, greedy)[2] == speak(orpheus, greedy)[2]  # alone, twice: the same


BAD = [
    (400, b'{"input": "hi"', None),  # malformed JSON
    (400, {"voice": "tara"}, "input"),
    (400, {"input": ""}, "input"),
    (400, {"input": []}, "input"),
    (400, {"input": [1, 2.5]}, "input"),
    (400, {"input": [1, 156_940]}, "input"),
    (400, {"input": 7}, "input"),
    (400, {"input": "hi", "voice": "alloy"}, "voice"),
    (400, {"input": "hi", "response_format": "mp3"}, "response_format"),
    (400, {"input": "hi", "speed": 1.5}, "speed"),
    (400, {"input": "hi", "stream_format": "sse"}, "stream_format"),
    (400, {"input": "hi", "instructions": "whisper"}, "instructions"),
    (400, {"input": "hi", "max_tokens": 0}, "max_tokens"),
    (400, {"input": "hi", "max_tokens": 100_000}, "max_tokens"),
    (400, {"input": "hi", "temperature": -1}, "temperature"),
    (400, {"input": "hi", "top_p": 0}, "top_p"),
    (400, {"input": "hi", "frobnicate": 1}, "frobnicate"),
    (400, ["hi"], None),
    (404, {"input": "hi", "model": "tts-1"}, "model"),
]


@pytest.mark.parametrize("status,body,param", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_speech_input_is_refused_and_the_server_keeps_serving(orpheus, status, body, param):
    got, _, raw = speak(orpheus, body)
    assert got == status, raw
    error = json.loads(raw)["error"]
    assert error["message"] and error["param"] == param
    ok, _, pcm = speak(orpheus, {"input": "ok", "max_tokens": 28, "ignore_eos": True})
    assert ok == 200 and len(pcm) == 2 * SAMPLES_PER_FRAME


def test_each_endpoint_is_served_by_the_model_it_fits(orpheus, tiny_server):
    status, body = orpheus.complete(prompt=[1, 2], max_tokens=2)
    assert status == 404 and "/v1/audio/speech" in body["error"]["message"]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    status, body = orpheus.request("POST", "/v1/chat/completions", json.dumps(chat).encode())
    assert status == 404 and "/v1/audio/speech" in body["error"]["message"]
    status, _, raw = speak(tiny_server, {"input": "hi"})
    assert status == 404 and "does not speak" in json.loads(raw)["error"]["message"]


def test_a_client_gone_mid_stream_frees_both_nodes(orpheus):
    conn = http.client.HTTPConnection("127.0.0.1", orpheus.port, timeout=60)
    body = {"input": "A long one.", "max_tokens": 400, "ignore_eos": True}
    conn.request("POST", "/v1/audio/speech", body=json.dumps(body).encode())
    resp = conn.getresponse()
    assert resp.status == 200 and len(resp.read(4096)) == 4096  # the first window is out
    busy = orpheus.stats()
    assert busy["running"] == 1 and busy["streaming"] == 1
    conn.close()
    deadline = time.monotonic() + 30
    while (stats := orpheus.stats())["streaming"] or stats["running"] or stats["waiting"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.05)
    assert stats["free_pages"] == stats["total_pages"]
    assert stats["free_slots"] == stats["total_slots"]


def test_speech_text_goes_through_the_servers_tokenizer(tmp_path):
    """A text input is tokenized as a prompt is (the scenario's tokenizer.json when it names
    one), wrapped in Orpheus's prompt; token-id input follows the voice's tokens."""
    from engine.api.speech import validate_speech
    from engine.api.validate import Limits
    from engine.models.orpheus import SPEECH
    from engine.tokenizer import load_tokenizer
    from tests.word_tokenizer import word_tokenizer

    tokenizer = load_tokenizer(str(word_tokenizer(tmp_path, 64)), None)
    limits = Limits(156_940, 512, "orpheus", tokenizer)
    text = validate_speech({"input": "w3 w5", "max_tokens": 28}, limits, SPEECH)
    assert text.prompt == SPEECH.prefix + [0, 3, 5] + SPEECH.suffix  # "tara:" is [UNK]
    assert text.max_tokens == 28 and text.stream is False and not text.logprobs
    ids = validate_speech({"input": [9, 8], "voice": "leo"}, limits, SPEECH)
    assert ids.prompt == SPEECH.prefix + [0, 9, 8] + SPEECH.suffix
    assert ids.max_tokens == 512 - len(ids.prompt)  # the default: what the window leaves

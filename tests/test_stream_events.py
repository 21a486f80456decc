"""A streamed reply's events (engine/api/completions.py): every frame queued behind the next one
goes out in one write, an SSE event a frame, in order; the reply's last frame adds its final
event and [DONE] to the same write. The protocol a client reads is the one it read when each
frame had a write of its own (tests/test_text_api.py and the interop tests hold it end to end)."""

from __future__ import annotations

import asyncio
import json
import time

from engine.api.completions import DONE, StreamEvents, drained
from engine.api.metrics import EngineMetrics
from engine.api.replies import Reply
from engine.api.validate import Limits, validate_completion
from engine.messages import TokenFrame
from engine.tokenizer import WordTokenizer

TOKENIZER = WordTokenizer(300)


def _events(data: bytes) -> list:
    """The SSE events in `data`, parsed (DONE as the string)."""
    out = []
    for block in data.split(b"\n\n"):
        if block:
            assert block.startswith(b"data: "), block
            body = block[len(b"data: ") :]
            out.append("[DONE]" if body == b"[DONE]" else json.loads(body))
    return out


def _stream(chat: bool = False) -> tuple[StreamEvents, EngineMetrics]:
    limits = Limits(vocab_size=300, max_model_len=256, model="m", tokenizer=TOKENIZER)
    params = validate_completion({"prompt": "w1 w2 w3", "max_tokens": 8, "stream": True}, limits)
    metrics = EngineMetrics("m")
    tally = metrics.request(len(params.prompt), time.perf_counter())
    return StreamEvents(params, Reply.of(7, "m", chat), TOKENIZER, tally), metrics


def test_every_queued_frame_comes_with_the_next_and_nothing_waits_for_more():
    async def run():
        queue: asyncio.Queue = asyncio.Queue()
        for tokens in ([5], [6], [7]):
            queue.put_nowait(TokenFrame(7, tokens))
        first = await drained(queue)
        later = asyncio.get_running_loop().call_later(0.01, queue.put_nowait, TokenFrame(7, [8]))
        second = await drained(queue)  # the queue was empty: the next frame alone
        later.cancel()
        return first, second, queue.empty()

    first, second, empty = asyncio.run(run())
    assert [f.tokens for f in first] == [[5], [6], [7]]
    assert [f.tokens for f in second] == [[8]] and empty


def test_frames_written_together_are_an_event_each_in_order_then_usage_and_done():
    events, metrics = _stream()
    data, ended = events.of([TokenFrame(7, [5]), TokenFrame(7, [6, 9])])
    assert not ended
    got = _events(data)
    assert [e["choices"][0]["token_ids"] for e in got] == [[5], [6, 9]]
    assert [e["choices"][0]["text"] for e in got] == ["w5", " w6 w9"]
    data, ended = events.of([TokenFrame(7, [4]), TokenFrame(7, [], finish_reason="length")])
    assert ended
    *tokens, final, done = _events(data)
    assert [e["choices"][0]["token_ids"] for e in tokens] == [[4]] and done == "[DONE]"
    assert final["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert final["choices"][0]["finish_reason"] == "length"
    # frames are counted as the worker client reads them (test_metrics_endpoint), not again here
    assert metrics.generation_tokens == 0


def test_only_the_first_chat_event_names_the_role_and_an_error_ends_with_done():
    events, _ = _stream(chat=True)
    data, _ = events.of([TokenFrame(7, [5]), TokenFrame(7, [6])])
    deltas = [e["choices"][0]["delta"] for e in _events(data)]
    assert deltas == [{"role": "assistant", "content": "w5"}, {"content": " w6"}]
    data, ended = events.of([TokenFrame(7, [], finish_reason="error", error="worker died")])
    assert ended and data.endswith(DONE)
    (error, done) = _events(data)
    assert error["error"]["message"] == "worker died" and done == "[DONE]"

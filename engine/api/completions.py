"""POST /v1/completions and /v1/chat/completions: a text request validated (validate.py), sent
to the worker, and its reply's tokens decoded to text as they arrive (engine/tokenizer.py):
streamed as SSE events, or collected into one body, each shaped as the endpoint's replies
are (replies.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter

import msgspec
from aiohttp import web

from engine.api.intake import CLIENT, METRICS, STATE, _json_body, _limits, _submit
from engine.api.metrics import RequestTally
from engine.api.replies import Reply, usage
from engine.api.validate import (
    ApiError,
    CompletionParams,
    Limits,
    validate_chat,
    validate_completion,
)
from engine.tokenizer import Tokenizer

_json = msgspec.json.Encoder()


async def completions(request: web.Request) -> web.StreamResponse:
    return await _reply(request, validate_completion, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _reply(request, validate_chat, chat=True)


async def _reply(
    request: web.Request, validate: Callable[[object, Limits], CompletionParams], chat: bool
) -> web.StreamResponse:
    arrival = perf_counter()
    client, state = request.app[CLIENT], request.app[STATE]
    limits = _limits(state)
    if state["speech"] is not None:
        raise ApiError(404, f"{state['model']} speaks: its output is audio (/v1/audio/speech)")
    params = validate(await _json_body(request), limits)
    tally = request.app[METRICS].request(len(params.prompt), arrival)
    rid, queue = _submit(client, state, params, tally.frame)
    reply = Reply.of(rid, state["model"], chat)
    done = False
    try:
        if params.stream:
            response = await _stream(request, queue, params, reply, limits.tokenizer, tally)
        else:
            response = await _collect(client, queue, params, reply, limits.tokenizer, tally)
        done = True
        return response
    finally:
        tally.finish("abort")  # cut short (a reply that ended was counted by its reason)
        client.release(rid, abort=not done)


def _logprobs(tokens: list[int], values: list[float] | None, tokenizer: Tokenizer) -> dict | None:
    if values is None:
        return None
    return {"tokens": [tokenizer.decode([t]) for t in tokens], "token_logprobs": values}


def _data(event: dict) -> bytes:
    return b"data: " + _json.encode(event) + b"\n\n"


async def _stream(
    request,
    queue,
    params: CompletionParams,
    reply: Reply,
    tokenizer: Tokenizer,
    tally: RequestTally,
):
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    events = StreamEvents(params, reply, tokenizer, tally)
    while True:
        data, ended = events.of(await drained(queue))
        if data:  # a frame may carry no tokens
            await response.write(data)
        if ended:
            await response.write_eof()
            return response


async def drained(queue: asyncio.Queue) -> list:
    """The next frame, and every frame queued behind it.

    Why: under load a reply's frames queue while the event loop serves the other replies; one
    write (one send) for all of them costs what one frame's did, where a write each made the
    API server the limit past its ceiling (benchmarks/bench_api.py; docs/BENCHMARKS.md). A
    reply that keeps up gets each frame as it comes: one frame, one write."""
    frames = [await queue.get()]
    while not queue.empty():
        frames.append(queue.get_nowait())
    return frames


class StreamEvents:
    """A streamed reply's SSE events, an event a frame: the tokens' text, then the final event
    (usage, or the error) and `[DONE]`."""

    def __init__(
        self, params: CompletionParams, reply: Reply, tokenizer: Tokenizer, tally: RequestTally
    ):
        self.params, self.reply, self.tokenizer, self.tally = params, reply, tokenizer, tally
        self.text = tokenizer.stream()
        self.produced = 0

    def of(self, frames: list) -> tuple[bytes, bool]:
        """The bytes of `frames`' events, and whether the reply ended with them (its last frame
        carries a finish reason; none follows it)."""
        events = []
        for frame in frames:
            if frame.tokens:
                piece = "".join(self.text.step(t) for t in frame.tokens)
                logprobs = _logprobs(frame.tokens, frame.logprobs, self.tokenizer)
                first = not self.produced
                events.append(_data(self.reply.chunk(piece, frame.tokens, logprobs, first)))
                self.produced += len(frame.tokens)
            if frame.finish_reason is not None:
                events += self._end(frame)
                return b"".join(events), True
        return b"".join(events), False

    def _end(self, frame) -> list[bytes]:
        self.tally.finish(frame.finish_reason)
        if frame.finish_reason == "error":
            err = {"error": {"message": frame.error or "generation failed", "type": "server_error"}}
            return [_data(err), DONE]
        counts = usage(len(self.params.prompt), self.produced)
        return [_data(self.reply.final(frame.finish_reason, counts)), DONE]


DONE = b"data: [DONE]\n\n"


async def _collect(
    client, queue, params: CompletionParams, reply: Reply, tokenizer: Tokenizer, tally: RequestTally
):
    tokens: list[int] = []
    logprobs: list[float] = []
    while True:
        frame = await queue.get()
        tokens.extend(frame.tokens)
        logprobs.extend(frame.logprobs or [])
        if frame.finish_reason is not None:
            break
    tally.finish(frame.finish_reason)
    if frame.finish_reason in ("error", "abort"):  # abort: ended by the server, not the client
        status = 503 if client.unavailable else 500
        raise ApiError(status, frame.error or client.unavailable or "generation failed")
    shown = _logprobs(tokens, logprobs if params.logprobs else None, tokenizer)
    counts = usage(len(params.prompt), len(tokens))
    body = reply.whole(tokenizer.decode(tokens), tokens, shown, frame.finish_reason, counts)
    return web.json_response(body, dumps=lambda obj: _json.encode(obj).decode())

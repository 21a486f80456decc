"""The OpenAI-compatible HTTP API: /v1/completions and /v1/chat/completions (SSE streaming
or one body), /v1/audio/speech (raw PCM, speech.py; for a model that speaks), /health,
/v1/models, /metrics (Prometheus, metrics.py), /v1/tokenizer.json.

Every request is validated and its text tokenized before it reaches the worker
(validate.py): any body gets a 4xx or a 200, never a 500. A reply's tokens are decoded to text
as they stream (engine/tokenizer.py) and shaped as the endpoint's replies are (replies.py). A
client that goes away mid-stream aborts its request, so the worker frees its pages and slot.
When the worker is gone or the server stops, every open stream ends at once
(docs/RELIABILITY.md). A body must arrive whole within `body_timeout_s` (else 408), in
identity, gzip or deflate encoding (else 400); a client that goes away is logged at debug.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from time import perf_counter

import msgspec
import msgspec.structs
from aiohttp import web

from engine.api.body import read_body
from engine.api.metrics import CONTENT_TYPE, EngineMetrics, RequestTally
from engine.api.replies import Reply, usage
from engine.api.speech import stream_pcm, validate_speech
from engine.api.validate import (
    ApiError,
    CompletionParams,
    Limits,
    validate_chat,
    validate_completion,
)
from engine.api.worker_client import STATS_TIMEOUT_S, WorkerClient, WorkerUnavailable
from engine.messages import AddRequest, SpeechFormat
from engine.tokenizer import Tokenizer, tokenizer_config, tokenizer_json

log = logging.getLogger("engine.api")
_json = msgspec.json.Encoder()

CLIENT = web.AppKey("client", WorkerClient)
STATE = web.AppKey("state", dict)
METRICS = web.AppKey("metrics", EngineMetrics)
# A scrape waits this long for the worker's pool; past it /metrics answers without its gauges.
POOL_WAIT_S = 2.0


def _error(err: ApiError) -> web.Response:
    return web.json_response(err.body(), status=err.status)


@web.middleware
async def errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return _error(ApiError(413, f"request body too large ({exc.text})"))
    except ApiError as err:
        return _error(err)
    except WorkerUnavailable as exc:
        return _error(ApiError(503, str(exc)))
    except web.HTTPException:
        raise
    except ConnectionResetError as exc:  # the client went away: nothing to answer, no error
        log.debug("the client of %s %s went away: %s", request.method, request.path, exc)
        return web.Response(status=499)  # not sent: aiohttp finds the connection closed
    except Exception:  # a bug: log it whole, answer JSON, keep serving
        log.exception("unhandled error in %s %s", request.method, request.path)
        return _error(ApiError(500, "internal error; see the server log"))


async def health(request: web.Request) -> web.Response:
    if reason := request.app[CLIENT].unavailable:
        return web.json_response({"status": "unavailable", "reason": reason}, status=503)
    if request.app[STATE]["limits"] is None:
        return web.json_response({"status": "starting"}, status=503)
    return web.json_response({"status": "ok"})


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    card = {
        "id": state["model"],
        "object": "model",
        "owned_by": "engine",
        "max_model_len": state["max_model_len"],
    }
    return web.json_response({"object": "list", "data": [card]})


async def engine_stats(request: web.Request) -> web.Response:
    client, state = request.app[CLIENT], request.app[STATE]
    try:
        stats = msgspec.structs.asdict(await client.stats())
    except TimeoutError:
        raise ApiError(504, f"the worker did not answer within {STATS_TIMEOUT_S:g} s") from None
    stats.update(in_flight=client.in_flight, max_in_flight=state["max_in_flight"])
    return web.json_response(stats)


async def metrics_text(request: web.Request) -> web.Response:
    client = request.app[CLIENT]
    pool = None
    if request.app[STATE]["limits"] is not None and not client.unavailable:
        try:
            pool = await asyncio.wait_for(client.stats(), POOL_WAIT_S)
        except (TimeoutError, WorkerUnavailable):
            pool = None
    body = request.app[METRICS].render(pool, client.in_flight)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def tokenizer_file(request: web.Request) -> web.Response:
    """The server's tokenizer as tokenizer.json (or, at /v1/tokenizer_config.json, the
    config transformers' AutoTokenizer reads beside it): load it to count tokens as the
    server does. A 404 for the byte-level tokenizer, which has no such file."""
    tokenizer = _limits(request.app[STATE]).tokenizer
    state = request.app[STATE]
    if request.path.endswith("tokenizer_config.json"):
        text = tokenizer_config(tokenizer)
    else:
        if "tokenizer_json" not in state:  # made once: the default's vocabulary is built here
            state["tokenizer_json"] = await asyncio.to_thread(tokenizer_json, tokenizer)
        text = state["tokenizer_json"]
    if text is None:
        raise ApiError(404, f"the tokenizer {tokenizer.name} has no tokenizer.json")
    return web.Response(text=text, content_type="application/json")


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
    rid, queue = _submit(client, state, params)
    tally = request.app[METRICS].request(len(params.prompt), arrival)
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


async def speech(request: web.Request) -> web.StreamResponse:
    client, state = request.app[CLIENT], request.app[STATE]
    limits = _limits(state)
    if state["speech"] is None:
        raise ApiError(404, f"{state['model']} does not speak: it has no /v1/audio/speech")
    params = validate_speech(await _json_body(request), limits, state["speech"])
    rid, queue = _submit(client, state, params)
    done = False
    try:
        response = await stream_pcm(request, queue, state["speech"])
        done = True
        return response
    finally:
        client.release(rid, abort=not done)


def _limits(state: dict) -> Limits:
    """The request limits once the worker is ready; a 503 before."""
    if state["limits"] is None:
        raise ApiError(503, "the worker is still starting; poll /health")
    return state["limits"]


def _submit(client: WorkerClient, state: dict, params: CompletionParams):
    """Send the request to the worker: its rid and the queue its frames arrive on."""
    rid, queue = client.submit(lambda rid: _add_request(rid, params))
    state["max_in_flight"] = max(state["max_in_flight"], client.in_flight)
    return rid, queue


async def _json_body(request: web.Request) -> object:
    state = request.app[STATE]
    return _parse_json(await read_body(request, state["max_body"], state["body_timeout_s"]))


def _not_json(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _parse_json(raw: bytes) -> object:
    """A request body as JSON; anything else, however pathological, is a 400."""
    try:
        return json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an int over 4300 digits
        raise ApiError(400, f"malformed JSON body: {str(exc)[:200]}") from None


def _add_request(rid: int, p: CompletionParams) -> AddRequest:
    return AddRequest(
        rid=rid,
        prompt=p.prompt,
        max_tokens=p.max_tokens,
        ignore_eos=p.ignore_eos,
        temperature=p.temperature,
        top_p=p.top_p,
        top_k=p.top_k,
        seed=p.seed,
        logprobs=p.logprobs,
    )


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
    text = tokenizer.stream()
    produced = 0
    while True:
        frame = await queue.get()
        if frame.tokens:
            tally.frame(len(frame.tokens))
            piece = "".join(text.step(t) for t in frame.tokens)
            logprobs = _logprobs(frame.tokens, frame.logprobs, tokenizer)
            await response.write(_data(reply.chunk(piece, frame.tokens, logprobs, not produced)))
            produced += len(frame.tokens)
        if frame.finish_reason is None:
            continue
        tally.finish(frame.finish_reason)
        if frame.finish_reason == "error":
            err = {"error": {"message": frame.error or "generation failed", "type": "server_error"}}
            await response.write(_data(err))
        else:
            counts = usage(len(params.prompt), produced)
            await response.write(_data(reply.final(frame.finish_reason, counts)))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _collect(
    client, queue, params: CompletionParams, reply: Reply, tokenizer: Tokenizer, tally: RequestTally
):
    tokens: list[int] = []
    logprobs: list[float] = []
    while True:
        frame = await queue.get()
        if frame.tokens:
            tally.frame(len(frame.tokens))
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


def build_app(
    client: WorkerClient,
    model: str,
    max_body: int,
    body_timeout_s: float = 30.0,
    metrics: EngineMetrics | None = None,
) -> web.Application:
    """The API; `metrics`: the tallies /metrics renders (the worker client's steps feed them)."""
    app = web.Application(client_max_size=max_body, middlewares=[errors_as_json])
    app[CLIENT] = client
    app[METRICS] = metrics or EngineMetrics(model)
    app[STATE] = {
        "model": model, "limits": None, "speech": None, "max_model_len": 0, "max_in_flight": 0,
        "max_body": max_body, "body_timeout_s": body_timeout_s,
    }  # fmt: skip
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/engine/stats", engine_stats)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_get("/v1/tokenizer.json", tokenizer_file)
    app.router.add_get("/v1/tokenizer_config.json", tokenizer_file)
    return app


def on_ready(
    app: web.Application,
    vocab_size: int,
    max_model_len: int,
    tokenizer: Tokenizer,
    speech: SpeechFormat | None = None,
) -> None:
    state = app[STATE]
    state["limits"] = Limits(vocab_size, max_model_len, state["model"], tokenizer)
    state["max_model_len"] = max_model_len
    state["speech"] = speech

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
Here: the app, its routes and error middleware, and the small endpoints; the text endpoints
are completions.py's, what every endpoint does with a request on its way in intake.py's.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import msgspec.structs
from aiohttp import web

from engine.api.completions import chat_completions, completions
from engine.api.intake import CLIENT, METRICS, STATE, _json_body, _limits, _submit
from engine.api.metrics import CONTENT_TYPE, EngineMetrics
from engine.api.speech import stream_pcm, validate_speech
from engine.api.validate import (
    ApiError,
    Limits,
)
from engine.api.worker_client import STATS_TIMEOUT_S, WorkerClient, WorkerUnavailable
from engine.messages import SpeechFormat
from engine.tokenizer import Tokenizer, tokenizer_config, tokenizer_json

log = logging.getLogger("engine.api")

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

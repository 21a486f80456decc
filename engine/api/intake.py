"""A request's way in, the same for every endpoint: the app's keys (the worker client, the
state, the metrics), the request limits once the worker is ready (a 503 before), the body
read and parsed as JSON (anything else a 400), and the request submitted to the worker.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from aiohttp import web

from engine.api.body import read_body
from engine.api.metrics import EngineMetrics
from engine.api.validate import ApiError, CompletionParams, Limits
from engine.api.worker_client import WorkerClient
from engine.messages import AddRequest

CLIENT = web.AppKey("client", WorkerClient)
STATE = web.AppKey("state", dict)
METRICS = web.AppKey("metrics", EngineMetrics)


def _limits(state: dict) -> Limits:
    """The request limits once the worker is ready; a 503 before."""
    if state["limits"] is None:
        raise ApiError(503, "the worker is still starting; poll /health")
    return state["limits"]


def _submit(
    client: WorkerClient, state: dict, params: CompletionParams,
    on_tokens: Callable[[int], None] | None = None,
):  # fmt: skip
    """Send the request to the worker: its rid and the queue its frames arrive on;
    `on_tokens(n)` is called for each frame of n tokens as the worker's message is read
    (WorkerClient.submit)."""
    rid, queue = client.submit(lambda rid: _add_request(rid, params), on_tokens)
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

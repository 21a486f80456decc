"""Validation of request bodies: every field checked, unsupported ones refused. Here the
checks every endpoint shares and /v1/completions; /v1/audio/speech in speech.py.

A bad body raises ApiError naming the field (HTTP 400); nothing is silently dropped or
defaulted past what the OpenAI API itself defaults.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param}}


@dataclass(frozen=True)
class Limits:
    vocab_size: int
    max_model_len: int
    model: str


@dataclass(frozen=True)
class CompletionParams:
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    logprobs: bool
    stream: bool


# Fields the OpenAI API defines that this server does not implement: refused unless they
# hold the value that means "off".
_OFF_VALUES = {
    "n": (1,),
    "best_of": (1,),
    "stop": (None, [], ""),
    "stop_token_ids": (None, []),
    "echo": (False,),
    "suffix": (None,),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": (None, {}),
    "response_format": (None,),
}
_ACCEPTED = {
    "model",
    "prompt",
    "max_tokens",
    "ignore_eos",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "logprobs",
    "stream",
    "stream_options",
    "user",
}


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 60, 60, 40


def _show(value) -> str:
    """A value in an error message: cut short, whatever its size or nesting."""
    return _SHORT.repr(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (isinstance(value, int | float)) and not isinstance(value, bool)


def _int_field(body: dict, name: str, default, low: int, high: int, what: str):
    value = body.get(name, default)
    if value is None and default is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        raise ApiError(400, f"{name} must be {what}, got {_show(value)}", name)
    return value


def _float_field(body: dict, name: str, default: float, ok: Callable[[float], bool], what: str):
    """A finite number that passes `ok`; an int too large for a float is refused too."""
    value = body.get(name, default)
    if _is_number(value):
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if math.isfinite(number) and ok(number):
            return number
    raise ApiError(400, f"{name} must be {what}, got {_show(value)}", name)


def _bool_field(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {_show(value)}", name)
    return value


def token_ids(value, field: str, limits: Limits) -> list[int]:
    """A non-empty list of ids in the vocabulary (a prompt, a speech input)."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{field} must be a non-empty list of token ids", field)
    if any(isinstance(p, list) for p in value):
        raise ApiError(
            400, f"batched {field}s are not supported: send one {field} per request", field
        )
    for i, token in enumerate(value):
        if not _is_int(token):
            raise ApiError(
                400, f"{field}[{i}] must be an integer token id, got {_show(token)}", field
            )
        if not 0 <= token < limits.vocab_size:
            raise ApiError(
                400,
                f"{field}[{i}]={token} is outside the vocabulary [0, {limits.vocab_size})",
                field,
            )
    return value


def _prompt(body: dict, limits: Limits) -> list[int]:
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        raise ApiError(
            400,
            "text prompts need a tokenizer and this model ships none: send token ids",
            "prompt",
        )
    return token_ids(prompt, "prompt", limits)


def check_fields(body: object, accepted: set[str], off_values: dict[str, tuple]) -> dict:
    """The body as a dict whose every field is accepted, or one this server does not
    implement holding its "off" value."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key, value in body.items():
        if key in off_values:
            if value not in off_values[key]:
                raise ApiError(400, f"{key}={_show(value)} is not supported by this server", key)
        elif key not in accepted:
            raise ApiError(400, f"unknown or unsupported field {_show(key)}", key)
    return body


def check_model(body: dict, limits: Limits) -> None:
    model = body.get("model", limits.model)
    if not isinstance(model, str):
        raise ApiError(400, f"model must be a string, got {_show(model)}", "model")
    if model != limits.model:
        raise ApiError(
            404,
            f"model {_show(model)} is not served here; this server serves {limits.model!r}",
            "model",
        )


def max_tokens_field(body: dict, default: int, prompt_tokens: int, limits: Limits) -> int:
    """max_tokens, which with the prompt must fit the context window."""
    max_tokens = _int_field(body, "max_tokens", default, 1, INT64_MAX, "a positive integer")
    if prompt_tokens + max_tokens > limits.max_model_len:
        raise ApiError(
            400,
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the context "
            f"window of {limits.max_model_len} tokens",
            "max_tokens",
        )
    return max_tokens


@dataclass(frozen=True)
class Sampling:
    ignore_eos: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int | None


def sampling_fields(body: dict) -> Sampling:
    """ignore_eos, temperature, top_p, top_k (-1 means off, as 0) and seed."""
    return Sampling(
        ignore_eos=_bool_field(body, "ignore_eos", False),
        temperature=_float_field(
            body, "temperature", 1.0, lambda t: t >= 0, "a finite number >= 0"
        ),
        top_p=_float_field(body, "top_p", 1.0, lambda p: 0 < p <= 1, "a number in (0, 1]"),
        top_k=max(
            _int_field(body, "top_k", 0, -1, INT32_MAX, "-1, 0 (off) or a positive int32"), 0
        ),
        seed=_int_field(body, "seed", None, INT64_MIN, INT64_MAX, "an int64"),
    )


def validate_completion(body: object, limits: Limits) -> CompletionParams:
    body = check_fields(body, _ACCEPTED, _OFF_VALUES)
    check_model(body, limits)
    prompt = _prompt(body, limits)
    max_tokens = max_tokens_field(body, 16, len(prompt), limits)
    sampling = sampling_fields(body)
    logprobs = body.get("logprobs")
    if not (
        logprobs is None or isinstance(logprobs, bool) or (_is_int(logprobs) and logprobs == 0)
    ):
        raise ApiError(
            400,
            "logprobs: only the sampled token's log-prob is supported "
            "(logprobs true or 0); top alternatives are not",
            "logprobs",
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return CompletionParams(
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=sampling.ignore_eos,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=sampling.top_k,
        seed=sampling.seed,
        logprobs=logprobs is True or _is_int(logprobs),
        stream=_bool_field(body, "stream", False),
    )

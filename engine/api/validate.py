"""Validation of /v1/completions and /v1/chat/completions bodies: every field checked,
unsupported ones refused, text tokenized (a prompt, or the chat's messages through the chat
template) so the worker only ever sees token ids. The checks every endpoint shares are public:
/v1/audio/speech (speech.py) uses them too.

A bad body raises ApiError naming the field (HTTP 400); nothing is silently dropped or
defaulted past what the OpenAI API itself defaults.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.api.chat import chat_prompt
from engine.tokenizer import ByteTokenizer, Tokenizer

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
    tokenizer: Tokenizer = field(default_factory=ByteTokenizer)


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
# /v1/chat/completions: `messages` for `prompt`, `max_completion_tokens` beside `max_tokens`;
# log-probs, tools and the rest refused unless off.
_CHAT_OFF_VALUES = {
    **{k: v for k, v in _OFF_VALUES.items() if k not in ("best_of", "echo", "suffix")},
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
}
_CHAT_ACCEPTED = (_ACCEPTED - {"prompt", "logprobs"}) | {"messages", "max_completion_tokens"}


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 60, 60, 40


def show(value) -> str:
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
        raise ApiError(400, f"{name} must be {what}, got {show(value)}", name)
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
    raise ApiError(400, f"{name} must be {what}, got {show(value)}", name)


def _bool_field(body: dict, name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be true or false, got {show(value)}", name)
    return value


def _prompt(body: dict, limits: Limits) -> list[int]:
    if "prompt" not in body:
        raise ApiError(400, "prompt is required", "prompt")
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return text_tokens(prompt, limits, "prompt")
    return token_ids(prompt, limits, "prompt")


def token_ids(value, limits: Limits, name: str) -> list[int]:
    """A non-empty list of ids in the vocabulary (a prompt, a speech input)."""
    if not isinstance(value, list) or not value:
        raise ApiError(400, f"{name} must be a text or a non-empty list of token ids", name)
    if any(isinstance(p, list | str) for p in value):
        raise ApiError(400, f"batched {name}s are not supported: send one {name} per request", name)
    for i, token in enumerate(value):
        if not _is_int(token):
            raise ApiError(400, f"{name}[{i}] must be an integer token id, got {show(token)}", name)
        if not 0 <= token < limits.vocab_size:
            raise ApiError(
                400, f"{name}[{i}]={token} is outside the vocabulary [0, {limits.vocab_size})", name
            )
    return value


def text_tokens(text: str, limits: Limits, name: str) -> list[int]:
    try:
        text.encode("utf-8")  # JSON's \ud800 escapes decode to lone surrogates, no text
    except UnicodeEncodeError as exc:
        raise ApiError(
            400, f"{name} is not valid Unicode: a lone surrogate at character {exc.start}", name
        ) from None
    tokens = limits.tokenizer.encode(text)
    if not tokens:
        raise ApiError(400, f"{name} must not be empty", name)
    if max(tokens) >= limits.vocab_size:
        raise ApiError(400, f"{name} encodes to token ids outside the model's vocabulary", name)
    return tokens


def _is_off(value, off_values: tuple) -> bool:
    """One of the values that mean "off", of its type too: `n: true` is not `n: 1`, nor
    `echo: 0` `echo: false` (Python's True == 1 and 0 == False say they are)."""
    return any(value == off and type(value) is type(off) for off in off_values)


def check_fields(body: object, off: dict, accepted: set, limits: Limits) -> dict:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key, value in body.items():
        if key in off:
            if not _is_off(value, off[key]):
                raise ApiError(400, f"{key}={show(value)} is not supported by this server", key)
        elif key not in accepted:
            raise ApiError(400, f"unknown or unsupported field {show(key)}", key)
    model = body.get("model", limits.model)
    if not isinstance(model, str):
        raise ApiError(400, f"model must be a string, got {show(model)}", "model")
    if model != limits.model:
        raise ApiError(
            404,
            f"model {show(model)} is not served here; this server serves {limits.model!r}",
            "model",
        )
    return body


def request_params(
    body: dict,
    prompt: list[int],
    limits: Limits,
    max_tokens_field: str,
    logprobs: bool,
    default_max_tokens: int = 16,
) -> CompletionParams:
    """The sampling fields every endpoint shares, checked, around a tokenized prompt."""
    max_tokens = _int_field(
        body, max_tokens_field, default_max_tokens, 1, INT64_MAX, "a positive integer"
    )
    if len(prompt) + max_tokens > limits.max_model_len:
        raise ApiError(
            400,
            f"prompt ({len(prompt)} tokens) + {max_tokens_field} ({max_tokens}) exceeds the "
            f"context window of {limits.max_model_len} tokens",
            max_tokens_field,
        )
    temperature = _float_field(body, "temperature", 1.0, lambda t: t >= 0, "a finite number >= 0")
    top_p = _float_field(body, "top_p", 1.0, lambda p: 0 < p <= 1, "a number in (0, 1]")
    top_k = _int_field(body, "top_k", 0, -1, INT32_MAX, "-1, 0 (off) or a positive int32")
    seed = _int_field(body, "seed", None, INT64_MIN, INT64_MAX, "an int64")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", "stream_options")
    return CompletionParams(
        prompt=prompt,
        max_tokens=max_tokens,
        ignore_eos=_bool_field(body, "ignore_eos", False),
        temperature=temperature,
        top_p=top_p,
        top_k=max(top_k, 0),
        seed=seed,
        logprobs=logprobs,
        stream=_bool_field(body, "stream", False),
    )


def validate_completion(body: object, limits: Limits) -> CompletionParams:
    body = check_fields(body, _OFF_VALUES, _ACCEPTED, limits)
    prompt = _prompt(body, limits)
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
    return request_params(body, prompt, limits, "max_tokens", logprobs is True or _is_int(logprobs))


def validate_chat(body: object, limits: Limits) -> CompletionParams:
    body = check_fields(body, _CHAT_OFF_VALUES, _CHAT_ACCEPTED, limits)
    if "max_tokens" in body and "max_completion_tokens" in body:
        raise ApiError(
            400, "give max_completion_tokens or max_tokens, not both", "max_completion_tokens"
        )
    limit = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    try:
        text = chat_prompt(body.get("messages"))
    except ValueError as exc:
        raise ApiError(400, str(exc), "messages") from None
    return request_params(body, text_tokens(text, limits, "messages"), limits, limit, False)

"""POST /v1/audio/speech: OpenAI's text-to-speech request, answered with raw PCM as it is made.

Served when the model declares a speech format (Ready.speech, engine/messages.py). The prompt
is the format's prefix, the tokens of "<voice>: <input>", then its suffix; `input` is text
(tokenized by the server's tokenizer, engine/tokenizer.py) or token ids. The body streams
16-bit signed little-endian mono PCM at the format's rate (OpenAI's `pcm`), chunk by chunk as
the codec decodes it; its headers go with the first audio, so a request that fails
before any audio gets an error status and JSON. One that fails after has its connection cut
before the chunked body's end, which every HTTP client reports as an error.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from engine.api.validate import (
    ApiError,
    CompletionParams,
    Limits,
    check_fields,
    request_params,
    text_tokens,
    token_ids,
)
from engine.messages import SpeechFormat, TokenFrame

DEFAULT_MAX_TOKENS = 2000  # audio tokens (Orpheus's own default): about 24 s of audio
MAX_INPUT_CHARS = 4096

_OFF_VALUES = {
    "response_format": ("pcm",),
    "speed": (1, 1.0),
    "stream_format": ("audio",),
    "instructions": (None, ""),
}
_ACCEPTED = {"model", "input", "voice", "max_tokens", "ignore_eos", "temperature", "top_p"}
_ACCEPTED |= {"top_k", "seed", "user"}


def validate_speech(body: object, limits: Limits, speech: SpeechFormat) -> CompletionParams:
    """The request as the worker runs it: the speech prompt around the input's tokens, the
    audio tokens the LLM may write (max_tokens), the sampling fields; always streamed."""
    body = check_fields(body, _OFF_VALUES, _ACCEPTED, limits)
    voice = body.get("voice", speech.voices[0])
    if voice not in speech.voices:
        raise ApiError(400, f"voice must be one of {', '.join(speech.voices)}", "voice")
    if "input" not in body:
        raise ApiError(400, "input is required", "input")
    text = body["input"]
    if isinstance(text, str):
        if not text or len(text) > MAX_INPUT_CHARS:
            raise ApiError(400, f"input must be 1 to {MAX_INPUT_CHARS} characters", "input")
        words = text_tokens(f"{voice}: {text}", limits, "input")
    else:
        words = limits.tokenizer.encode(f"{voice}: ") + token_ids(text, limits, "input")
    prompt = speech.prefix + words + speech.suffix
    room = max(1, limits.max_model_len - len(prompt))
    default = min(DEFAULT_MAX_TOKENS, room)
    return request_params(body, prompt, limits, "max_tokens", False, default)


async def stream_pcm(
    request: web.Request, queue: asyncio.Queue[TokenFrame], speech: SpeechFormat
) -> web.StreamResponse:
    """Write each frame's audio as it arrives; end the body when the last frame says the
    reply is complete, cut the connection when it failed or was aborted."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "audio/pcm",
            "X-Sample-Rate": str(speech.sample_rate),
            "X-Sample-Format": "s16le",
            "X-Channels": "1",
        }
    )
    while True:
        frame = await queue.get()
        if frame.finish_reason in ("error", "abort"):
            if not response.prepared:
                raise ApiError(503, frame.error or "generation failed")
            if request.transport is not None:  # the chunked body never ends: a failure
                request.transport.close()
            return response
        if frame.audio:
            if not response.prepared:
                await response.prepare(request)
            await response.write(frame.audio)
        if frame.finish_reason is not None:
            if not response.prepared:
                await response.prepare(request)
            await response.write_eof()
            return response

"""Typed messages between the API server and the worker, encoded with msgspec msgpack.

Never pickle: a message crossing a process boundary is a tagged msgspec Struct (INVARIANTS 1).
"""

from __future__ import annotations

import msgspec


class AddRequest(msgspec.Struct, tag="add_request", array_like=True):
    rid: int
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    logprobs: bool = False


class Abort(msgspec.Struct, tag="abort", array_like=True):
    rid: int


class Shutdown(msgspec.Struct, tag="shutdown", array_like=True):
    pass


ToWorker = AddRequest | Abort | Shutdown


class TokenFrame(msgspec.Struct, array_like=True):
    """New tokens of one request from one step; `finish_reason` set on its last frame. A
    model whose graph ends in an audio codec sends its PCM instead (`audio`: 16-bit signed
    little-endian mono at the model's SpeechFormat.sample_rate) and no tokens."""

    rid: int
    tokens: list[int]
    logprobs: list[float] | None = None
    finish_reason: str | None = None  # "length" | "stop" | "abort" | "error"
    prompt_tokens: int = 0
    error: str | None = None
    audio: bytes | None = None


class StepFrames(msgspec.Struct, tag="frames", array_like=True):
    frames: list[TokenFrame]


class SpeechFormat(msgspec.Struct, array_like=True):
    """How a text-to-speech model is prompted and what it streams: its prompt is
    prefix + the tokens of "<voice>: <input>" + suffix; its PCM is at `sample_rate`."""

    sample_rate: int
    prefix: list[int]
    suffix: list[int]
    voices: list[str]


class Ready(msgspec.Struct, tag="ready", array_like=True):
    model: str
    size: str
    device: str
    parameters: int
    vocab_size: int
    max_model_len: int
    eos_token_ids: list[int]
    speech: SpeechFormat | None = None  # set when the model speaks (/v1/audio/speech)


class WorkerStats(msgspec.Struct, tag="stats", array_like=True):
    """Pages and slots free, running requests: lets tests and the harness see the pool."""

    free_pages: int
    total_pages: int
    free_slots: int
    total_slots: int
    running: int
    waiting: int
    streaming: int = 0  # requests held by a node downstream of the first (an audio codec)


class GetStats(msgspec.Struct, tag="get_stats", array_like=True):
    pass


class Heartbeat(msgspec.Struct, tag="heartbeat", array_like=True):
    """The worker's loop is alive: sent at least every HEARTBEAT_S from Ready on, idle or busy
    (engine/worker/heartbeat.py), with the longest pass of its loop so far, which the API
    server's stall watchdog allows for (engine/api/worker_client.py)."""

    longest_step_s: float


FromWorker = StepFrames | Ready | WorkerStats | Heartbeat

_to_worker_decoder = msgspec.msgpack.Decoder(ToWorker | GetStats)
_from_worker_decoder = msgspec.msgpack.Decoder(FromWorker)
_encoder = msgspec.msgpack.Encoder()

encode = _encoder.encode


def decode_to_worker(data: bytes) -> ToWorker | GetStats:
    return _to_worker_decoder.decode(data)


def decode_from_worker(data: bytes) -> FromWorker:
    return _from_worker_decoder.decode(data)

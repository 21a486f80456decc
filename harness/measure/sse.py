"""One streamed completion read as it arrives: SSE events counted into token arrival times.

Every token of a piece gets the piece's arrival time; a non-200 body is kept for the error
text. A content event (a completion's `text` or a chat chunk's `delta.content`) carries one
token, or len(token_ids) where the server lists them; the final usage.completion_tokens, when
sent, becomes output_tokens (token_times_s keeps what was streamed, so the two can be
compared), and usage.prompt_tokens the prompt's length where the client sent text. Nothing
here computes a metric.
"""

from __future__ import annotations

import time

import msgspec

from harness.analysis.schema import RequestRecord


class ReplyReader:
    """Fills one `RequestRecord` from its response: `feed` each piece, then `finish`. A
    non-200 body is kept for the error text; a 200 body is the subclass's to read (`body`,
    then `complete`): a completion's SSE stream here, a speech reply's PCM in pcm.py."""

    def __init__(self, rec: RequestRecord, t0: float):
        self.rec, self.t0, self.other = rec, t0, b""

    def feed(self, data: bytes, now: float, status: int) -> None:
        if status != 200:
            self.other = (self.other + data)[:300]
            return
        self.body(data, now - self.t0)

    def finish(self) -> None:
        rec = self.rec
        rec.end_s = time.perf_counter() - self.t0
        if rec.status != 200:
            rec.error = f"HTTP {rec.status}: {self.other.decode(errors='replace')}"[:300]
            return
        self.complete()

    def body(self, data: bytes, t: float) -> None:
        raise NotImplementedError

    def complete(self) -> None:
        raise NotImplementedError


class ResponseReader(ReplyReader):
    """A completion's SSE stream."""

    def __init__(self, rec: RequestRecord, t0: float):
        super().__init__(rec, t0)
        self.tail, self.done, self.usage = b"", False, None

    def body(self, data: bytes, t: float) -> None:
        rec = self.rec
        chunk = self.tail + data if self.tail else data
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        *events, self.tail = chunk.split(b"\n\n")
        for raw in events:
            data = sse_data(raw)
            if data is None:
                continue
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                event = _decode_event(data)
            except msgspec.DecodeError as exc:
                rec.error = rec.error or f"malformed event: {exc}"[:300]
                continue
            if event.error is not None:
                rec.error = f"stream error: {event.error}"[:300]
            if event.usage is not None:
                if event.usage.completion_tokens is not None:
                    self.usage = event.usage.completion_tokens
                if event.usage.prompt_tokens and not rec.prompt_tokens:
                    rec.prompt_tokens = event.usage.prompt_tokens
            if event.choices:
                choice = event.choices[0]
                text = choice.text or (choice.delta is not None and choice.delta.content)
                n = len(choice.token_ids) if choice.token_ids else int(bool(text))
                rec.token_times_s.extend([t] * n)
                rec.finish_reason = choice.finish_reason or rec.finish_reason

    def complete(self) -> None:
        rec = self.rec
        times = rec.token_times_s
        rec.first_token_s = times[0] if times else None
        rec.output_tokens = len(times) if self.usage is None else self.usage
        if not self.done and rec.error is None:
            rec.error = "stream ended before [DONE]"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str = ""
    delta: _Delta | None = None  # a chat chunk's
    token_ids: list[int] | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class _Event(msgspec.Struct):
    """The few fields of a completion event the client reads; the decoder skips the rest
    (a typed decode costs about 0.3 us per event, less than two byte searches)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: object = None


_decode_event = msgspec.json.Decoder(_Event).decode


def sse_data(raw: bytes) -> bytes | None:
    """The data of one SSE event (None for comments and events without data)."""
    if raw.startswith(b"data:") and b"\n" not in raw:
        return raw[5:].strip()
    lines = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None

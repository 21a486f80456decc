"""One speech reply read as it arrives: raw PCM pieces counted into arrival times and bytes.

The body is OpenAI's `pcm` (24 kHz, 16-bit, mono); how many audio seconds the bytes make is
analysis's to say (metrics.py), not the reader's. The first piece's arrival is the reply's
first output (`first_token_s`); a speech reply has no tokens. A body the server cut short
fails in the HTTP client (its chunked end is missing).
"""

from __future__ import annotations

from harness.measure.sse import ReplyReader


class PcmReader(ReplyReader):
    def body(self, data: bytes, t: float) -> None:
        self.rec.audio_times_s.append(t)
        self.rec.audio_bytes.append(len(data))

    def complete(self) -> None:
        rec = self.rec
        rec.first_token_s = rec.audio_times_s[0] if rec.audio_times_s else None

"""Orpheus as a graph of two nodes on one worker: `llm` streams audio tokens into `snac`.

- `llm`: a prefill walk, then a decode loop declaring an AR stop policy (the loop's count
  reaches max_tokens - 1, or an EOS token unless ignore_eos). Its sampling is restricted to
  the audio codes of each token's position in its frame (the logit mask it declares), so the
  codec always gets valid codes.
- `snac`: one walk, `window`, repeated by `window_loop`: each iteration decodes the request's
  next window. Its loop declares an ITER policy whose cap is the number of windows its input
  stream makes (engine/models/orpheus.py), known when the LLM's stream ends (on EOS or at
  max_tokens): until then the stage registers it open. So the loop ends when its input has
  ended and its last window is decoded, and that ends the partition.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.models.orpheus import (
    AUDIO_TOKEN_BASE,
    CODEBOOK,
    FRAME_TOKENS,
    SAMPLES_PER_FRAME,
    WINDOW_TOKENS,
    audio_token_low,
    level_codes,
    split_levels,
    windows_for,
)
from engine.models.token_node import TokenNode, token_graph
from engine.runtime.graph import GraphSpec, NodeSubmodule, StopCheck, StopRows
from engine.runtime.stops import StopKind, StopPolicy

WINDOW_LOOP = "window_loop"


class OrpheusNode(TokenNode):
    graph = token_graph("llm")
    default_policy = StopKind.AR

    sampling_span = (AUDIO_TOKEN_BASE, AUDIO_TOKEN_BASE + FRAME_TOKENS * CODEBOOK)

    def sampling_window(self, output_index: np.ndarray) -> tuple[np.ndarray, int]:
        return audio_token_low(output_index), CODEBOOK


class SnacNode(NodeSubmodule):
    """A windowed stream node: what the worker's stream stage (engine/worker/stream_stage.py)
    reads is the window geometry, `windows_for` and `decode`; its codec graphs split `decode`
    into `codes` (the host's part) and `pcm` (the device's, captured)."""

    graph = GraphSpec(node="snac", walks=("window",), loops={WINDOW_LOOP: "window"})
    window_tokens = WINDOW_TOKENS  # a window's input tokens
    hop_tokens = FRAME_TOKENS  # how far the next window starts after this one
    windows_for = staticmethod(windows_for)  # windows a stream of n tokens makes
    code_width = WINDOW_TOKENS  # a window's codes, the three levels side by side

    def codes(self, windows: np.ndarray) -> np.ndarray:
        """Windows [B, 28] of audio tokens -> their codes [B, 28], on the host."""
        return level_codes(windows)

    def pcm(self, network, codes: torch.Tensor) -> torch.Tensor:
        """Codes [B, 28] on the network's device -> each window's new PCM, int16 [B, 2048] on
        the device: its second frame's samples (the reference's choice; engine/models/orpheus.py).
        Each row is decoded from its own codes alone (SnacDecoder.decode): what the codec
        graphs capture, padding rows and all (engine/worker/codec_graphs.py)."""
        audio = network.decode(split_levels(codes))[:, 0]
        kept = audio[:, SAMPLES_PER_FRAME : 2 * SAMPLES_PER_FRAME].float().clamp(-1.0, 1.0)
        return (kept * 32767.0).round().to(torch.int16)

    def decode(self, network, windows: np.ndarray) -> np.ndarray:
        """Windows [B, 28] of audio tokens -> each window's new PCM, int16 [B, 2048], eagerly."""
        device = next(network.parameters()).device
        codes = torch.from_numpy(self.codes(windows)).to(device)
        return self.pcm(network, codes).cpu().numpy()

    def get_stop_policies(self, walk: str) -> dict[str, StopPolicy] | None:
        if walk == "window":
            return {WINDOW_LOOP: StopPolicy(StopKind.ITER, token_column="window")}
        return None

    def get_loop_caps(self, max_tokens: int) -> dict[str, int]:
        """`max_tokens`: the tokens of the input stream (a stream still open counts as more
        than any window count can reach)."""
        return {WINDOW_LOOP: windows_for(max_tokens)}

    def check_stop(self, rows: StopRows) -> StopCheck:
        """The codec's own check: `output_counts` are the windows decoded, this one included,
        `max_tokens` the tokens of the input stream; done when no window is left."""
        check = StopCheck.none(len(rows.rids))
        caps = np.array([windows_for(int(t)) for t in rows.max_tokens], dtype=np.int64)
        check.stopped[:] = rows.output_counts >= caps
        return check

"""Orpheus TTS: its LLM's shapes, how its audio tokens encode SNAC codes, and the windows an
audio stream is decoded in. The one place this arithmetic lives.

The LLM writes 7 tokens per SNAC frame: token id = AUDIO_TOKEN_BASE + position x 4096 + code,
position 0..6 within the frame, whose codes are SNAC's three levels (1 coarse, 2 middle, 4
fine). The codec decodes a window of 4 frames (28 tokens), moved one frame (7 tokens) at a
time, and keeps from each window its second frame's 2048 samples at 24 kHz: the first frame
is left context, the last two right context. So N frames make max(0, N - 3) windows and
2048 x max(0, N - 3) samples; the tokens of an unfinished frame are never decoded. This is
the reference implementation's arithmetic (orpheus_tts's decoder), and so its audio-seconds.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.messages import SpeechFormat
from engine.models.llama import LlamaConfig

AUDIO_TOKEN_BASE = 128_266
CODEBOOK = 4096
FRAME_TOKENS = 7
WINDOW_FRAMES = 4
WINDOW_TOKENS = WINDOW_FRAMES * FRAME_TOKENS  # 28
SAMPLES_PER_FRAME = 2048  # hop 512 x 4 fine codes per frame
SAMPLE_RATE = 24_000
END_OF_SPEECH = 128_258

# The codes of each level, by a token's position within its frame.
LEVEL_POSITIONS = ((0,), (1, 4), (2, 3, 5, 6))
LEVEL_WIDTHS = tuple(WINDOW_FRAMES * len(level) for level in LEVEL_POSITIONS)  # 4, 8, 16

# fmt: off
PRESETS: dict[str, LlamaConfig] = {
    # Llama-3.2-3B's shapes with Orpheus's vocabulary (128,256 text + 28,684 added tokens).
    "3b": LlamaConfig(
        vocab_size=156_940, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
        num_attention_heads=24, num_key_value_heads=8, head_dim=128,
        eos_token_ids=(END_OF_SPEECH,),
    ),
    # Same vocabulary (the audio ids need it), a few layers of tiny width: CPU tests and CI.
    "tiny": LlamaConfig(
        vocab_size=156_940, hidden_size=64, intermediate_size=192, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        eos_token_ids=(END_OF_SPEECH,),
    ),
}
# fmt: on

# The prompt around the input text: start of human, <|begin_of_text|>, then (after the text)
# <|eot_id|>, end of human, start of AI, start of speech. Orpheus's English voices.
SPEECH = SpeechFormat(
    sample_rate=SAMPLE_RATE,
    prefix=[128_259, 128_000],
    suffix=[128_009, 128_260, 128_261, 128_257],
    voices=["tara", "leah", "jess", "leo", "dan", "mia", "zac", "zoe"],
)


def audio_token_low(output_index: np.ndarray) -> np.ndarray:
    """The first of the CODEBOOK ids the LLM may sample as its `output_index`-th token: the
    codes of that position of its frame (the logit mask its node declares)."""
    return AUDIO_TOKEN_BASE + (np.asarray(output_index, dtype=np.int64) % FRAME_TOKENS) * CODEBOOK


def windows_for(tokens: int) -> int:
    """Windows a stream of `tokens` audio tokens decodes (each SAMPLES_PER_FRAME samples)."""
    return max(0, tokens // FRAME_TOKENS - WINDOW_FRAMES + 1)


def window_tokens(tokens: list[int], window: int) -> list[int]:
    """The 28 tokens of window `window` (0-based) of a stream."""
    start = window * FRAME_TOKENS
    return tokens[start : start + WINDOW_TOKENS]


def level_codes(windows: np.ndarray) -> np.ndarray:
    """Windows [B, 28] of token ids -> their SNAC codes [B, 28]: the three levels side by side
    ([B, 4 | 8 | 16], LEVEL_WIDTHS), each level's codes in time order (frame by frame, a
    frame's in position order). Raises on an id outside its position's codes: the LLM's logit
    mask makes that a bug."""
    offsets = AUDIO_TOKEN_BASE + (np.arange(WINDOW_TOKENS) % FRAME_TOKENS) * CODEBOOK
    codes = np.asarray(windows, dtype=np.int64) - offsets
    if codes.size and (codes.min() < 0 or codes.max() >= CODEBOOK):
        raise ValueError("a window holds a token outside its position's audio codes")
    frames = codes.reshape(len(codes), WINDOW_FRAMES, FRAME_TOKENS)
    levels = zip(LEVEL_POSITIONS, LEVEL_WIDTHS, strict=True)
    return np.concatenate(
        [frames[:, :, list(level)].reshape(len(codes), width) for level, width in levels], axis=1
    )


def split_levels(codes: torch.Tensor) -> list[torch.Tensor]:
    """Codes [B, 28] (levels side by side) -> SNAC's codes per level: [B, 4], [B, 8], [B, 16]."""
    return list(codes.split(LEVEL_WIDTHS, dim=1))


def window_codes(windows: np.ndarray, device=None) -> list[torch.Tensor]:
    """Windows [B, 28] of token ids -> SNAC's codes per level on `device` (level_codes)."""
    return split_levels(torch.from_numpy(level_codes(windows)).to(device))

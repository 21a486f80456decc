"""The model a scenario serves: architecture, preset and seed, or a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    arch: str = "qwen35"
    preset: str = "tiny"
    seed: int = 0
    path: str | None = None  # a Hugging Face-format directory instead of random weights
    # a tokenizer.json (or a directory holding one) for text prompts, or `bytes` (the built-in
    # byte-level tokenizer); default: the checkpoint's own, else a word per id of the model's
    # vocabulary (engine/tokenizer.py WordTokenizer, served at /v1/tokenizer.json)
    tokenizer: str | None = None
    eos_token_ids: list[int] | None = None  # replaces the model's own EOS ids

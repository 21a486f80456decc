"""Model registry: architecture name -> model class, and one way to build a model.

A model class provides `from_preset(preset, seed, dtype, device)` (seeded random weights) and
`from_pretrained(path, dtype, device)` (a Hugging Face-format directory).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.models.qwen35 import Qwen35ForCausalLM

MODELS: dict[str, type[nn.Module]] = {"qwen35": Qwen35ForCausalLM}


def build_model(
    arch: str,
    preset: str,
    seed: int,
    dtype: str | torch.dtype,
    device: str | torch.device,
    path: str | None = None,
) -> nn.Module:
    """The model of a scenario: random weights of `preset` from `seed`, or `path`'s checkpoint
    (then preset and seed are not used). dtype may be a name such as "bfloat16"."""
    if arch not in MODELS:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(sorted(MODELS))}")
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. float32 or bfloat16")
        dtype = getattr(torch, dtype)
    model_cls = MODELS[arch]
    if path is not None:
        return model_cls.from_pretrained(path, dtype, device)
    return model_cls.from_preset(preset, seed, dtype, device)


def vocab_size(spec) -> int:
    """The vocabulary of a scenario's model (a ModelSpec) without building it."""
    if spec.path is not None:
        import json
        from pathlib import Path

        raw = json.loads((Path(spec.path) / "config.json").read_text())
        return int(raw.get("text_config", raw)["vocab_size"])
    from engine.models.qwen35 import PRESETS

    return PRESETS[spec.preset].vocab_size

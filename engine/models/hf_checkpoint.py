"""Loading a Hugging Face-format checkpoint's safetensors into a model, strictly: every
parameter must be present once with its shape, and no tensor may be left unexplained."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint that does not fit the model; the message names the tensor or file."""


def load_safetensors(
    model: nn.Module, files: list[Path], rename: Callable[[str], str | None]
) -> None:
    """Copy each tensor into the parameter `rename(key)` names (None: a tensor the model
    does not use, e.g. a vision tower)."""
    if not files:
        raise CheckpointError("no *.safetensors files in the checkpoint directory")
    params = dict(model.named_parameters())
    loaded, unknown = set(), []
    with torch.no_grad():
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():
                    name = rename(key)
                    if name is None:
                        continue
                    if name not in params:
                        unknown.append(key)
                        continue
                    tensor = f.get_tensor(key)
                    if tuple(tensor.shape) != tuple(params[name].shape):
                        raise CheckpointError(
                            f"{key} in {file.name} has shape {tuple(tensor.shape)}, "
                            f"the model expects {tuple(params[name].shape)}"
                        )
                    params[name].copy_(tensor)
                    loaded.add(name)
    if unknown:
        raise CheckpointError(
            f"unknown tensors in the checkpoint: {', '.join(sorted(unknown)[:8])}"
        )
    missing = sorted(set(params) - loaded)
    if missing:
        raise CheckpointError(f"tensors missing from the checkpoint: {', '.join(missing[:8])}")

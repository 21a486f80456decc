"""Model registry: architecture name -> its nodes (each a network, a graph node and presets),
and one way to build each.

A model is a graph of nodes. The first takes the prompt: its network provides
`random(config, seed, dtype, device)` (seeded random weights) and, where checkpoints load,
`from_pretrained(path, dtype, device)` (a Hugging Face-format directory); its node class is
built around the model's EOS ids (engine/runtime/graph.py, NodeSubmodule). Each node of
`streams` consumes the previous node's token stream on the same worker (Orpheus: the LLM's
audio tokens into the SNAC codec); its presets are keyed by the architecture's preset names.
A model that speaks declares its `speech` format (the /v1/audio/speech endpoint).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.config import ConfigError
from engine.messages import SpeechFormat
from engine.models import orpheus, snac
from engine.models.llama import LlamaForCausalLM
from engine.models.orpheus_node import OrpheusNode, SnacNode
from engine.models.qwen35 import Qwen35ForCausalLM
from engine.models.qwen35_config import PRESETS as QWEN35_PRESETS
from engine.models.qwen35_node import Qwen35Node
from engine.runtime.graph import NodeSubmodule


@dataclass(frozen=True)
class StreamNode:
    """A node fed the previous node's token stream (engine/worker/stream_stage.py runs it)."""

    network: type[nn.Module]
    node: type[NodeSubmodule]
    presets: Mapping[str, Any]  # the architecture's preset name -> this network's config


@dataclass(frozen=True)
class Architecture:
    network: type[nn.Module]  # the first node's
    node: type[NodeSubmodule]
    presets: Mapping[str, Any]  # preset name -> config (with a vocab_size)
    streams: tuple[StreamNode, ...] = ()
    speech: SpeechFormat | None = None


ARCHITECTURES: dict[str, Architecture] = {
    "qwen35": Architecture(Qwen35ForCausalLM, Qwen35Node, QWEN35_PRESETS),
    "orpheus": Architecture(
        LlamaForCausalLM,
        OrpheusNode,
        orpheus.PRESETS,
        streams=(
            StreamNode(
                snac.SnacDecoder,
                SnacNode,
                {"3b": snac.PRESETS["24khz"], "tiny": snac.PRESETS["tiny"]},
            ),
        ),
        speech=orpheus.SPEECH,
    ),
}


def architecture(arch: str) -> Architecture:
    """The registered architecture; a ConfigError (the scenario's to fix) for another name."""
    if arch not in ARCHITECTURES:
        raise ConfigError(
            f"unknown architecture {arch!r}; known: {', '.join(sorted(ARCHITECTURES))}"
        )
    return ARCHITECTURES[arch]


def build_model(
    arch: str,
    preset: str,
    seed: int,
    dtype: str | torch.dtype,
    device: str | torch.device,
    path: str | None = None,
) -> nn.Module:
    """The model of a scenario (its first node's network): random weights of `preset` from
    `seed`, or `path`'s checkpoint (then preset and seed are not used). dtype may be a name
    such as "bfloat16"."""
    entry = architecture(arch)
    dtype = _dtype(dtype)
    if path is not None:
        if not hasattr(entry.network, "from_pretrained"):
            raise ValueError(f"{arch} loads no checkpoint yet: leave model.path unset")
        return entry.network.from_pretrained(path, dtype, device)
    return entry.network.random(_preset(arch, entry.presets, preset), seed, dtype, device)


def build_streams(
    arch: str,
    preset: str,
    seed: int,
    dtype: str | torch.dtype,
    device: str | torch.device,
    kernels: str = "torch",
    sine: str = "exact",
) -> list[tuple[nn.Module, NodeSubmodule]]:
    """The networks and nodes downstream of the first, in stream order (none for most);
    `kernels`: what their networks run on CUDA (engine.codec_kernels), `sine` those kernels'
    sines (engine.codec_sine)."""
    return [
        (
            s.network.random(
                _preset(arch, s.presets, preset), seed, _dtype(dtype), device, kernels, sine
            ),
            s.node(),
        )
        for s in architecture(arch).streams
    ]


def _preset(arch: str, presets: Mapping[str, Any], preset: str):
    if preset not in presets:
        raise ConfigError(f"unknown {arch} preset {preset!r}; presets: {', '.join(presets)}")
    return presets[preset]


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, str):
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(f"unknown dtype {dtype!r}; use e.g. float32 or bfloat16")
        dtype = getattr(torch, dtype)
    return dtype


def build_node(
    arch: str, model: nn.Module, eos_token_ids: list[int] | None = None
) -> NodeSubmodule:
    """The node of `model`; `eos_token_ids` replaces the model's own EOS ids when given."""
    eos = eos_token_ids if eos_token_ids is not None else model.eos_token_ids
    return architecture(arch).node(list(eos))


def vocab_size(spec) -> int:
    """The vocabulary of a scenario's model (a ModelSpec) without building it."""
    if spec.path is not None:
        raw = json.loads((Path(spec.path) / "config.json").read_text())
        return int(raw.get("text_config", raw)["vocab_size"])
    return _preset(spec.arch, architecture(spec.arch).presets, spec.preset).vocab_size

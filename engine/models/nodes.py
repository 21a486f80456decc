"""Graph-node registry: each architecture's NodeSubmodule, built around its model."""

from __future__ import annotations

from torch import nn

from engine.models.qwen35_node import Qwen35Node
from engine.runtime.graph import NodeSubmodule

NODES: dict[str, type[NodeSubmodule]] = {"qwen35": Qwen35Node}


def build_node(
    arch: str, model: nn.Module, eos_token_ids: list[int] | None = None
) -> NodeSubmodule:
    """The node of `model`; `eos_token_ids` replaces the model's own EOS ids when given."""
    return NODES[arch](list(eos_token_ids if eos_token_ids is not None else model.eos_token_ids))

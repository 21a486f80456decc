"""Qwen3.5 as a graph node: a prefill walk, then a decode loop declaring an EOS stop policy
(the loop's cap is its budget) by default, or AR (engine/models/token_node.py)."""

from __future__ import annotations

from engine.models.token_node import DECODE_LOOP, TokenNode, token_graph

__all__ = ["DECODE_LOOP", "Qwen35Node"]


class Qwen35Node(TokenNode):
    graph = token_graph("qwen35")

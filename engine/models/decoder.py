"""What every decoder-only model here shares: the pre-norm block around a token mixer and a
SwiGLU MLP, and the stack (embeddings, blocks, final norm, LM head) with its cached step and
its no-cache reference. Qwen3.5 and Llama differ only in their mixers and cache layouts.

Parameter names are Hugging Face's (`model.embed_tokens`, `model.layers.N.mlp.gate_proj`,
...), so published checkpoints map one to one. RMSNorms scale by (1 + weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.cache import KVCache
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm block: the token mixer (`mix`, a subclass's attention) then the MLP."""

    def __init__(self, hidden: int, intermediate: int, eps: float):
        super().__init__()
        self.mlp = GatedMLP(hidden, intermediate)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)

    def mix(self, h, cos, sin, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        raise NotImplementedError

    def mix_full(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x, residual, cos, sin, batch: ForwardBatch, cache: KVCache, to_norm=False):
        """The cached path. The residual stream is carried beside the layer's output so each
        norm fuses the add before it: returns (this layer's output, residual before it).
        `to_norm`: the output's only reader is the next layer's input norm (`ops.linear`'s
        `to_norm`: a split product may come back unsummed, which that norm sums); x may be
        such a product of the layer before."""
        ops = batch.ops
        h, residual = ops.norm(x, self.input_layernorm, residual)
        h = self.mix(h, cos, sin, batch, cache)
        h, residual = ops.norm(h, self.post_attention_layernorm, residual)
        mlp = self.mlp
        act = ops.swiglu(h, mlp.gate_proj, mlp.up_proj)
        return ops.linear(mlp.down_proj, act, to_norm=to_norm), residual

    def forward_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.mix_full(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class DecoderStack(nn.Module):
    """The `model.` namespace of the checkpoints: embeddings, layers, final norm."""

    def __init__(self, vocab: int, hidden: int, layers: list[DecoderLayer], eps: float):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(hidden, eps)


@dataclass(frozen=True)
class DecoderShapes:
    """The sizes every decoder's config starts with (Hugging Face's names); a model's config
    adds its own fields after them."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int


def check_eos(eos_token_ids: tuple[int, ...], vocab_size: int) -> None:
    """A config's EOS ids: at least one, each in the vocabulary."""
    if not eos_token_ids or not all(0 <= t < vocab_size for t in eos_token_ids):
        raise ValueError(f"eos_token_ids must be ids below vocab_size, got {eos_token_ids}")


class HeadRows(nn.Module):
    """Some rows of an LM head's weight (a view of it) as a linear layer without bias:
    `CausalLM.restrict_head`'s head. Not a parameter: the model's own head holds the weight."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight


class CausalLM(nn.Module):
    """A decoder stack (`self.model`) with rotary positions (`self.rotary`) and an LM head,
    tied to the embeddings unless the config says otherwise (then `self.lm_head`). The config
    has vocab_size, hidden_size, rms_norm_eps, rope_theta, tie_word_embeddings and
    eos_token_ids."""

    def __init__(self, config, layers: list[DecoderLayer], rotary_dim: int):
        super().__init__()
        self.config = config
        self.eos_token_ids: list[int] = list(config.eos_token_ids)
        self.model = DecoderStack(
            config.vocab_size, config.hidden_size, layers, config.rms_norm_eps
        )
        self.rotary = RotaryEmbedding(rotary_dim, config.rope_theta)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.span_head: HeadRows | None = None  # restrict_head's

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def head(self) -> nn.Module:
        """The LM head: the embeddings when tied, else `lm_head` (its weight [vocab, hidden])."""
        return self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head

    def restrict_head(self, first: int, end: int) -> None:
        """From now on the cached path's logits are of ids [first, end) alone, column j being
        id first + j: the LM head's product over those rows of its weight (a view, no copy),
        for a node whose logit mask never samples outside them. The no-cache reference
        (`forward_full`) keeps the whole vocabulary. Call it before the step's graphs are
        captured and its ops built, so both see the restricted head."""
        if not 0 <= first < end <= self.config.vocab_size:
            raise ValueError(f"a head span must lie in [0, {self.config.vocab_size}), got "
                             f"[{first}, {end})")  # fmt: skip
        self.span_head = HeadRows(self.head.weight.detach()[first:end])

    @property
    def step_head(self) -> nn.Module:
        """The LM head of the cached path: `head`, or its rows `restrict_head` kept."""
        return self.head if self.span_head is None else self.span_head

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        """The no-cache reference's logits (the cached path's go through its ops)."""
        return F.linear(normed, self.head.weight).float()

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, cache: KVCache, float32: bool = True) -> torch.Tensor:
        """Float32 logits [R, vocab] of each row's last token (`float32=False`: in the model's
        dtype, as the head computed them), the step already planned (`batch.ops.begin_step`).
        Writes the step's K/V through slot_mapping and updates each row's state slot; a row
        with num_cached == 0 starts from a zero state, any other row continues from its slot
        (chunked prefill, decode)."""
        x, residual = self.hidden_states(batch, cache)
        return self.logits_at(x, residual, batch.last_token_index, batch.ops, float32)

    def hidden_states(self, batch: ForwardBatch, cache: KVCache):
        """Every token's last-layer output and the residual stream beside it, [T, hidden]
        each: the token-wise body of the step (what the piecewise graph runner captures)."""
        x, residual = self.model.embed_tokens(batch.input_ids), None
        cos, sin = self.rotary(batch.positions)
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):  # the last layer's output is indexed
            x, residual = layer(x, residual, cos, sin, batch, cache, to_norm=i < last)
        return x, residual

    def logits_at(self, x, residual, rows: torch.Tensor, ops, float32: bool = True):
        """Float32 logits of the tokens at `rows` (each row's last token); `float32=False`: in
        the model's dtype."""
        hidden, _ = ops.norm(x, self.model.norm, residual, rows=rows)
        logits = ops.linear(self.step_head, hidden)
        return logits.float() if float32 else logits

    @torch.no_grad()
    def forward_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [L, vocab] of one sequence with no cache: the reference for the cached path."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary.angles(torch.arange(input_ids.shape[0], device=input_ids.device))
        for layer in self.model.layers:
            x = layer.forward_full(x, cos, sin)
        return self._head(self.model.norm(x))

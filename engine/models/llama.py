"""Llama (3.x): a decoder of plain GQA attention layers with full rotary positions.

Orpheus's LLM is a Llama-3.2-3B fine-tune whose vocabulary carries 28,672 audio tokens
(engine/models/orpheus.py). Weights are seeded random (`random`); the parameter names
are Hugging Face's. Llama's RMSNorm weights are plain scales; ours scale by (1 + weight)
(engine/layers/norm.py), so a checkpoint's norm weights would load less one. Llama 3's
long-context RoPE frequency scaling is not modelled: at these lengths it changes values, not
cost.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.batch import ForwardBatch
from engine.cache import CacheShapes, KVCache
from engine.layers.attention import Attention
from engine.models.decoder import CausalLM, DecoderLayer, DecoderShapes, check_eos
from engine.models.random_weights import decoder_weight, random_model, seeded


@dataclass(frozen=True)
class LlamaConfig(DecoderShapes):
    eos_token_ids: tuple[int, ...]
    rope_theta: float = 500_000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        check_eos(self.eos_token_ids, self.vocab_size)


class LlamaDecoderLayer(DecoderLayer):
    def __init__(self, config: LlamaConfig, index: int):
        c = config
        super().__init__(c.hidden_size, c.intermediate_size, c.rms_norm_eps)
        self.index = index  # its K/V in KVCache.k/v: every layer is full attention
        self.self_attn = Attention(
            c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        )

    def mix(self, h, cos, sin, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        return self.self_attn(h, cos, sin, batch, cache.k[self.index], cache.v[self.index])

    def mix_full(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return self.self_attn.forward_full(h, cos, sin)


class LlamaForCausalLM(CausalLM):
    def __init__(self, config: LlamaConfig):
        layers = [LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        super().__init__(config, layers, rotary_dim=config.head_dim)

    def cache_shapes(self) -> CacheShapes:
        """Paged K/V for every layer; no recurrent state."""
        c = self.config
        return CacheShapes(
            num_full_layers=c.num_hidden_layers, num_linear_layers=0,
            kv_heads=c.num_key_value_heads, head_dim=c.head_dim,
            conv_dim=0, conv_kernel=1, state_heads=0, state_k=0, state_v=0,
        )  # fmt: skip

    @classmethod
    def random(cls, config: LlamaConfig, seed: int, dtype: torch.dtype, device) -> LlamaForCausalLM:
        return random_model(
            lambda: cls(config),
            lambda name, shape: decoder_weight(
                name, shape, config.num_hidden_layers, seeded(seed, name)
            ),
            dtype,
            device,
        )

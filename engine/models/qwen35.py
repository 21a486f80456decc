"""Qwen3.5 (text): a hybrid decoder of Gated DeltaNet and gated full-attention layers.

Layers cycle three `linear_attention` (Gated DeltaNet) then one `full_attention`; each is
pre-norm with a SwiGLU MLP; RMSNorms scale by (1 + weight); embeddings are tied for the small
sizes. Parameter names are Hugging Face's, so a published checkpoint maps one to one.
Weights are either seeded random (`random`) or read from a checkpoint (`from_pretrained`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from engine.batch import ForwardBatch
from engine.cache import CacheShapes, KVCache
from engine.layers.attention import GatedAttention
from engine.layers.gated_delta import GatedDeltaNet
from engine.models.decoder import CausalLM, DecoderLayer
from engine.models.hf_checkpoint import CheckpointError, load_safetensors
from engine.models.qwen35_config import FULL, LINEAR, PRESETS, Qwen35Config
from engine.models.random_weights import decoder_weight, empty_model, random_model, seeded

__all__ = ["PRESETS", "CheckpointError", "Qwen35ForCausalLM"]


class Qwen35DecoderLayer(DecoderLayer):
    """One pre-norm block; `cache_index` is its position among the layers of its type, i.e.
    its index into KVCache.k/v (full) or KVCache.conv_state/ssm_state (linear)."""

    def __init__(self, config: Qwen35Config, layer_type: str, cache_index: int):
        c = config
        super().__init__(c.hidden_size, c.intermediate_size, c.rms_norm_eps)
        self.is_full, self.cache_index = layer_type == FULL, cache_index
        if self.is_full:
            self.self_attn = GatedAttention(
                c.hidden_size,
                c.num_attention_heads,
                c.num_key_value_heads,
                c.head_dim,
                c.rms_norm_eps,
            )
        else:
            self.linear_attn = GatedDeltaNet(
                c.hidden_size, c.linear_num_key_heads, c.linear_num_value_heads,
                c.linear_key_head_dim, c.linear_value_head_dim, c.linear_conv_kernel_dim, c.rms_norm_eps,
            )  # fmt: skip

    def mix(self, h, cos, sin, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        i = self.cache_index
        if self.is_full:
            return self.self_attn(h, cos, sin, batch, cache.k[i], cache.v[i])
        return self.linear_attn(h, batch, cache.conv_state[i], cache.ssm_state[i])

    def mix_full(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.is_full:
            return self.self_attn.forward_full(h, cos, sin)
        return self.linear_attn.forward_full(h)


class Qwen35ForCausalLM(CausalLM):
    def __init__(self, config: Qwen35Config):
        types = config.layer_types
        layers = [
            Qwen35DecoderLayer(config, kind, types[:i].count(kind)) for i, kind in enumerate(types)
        ]
        super().__init__(config, layers, rotary_dim=config.rotary_dim)

    def cache_shapes(self) -> CacheShapes:
        c = self.config
        return CacheShapes(
            num_full_layers=c.layer_types.count(FULL),
            num_linear_layers=c.layer_types.count(LINEAR),
            kv_heads=c.num_key_value_heads,
            head_dim=c.head_dim,
            conv_dim=2 * c.linear_num_key_heads * c.linear_key_head_dim
            + c.linear_num_value_heads * c.linear_value_head_dim,
            conv_kernel=c.linear_conv_kernel_dim,
            state_heads=c.linear_num_value_heads,
            state_k=c.linear_key_head_dim,
            state_v=c.linear_value_head_dim,
        )

    @classmethod
    def random(
        cls, config: Qwen35Config, seed: int, dtype: torch.dtype, device
    ) -> Qwen35ForCausalLM:
        return random_model(
            lambda: cls(config),
            lambda name, shape: random_weight(name, shape, config, seed),
            dtype,
            device,
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: torch.dtype, device) -> Qwen35ForCausalLM:
        """A Hugging Face-format directory: config.json (+ generation_config.json) and
        *.safetensors, possibly sharded; text-only or the multimodal checkpoint."""
        root = Path(path)
        if not (root / "config.json").is_file():
            raise CheckpointError(f"{root} has no config.json")
        generation = root / "generation_config.json"
        config = Qwen35Config.from_hf(
            json.loads((root / "config.json").read_text()),
            json.loads(generation.read_text()) if generation.is_file() else None,
        )
        model = empty_model(lambda: cls(config), dtype, device)
        load_safetensors(
            model, sorted(root.glob("*.safetensors")), lambda key: _our_name(key, config)
        )
        return model


def random_weight(
    name: str, shape: tuple[int, ...], config: Qwen35Config, seed: int
) -> torch.Tensor:
    """One parameter (random_weights.py): Gated DeltaNet's own parameters here, the rest as
    any decoder's (the causal conv's 4 taps at fan-in scale keep its output O(1))."""
    gen = seeded(seed, name)
    if name.endswith("A_log"):  # decay rates A in [1, 16], as Mamba2
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias"):  # softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1]
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("linear_attn.norm.weight"):  # plain scale
        return torch.ones(shape)
    return decoder_weight(name, shape, config.num_hidden_layers, gen)


_IGNORED_PREFIXES = ("model.visual.", "visual.", "mtp.", "model.mtp.")


def _our_name(key: str, config: Qwen35Config) -> str | None:
    """Checkpoint name -> parameter name; None for tensors this text model does not use."""
    if key.startswith(_IGNORED_PREFIXES) or (
        key == "lm_head.weight" and config.tie_word_embeddings
    ):
        return None
    if key.startswith("model.language_model."):
        return "model." + key.removeprefix("model.language_model.")
    return key

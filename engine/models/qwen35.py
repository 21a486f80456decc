"""Qwen3.5 (text): a hybrid decoder of Gated DeltaNet and gated full-attention layers.

Layers cycle three `linear_attention` (Gated DeltaNet) then one `full_attention`; each is
pre-norm with a SwiGLU MLP; RMSNorms scale by (1 + weight); embeddings are tied for the small
sizes. Parameter names are Hugging Face's, so a published checkpoint maps one to one.
Weights are either seeded random (`from_preset`) or read from a checkpoint (`from_pretrained`).
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.cache import CacheShapes, KVCache
from engine.layers.attention import GatedAttention
from engine.layers.gated_delta import GatedDeltaNet
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.models.hf_checkpoint import CheckpointError, load_safetensors
from engine.models.qwen35_config import FULL, LINEAR, PRESETS, Qwen35Config


class Qwen35MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen35DecoderLayer(nn.Module):
    """One pre-norm block; `cache_index` is its position among the layers of its type, i.e.
    its index into KVCache.k/v (full) or KVCache.conv_state/ssm_state (linear)."""

    def __init__(self, config: Qwen35Config, layer_type: str, cache_index: int):
        super().__init__()
        c = config
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
        self.mlp = Qwen35MLP(c.hidden_size, c.intermediate_size)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, residual, cos, sin, batch: ForwardBatch, cache: KVCache):
        """The cached path. The residual stream is carried beside the layer's output so each
        norm fuses the add before it: returns (this layer's output, residual before it)."""
        ops, i = batch.ops, self.cache_index
        h, residual = ops.norm(x, self.input_layernorm, residual)
        if self.is_full:
            h = self.self_attn(h, cos, sin, batch, cache.k[i], cache.v[i])
        else:
            h = self.linear_attn(h, batch, cache.conv_state[i], cache.ssm_state[i])
        h, residual = ops.norm(h, self.post_attention_layernorm, residual)
        mlp = self.mlp
        return mlp.down_proj(ops.swiglu(h, mlp.gate_proj, mlp.up_proj)), residual

    def forward_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.input_layernorm(x)
        if self.is_full:
            return self._mlp(x + self.self_attn.forward_full(h, cos, sin))
        return self._mlp(x + self.linear_attn.forward_full(h))

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen35Model(nn.Module):
    """The `model.` namespace of the checkpoints: embeddings, layers, final norm."""

    def __init__(self, config: Qwen35Config):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        types = config.layer_types
        self.layers = nn.ModuleList(
            Qwen35DecoderLayer(config, kind, types[:i].count(kind)) for i, kind in enumerate(types)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class Qwen35ForCausalLM(nn.Module):
    def __init__(self, config: Qwen35Config):
        super().__init__()
        self.config = config
        self.eos_token_ids: list[int] = list(config.eos_token_ids)
        self.model = Qwen35Model(config)
        self.rotary = RotaryEmbedding(config.rotary_dim, config.rope_theta)
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

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

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _head(self, normed: torch.Tensor) -> torch.Tensor:
        head = self.model.embed_tokens if self.config.tie_word_embeddings else self.lm_head
        return F.linear(normed, head.weight).float()

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self._head(self.model.norm(hidden))

    @torch.no_grad()
    def forward(self, batch: ForwardBatch, cache: KVCache) -> torch.Tensor:
        """Float32 logits [R, vocab] of each row's last token, the step already planned
        (`batch.ops.begin_step`). Writes the step's K/V through slot_mapping and updates each
        row's state slot; a row with num_cached == 0 starts
        from a zero state, any other row continues from its slot (chunked prefill, decode)."""
        x, residual = self.hidden_states(batch, cache)
        return self.logits_at(x, residual, batch.last_token_index, batch.ops)

    def hidden_states(self, batch: ForwardBatch, cache: KVCache):
        """Every token's last-layer output and the residual stream beside it, [T, hidden]
        each: the token-wise body of the step (what the piecewise graph runner captures)."""
        x, residual = self.model.embed_tokens(batch.input_ids), None
        cos, sin = self.rotary(batch.positions)
        for layer in self.model.layers:
            x, residual = layer(x, residual, cos, sin, batch, cache)
        return x, residual

    def logits_at(self, x, residual, rows: torch.Tensor, ops) -> torch.Tensor:
        """Float32 logits of the tokens at `rows` (each row's last token)."""
        hidden, _ = ops.norm(x[rows], self.model.norm, residual[rows])
        return self._head(hidden)

    @torch.no_grad()
    def forward_full(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits [L, vocab] of one sequence with no cache: the reference for the cached path."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(torch.arange(input_ids.shape[0], device=input_ids.device))
        for layer in self.model.layers:
            x = layer.forward_full(x, cos, sin)
        return self._logits(x)

    @classmethod
    def _empty(cls, config: Qwen35Config, dtype: torch.dtype, device) -> Qwen35ForCausalLM:
        """Allocated but unfilled: building on meta skips torch's default init of 0.8B weights."""
        with torch.device("meta"):
            model = cls(config)
        return model.to(dtype=dtype).to_empty(device=device).eval()

    @classmethod
    def from_preset(cls, preset: str, seed: int, dtype: torch.dtype, device) -> Qwen35ForCausalLM:
        if preset not in PRESETS:
            raise ValueError(f"unknown qwen35 preset {preset!r}; presets: {', '.join(PRESETS)}")
        return cls.random(PRESETS[preset], seed, dtype, device)

    @classmethod
    def random(
        cls, config: Qwen35Config, seed: int, dtype: torch.dtype, device
    ) -> Qwen35ForCausalLM:
        model = cls._empty(config, dtype, device)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(_random_weight(name, tuple(param.shape), config, seed))
        return model

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
        model = cls._empty(config, dtype, device)
        load_safetensors(
            model, sorted(root.glob("*.safetensors")), lambda key: _our_name(key, config)
        )
        return model


# Residual writes (o_proj, out_proj, down_proj) at gain / sqrt(2 * layers) of fan-in scale:
# with gain 1 the embedding dominates the residual stream and a random model, whose LM head is
# that embedding, greedily repeats its input token; at 4 the layers dominate and greedy output
# depends on the context (varied sequences), which is what the engine's tests need.
RESIDUAL_GAIN = 4.0


def _random_weight(
    name: str, shape: tuple[int, ...], config: Qwen35Config, seed: int
) -> torch.Tensor:
    """One parameter from its own generator, seeded by (seed, name): identical in every process
    and independent of creation order. Scales keep activations O(1) through the depth."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))
    if name.endswith("A_log"):  # decay rates A in [1, 16], as Mamba2
        return torch.empty(shape).uniform_(1.0, 16.0, generator=gen).log()
    if name.endswith("dt_bias"):  # softplus(dt_bias) = dt, log-uniform in [1e-3, 1e-1]
        dt = torch.empty(shape).uniform_(math.log(1e-3), math.log(1e-1), generator=gen).exp()
        return dt + torch.log(-torch.expm1(-dt))
    if name.endswith("linear_attn.norm.weight"):  # plain scale
        return torch.ones(shape)
    if name.endswith("norm.weight"):  # (1 + weight) scale
        return torch.zeros(shape)
    if name.endswith("embed_tokens.weight"):
        # Tied with the LM head: logits = norm(h) . E^T have a std of about 3, so the model
        # makes confident, context-dependent choices rather than near-uniform ones.
        std = 3.0 / math.sqrt(shape[-1])
    elif name.endswith("conv1d.weight"):  # 4 taps of O(1) weight keep the conv output O(1)
        std = shape[-1] ** -0.5
    else:  # fan-in scaling keeps each sublayer O(1); residual writes share 1/sqrt(2L)
        std = shape[-1] ** -0.5
        if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
            std /= math.sqrt(2 * config.num_hidden_layers) / RESIDUAL_GAIN
    return torch.randn(shape, generator=gen) * std


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

"""Qwen3.5's configuration: Hugging Face's field names, the presets, and config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.models.decoder import DecoderShapes, check_eos
from engine.models.hf_checkpoint import CheckpointError

FULL, LINEAR = "full_attention", "linear_attention"


@dataclass(frozen=True)
class Qwen35Config(DecoderShapes):
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    eos_token_ids: tuple[int, ...]
    linear_conv_kernel_dim: int = 4
    full_attention_interval: int = 4
    partial_rotary_factor: float = 0.25
    rope_theta: float = 10_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    layer_types: tuple[str, ...] = ()  # empty: every full_attention_interval-th layer is full

    def __post_init__(self) -> None:
        if not self.layer_types:
            every = self.full_attention_interval
            types = tuple(
                FULL if (i + 1) % every == 0 else LINEAR for i in range(self.num_hidden_layers)
            )
            object.__setattr__(self, "layer_types", types)
        known = set(self.layer_types) <= {FULL, LINEAR}
        if len(self.layer_types) != self.num_hidden_layers or not known:
            raise ValueError(f"layer_types must be {self.num_hidden_layers} of {FULL!r}/{LINEAR!r}")
        check_eos(self.eos_token_ids, self.vocab_size)

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_hf(cls, raw: dict, generation: dict | None = None) -> Qwen35Config:
        """From a config.json (text-only, or multimodal with `text_config`) and optionally a
        generation_config.json, whose EOS ids (e.g. <|im_end|>) join the config's."""
        text = raw.get("text_config", raw)
        if text.get("attn_output_gate", True) is not True:
            raise CheckpointError("attention without the output gate is not supported")
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        eos: list[int] = []
        for source in ((generation or {}).get("eos_token_id"), text.get("eos_token_id")):
            for token in [source] if isinstance(source, int) else source or []:
                eos += [token] if token not in eos else []
        explicit = {"eos_token_ids", "layer_types", "rope_theta", "partial_rotary_factor"}
        explicit |= {"tie_word_embeddings"}
        fields = {f.name for f in dataclasses.fields(cls)} - explicit
        return cls(
            **{k: v for k, v in text.items() if k in fields},
            rope_theta=rope.get("rope_theta", text.get("rope_theta", 10_000_000.0)),
            partial_rotary_factor=rope.get(
                "partial_rotary_factor", text.get("partial_rotary_factor", 0.25)
            ),
            tie_word_embeddings=raw.get(
                "tie_word_embeddings", text.get("tie_word_embeddings", False)
            ),
            layer_types=tuple(text.get("layer_types") or ()),
            eos_token_ids=tuple(eos),
        )


# fmt: off
PRESETS: dict[str, Qwen35Config] = {
    # Published Qwen3.5-0.8B text shapes. EOS: <|im_end|> (generation_config) and <|endoftext|>.
    "0.8b": Qwen35Config(
        vocab_size=248_320, hidden_size=1024, intermediate_size=3584, num_hidden_layers=24,
        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
        linear_num_key_heads=16, linear_num_value_heads=16,
        linear_key_head_dim=128, linear_value_head_dim=128, eos_token_ids=(248_046, 248_044),
    ),
    # Same structure, a few million parameters, for CPU tests and CI.
    "tiny": Qwen35Config(
        vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=8,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        linear_num_key_heads=4, linear_num_value_heads=4,
        linear_key_head_dim=32, linear_value_head_dim=32, eos_token_ids=(4094, 4095),
    ),
}
# fmt: on

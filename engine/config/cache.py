"""The KV cache's and the recurrent-state pool's settings (engine/cache/kv_cache.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import ConfigError, check_at_least_one, check_one_of, setting

STATE_DTYPES = ("float32", "bfloat16", "float16")  # engine.state_dtype


@dataclass(frozen=True)
class CacheConfig:
    page_size: int = setting(16, "tokens a KV page")
    kv_pages: int = setting(8192, "pages in the paged KV pool")
    state_slots: int = setting(512, "recurrent-state slots (one per running request)")
    max_model_len: int = setting(4096, "prompt + output tokens of one request")
    # bfloat16 or float16 halve a decode step's state traffic (vLLM's default keeps the state
    # in the model's dtype); the math on it is fp32 either way. bf16 rounds to 8 significant
    # bits (0.8b on the H200: greedy agreement with fp32 82%), fp16 to 11 with a range to
    # 65,504 (the states' entries stay far inside it: keys are L2-normalised).
    state_dtype: str = setting("float32", "storage of the recurrent (Gated DeltaNet) states")

    def __post_init__(self) -> None:
        check_at_least_one(self, "page_size", "max_model_len", "kv_pages", "state_slots")
        check_one_of("engine.state_dtype", self.state_dtype, STATE_DTYPES)
        if self.kv_pages * self.page_size < self.max_model_len:
            raise ConfigError("engine.kv_pages * page_size must hold one max_model_len request")

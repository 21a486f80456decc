"""The KV/state cache: device tensors and their allocators. Worker, runtime and models import
it downward; it imports nothing of theirs."""

from engine.cache.free_list import FreeList
from engine.cache.kv_cache import CacheShapes, KVCache

__all__ = ["CacheShapes", "FreeList", "KVCache"]

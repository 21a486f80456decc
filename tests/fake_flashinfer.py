"""A stand-in for FlashInfer's paged-attention wrappers where FlashInfer cannot run (it needs
CUDA): it records which wrappers the engine builds, plans and runs, and computes nothing (a
run returns zeros). What FlashInferAttention does around them (slots, the Triton decode path)
can then be checked on a CPU."""

from __future__ import annotations

import types

import torch


class Wrapper:
    def __init__(self, workspace: torch.Tensor, layout: str, **options):
        self.options = options
        self.plans = 0
        self.runs = 0

    def plan(self, *args, **kwargs) -> None:
        self.plans += 1

    def run(self, q: torch.Tensor, paged_kv_cache) -> torch.Tensor:
        self.runs += 1
        return torch.zeros_like(q)


def module() -> types.ModuleType:
    """A fresh `flashinfer` module whose wrappers keep every instance in `built`."""
    fake = types.ModuleType("flashinfer")
    fake.built = []

    def kind(name: str) -> type:
        def init(self, *args, **kwargs):
            Wrapper.__init__(self, *args, **kwargs)
            fake.built.append(self)

        return type(name, (Wrapper,), {"__init__": init})

    fake.BatchDecodeWithPagedKVCacheWrapper = kind("BatchDecodeWithPagedKVCacheWrapper")
    fake.BatchPrefillWithPagedKVCacheWrapper = kind("BatchPrefillWithPagedKVCacheWrapper")
    return fake

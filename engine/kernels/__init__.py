"""Kernel backends: how the ops of a model step run.

`torch` is the reference (engine/layers, any device). `cuda` runs the step on kernels:
Triton kernels of our own for norms, rotary, conv and the Gated DeltaNet recurrence over the
state pool, flash-linear-attention's chunked kernel for long Gated DeltaNet prefills,
FlashInfer's paged attention and sampling. The engine picks one by name
(`engine.kernels` in a scenario); `auto` means `cuda` on a CUDA device, else `torch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import ConfigError

if TYPE_CHECKING:  # torch is not imported here: the API server and `bench` import this
    # package's plain-Python modules and would pay torch's import
    import torch
    from torch import nn

    from engine.config import KernelsConfig

# The H200's streaming multiprocessors: what the launches that aim at a few programs an SM
# count from (the decode attention's splits, the GEMM's split-K, the pipelined recurrence).
SMS = 132


def resolve_backend(name: str, device: torch.device) -> str:
    """engine.kernels on `device`: `auto` is `cuda` on a CUDA device, else `torch`."""
    if name == "auto":
        return "cuda" if device.type == "cuda" else "torch"
    if name == "cuda" and device.type != "cuda":
        raise ConfigError("engine.kernels=cuda needs engine.device=cuda")
    return name


def build_ops(
    config: KernelsConfig, model: nn.Module, device: torch.device, page_size: int, slots: int = 2
):
    """The ops object a step's ForwardBatch carries for `model` on `device`, as the kernels'
    part of the configuration says (engine/config/kernels.py, validated there); `slots` host
    buffers for the resources that declare `force_double_buffer`."""
    if resolve_backend(config.kernels, device) == "torch":
        from engine.kernels.torch_ops import TORCH_OPS

        return TORCH_OPS
    from engine.kernels import triton_launch as launches  # imports triton: CUDA only
    from engine.kernels.cuda_ops import CudaOps

    launches.set_launch(config.triton_launch, config.pdl)
    return CudaOps(model, device, page_size, slots, config)

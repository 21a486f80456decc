"""Kernel backends: how the ops of a model step run.

`torch` is the reference (engine/layers, any device). `cuda` runs the step on kernels:
Triton kernels of our own for norms, rotary, conv and the Gated DeltaNet recurrence over the
state pool, flash-linear-attention's chunked kernel for long Gated DeltaNet prefills,
FlashInfer's paged attention and sampling. The engine picks one by name
(`engine.kernels` in a scenario); `auto` means `cuda` on a CUDA device, else `torch`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.config import (
    ConfigError,
    check_decode_attention,
    check_dense_kernel,
    check_one_of,
    split_setting,
)
from engine.kernels.gdn_config import SPLIT_FROM_TOKENS

if TYPE_CHECKING:  # torch is not imported here: engine.config reads gdn_config, this package's
    # module, for every scenario, and the API server and `bench` would pay torch's import
    import torch
    from torch import nn

BACKENDS = ("auto", "torch", "cuda")
# The Gated DeltaNet kernel of prefill and mixed steps (engine.gdn_prefill)
GDN_PREFILL = ("fla", "triton", "triton_split", "auto")


def resolve_backend(name: str, device: torch.device) -> str:
    check_one_of("engine.kernels", name, BACKENDS)
    if name == "auto":
        return "cuda" if device.type == "cuda" else "torch"
    if name == "cuda" and device.type != "cuda":
        raise ConfigError("engine.kernels=cuda needs engine.device=cuda")
    return name


def build_ops(
    name: str,
    model: nn.Module,
    device: torch.device,
    page_size: int,
    slots: int = 2,
    gdn_prefill: str = "auto",
    decode_tensor_cores: bool = False,
    piecewise_gdn: bool = False,
    gdn_split: str = "default",
    gdn_split_from_tokens: int = SPLIT_FROM_TOKENS,
    dense_kernel: str = "torch",
    triton_launch: str = "jit",
    decode_attention: str = "flashinfer",
    pdl: bool = False,
    gdn_decode: str = "grid",
):
    """The ops object a step's ForwardBatch carries for `model` on `device`; `slots` host
    buffers for the resources that declare `force_double_buffer`; `gdn_prefill` names the
    Gated DeltaNet kernel of bf16/fp16 prefill and mixed steps (GDN_PREFILL);
    `decode_tensor_cores` runs FlashInfer's decode attention on tensor cores; `piecewise_gdn`
    makes the CUDA ops' Gated DeltaNet capturable (engine.piecewise_gdn); `gdn_split` is the
    split kernel's launch configuration (engine.gdn_split, SplitConfig's text), taken by
    `auto` from rows of `gdn_split_from_tokens` new tokens on; `dense_kernel` runs the CUDA
    ops' dense projections on torch's GEMM or ours for few rows (engine.dense_kernel);
    `triton_launch` sets how this process launches its Triton kernels (engine.triton_launch);
    `decode_attention` names the kernel of decode steps' attention (engine.decode_attention);
    `pdl`: our kernels' launches programmatic (engine.pdl, triton_launch.py); `gdn_decode`:
    the recurrence of decode rows on the grid or the pipelined kernel (engine.gdn_decode)."""
    check_one_of("engine.gdn_prefill", gdn_prefill, GDN_PREFILL)
    split = split_setting(gdn_split)
    check_dense_kernel(dense_kernel)
    check_decode_attention(decode_attention)
    if resolve_backend(name, device) == "torch":
        from engine.kernels.torch_ops import TORCH_OPS

        return TORCH_OPS
    from engine.kernels import triton_launch as launches  # imports triton: CUDA only
    from engine.kernels.cuda_ops import CudaOps

    launches.set_launch(triton_launch, pdl)

    return CudaOps(
        model, device, page_size, slots, gdn_prefill, decode_tensor_cores, piecewise_gdn, split,
        gdn_split_from_tokens, dense_kernel, decode_attention, gdn_decode == "pipelined",
    )  # fmt: skip

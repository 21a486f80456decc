"""Seeded random weights, shared by the models: every parameter drawn from its own generator,
seeded by (seed, parameter name), so a model is identical in every process and independent
of the order its parameters are created in; scales keep activations O(1) through the depth.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# Residual writes (o_proj, out_proj, down_proj) at gain / sqrt(2 * layers) of fan-in scale:
# with gain 1 the embedding dominates the residual stream and a random model, whose LM head is
# that embedding, greedily repeats its input token; at 4 the layers dominate and greedy output
# depends on the context (varied sequences), which is what the engine's tests need.
RESIDUAL_GAIN = 4.0
RESIDUAL_WRITES = ("o_proj.weight", "out_proj.weight", "down_proj.weight")


def seeded(seed: int, name: str) -> torch.Generator:
    """The generator of one parameter: a function of (seed, name) only."""
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def decoder_weight(
    name: str, shape: tuple[int, ...], num_layers: int, gen: torch.Generator
) -> torch.Tensor:
    """A decoder's parameter: RMS norms (zero-centred, scale 1 + weight) at zero, the tied
    embedding at std 3/sqrt(hidden) (logits = norm(h) . E^T then have a std of about 3, so the
    model makes confident, context-dependent choices), every other weight at fan-in scale,
    residual writes further scaled by RESIDUAL_GAIN / sqrt(2 * layers)."""
    if name.endswith("norm.weight"):
        return torch.zeros(shape)
    if name.endswith("embed_tokens.weight"):
        std = 3.0 / math.sqrt(shape[-1])
    else:  # fan-in scaling keeps each sublayer O(1); residual writes share 1/sqrt(2L)
        std = shape[-1] ** -0.5
        if name.endswith(RESIDUAL_WRITES):
            std /= math.sqrt(2 * num_layers) / RESIDUAL_GAIN
    return torch.randn(shape, generator=gen) * std


class _SkipInit(TorchFunctionMode):
    """The modules' own initialisers (torch.nn.init) do nothing: on the meta device their values
    are discarded anyway, and nn.Embedding's `normal_` has no meta kernel, so torch runs its
    Python reference, whose first call imports torch._dynamo (a second of every worker's start
    on 2 cores)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]  # each initialiser's first argument
        return func(*args, **kwargs)


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """`build()`'s module on the meta device (shapes, no storage), its initialisers skipped."""
    with torch.device("meta"), _SkipInit():
        return build()


def empty_model(build: Callable[[], nn.Module], dtype: torch.dtype, device) -> nn.Module:
    """`build()`'s module allocated on `device` but unfilled, in eval mode. Built on the meta
    device first: that skips torch's default init of billions of weights. Each tensor is
    allocated by `torch.empty` from its shape, not by `Module.to_empty`: that one's
    `empty_like` of a meta tensor runs torch's Python reference, whose first call imports
    sympy (~0.4 s of every worker's start on 2 cores)."""
    model = on_meta(build).to(dtype=dtype)
    model._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device))
    return model.eval()


def random_model(
    build: Callable[[], nn.Module],
    weight: Callable[[str, tuple[int, ...]], torch.Tensor],
    dtype: torch.dtype,
    device,
) -> nn.Module:
    """`build()`'s module with every parameter set to `weight(name, shape)`."""
    model = empty_model(build, dtype, device)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(weight(name, tuple(param.shape)))
    return model

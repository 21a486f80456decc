"""The steps whose launches offline.py records: each kernel wrapper run on CPU tensors at
Qwen3.5-0.8B's shapes (the norms, rotary, argmax, the conv and every Gated DeltaNet kernel of
one prefill step of rows of 1, 5 and 64 tokens, and that step padded to a bucket on fixed
grids) and the SNAC codec's at 24 kHz's.

Needs the `triton` package; nothing here runs a kernel."""

from __future__ import annotations

from types import SimpleNamespace
from typing import NamedTuple

import torch

from engine.batch import GdnTables
from engine.kernels import (
    gdn_tables,
    triton_argmax,
    triton_gdn,
    triton_norms,
    triton_rope,
    triton_snac,
)
from engine.kernels.gdn_config import SPLIT_DEFAULT, SplitConfig


def _run_codec_wrappers(dtype: torch.dtype) -> None:
    windows = 2
    for channels, steps in ((1024, 16), (64, 8192)):
        x = torch.zeros(windows, channels, steps, dtype=dtype)
        triton_snac.snake(x, torch.ones(1, channels, 1, dtype=dtype))
        # engine.codec_kernels folded: a bias handed on from the residual units (fp32)
        triton_snac.snake(x, torch.ones(1, channels, 1, dtype=dtype), torch.zeros(channels))
        # engine.codec_sine approx: the hardware's sine
        triton_snac.snake(x, torch.ones(1, channels, 1, dtype=dtype), approx=True)
        # engine.codec_kernels folded_noise: a noise block's input, with a shift and without
        noise = torch.zeros(1, 1, steps, dtype=dtype)
        triton_snac.shift_scale(x, torch.zeros(channels), noise)
        triton_snac.shift_scale(x, None, noise)
    for channels, steps, dilations in ((512, 128, (1, 3, 9)), (64, 8192, (9,))):
        x = torch.zeros(windows, channels, steps, dtype=dtype)
        alpha = torch.ones(1, channels, 1, dtype=dtype)
        weight = torch.zeros(channels, 1, 7, dtype=dtype)
        bias = torch.zeros(channels, dtype=dtype)
        for dilation in dilations:
            triton_snac.residual_snake_conv(x, alpha, weight, bias, alpha, dilation)
            triton_snac.residual_snake_conv(
                x, alpha, weight, bias, alpha, dilation, torch.zeros(channels)
            )
            triton_snac.residual_snake_conv(
                x, alpha, weight, bias, alpha, dilation, torch.zeros(channels), approx=True
            )


class _GdnStep(NamedTuple):
    """One prefill step's Gated DeltaNet inputs at 0.8b's shapes (rows of 1, 5 and 64 tokens)."""

    meta: SimpleNamespace
    mixed: torch.Tensor  # the conv's input (and the kernels' qkv)
    conv: tuple[torch.Tensor, torch.Tensor]  # weight, state pool
    ab: torch.Tensor
    gates: tuple[torch.Tensor, torch.Tensor]  # A_log, dt_bias
    state: torch.Tensor

    @property
    def args(self) -> tuple:
        """The Gated DeltaNet wrappers' arguments up to the value dim."""
        return (self.mixed, self.ab, self.ab, *self.gates, self.state, self.meta, K_HEADS, DIM,
                DIM)  # fmt: skip


K_HEADS, V_HEADS, DIM, TOKENS = 16, 16, 128, 70  # 0.8b's Gated DeltaNet; the step's tokens
BUCKET, MAX_ROWS = 128, 256  # the padded step's bucket and the step inputs' row bound


def _gdn_step(dtype: torch.dtype) -> _GdnStep:
    rows = [1, 5, 64]
    meta = SimpleNamespace(
        num_rows=len(rows), num_new=rows, cu_seqlens=torch.tensor([0, 1, 6, 70], dtype=torch.int32),
        token_row=torch.zeros(TOKENS, dtype=torch.int32),
        cached=torch.zeros(3, dtype=torch.int32), state_slots=torch.zeros(3, dtype=torch.int32),
    )  # fmt: skip
    channels = 2 * K_HEADS * DIM + V_HEADS * DIM
    return _GdnStep(
        meta,
        torch.zeros(TOKENS, channels, dtype=dtype),
        (torch.zeros(channels, 4, dtype=dtype), torch.zeros(8, channels, 3, dtype=dtype)),
        torch.zeros(TOKENS, V_HEADS, dtype=dtype),
        (torch.zeros(V_HEADS), torch.zeros(V_HEADS)),
        torch.zeros(8, V_HEADS, DIM, DIM, dtype=torch.float32),
    )


def _staged_tables(chunk: int) -> GdnTables:
    """Tables as the step inputs stage them (their values do not matter to a compile)."""
    i32 = dict(dtype=torch.int32)
    chunks = gdn_tables.max_chunks(2048, MAX_ROWS, chunk)
    return GdnTables(
        torch.zeros(4, **i32), torch.zeros(chunks, **i32), torch.zeros(chunks, **i32),
        torch.zeros(MAX_ROWS + 1, **i32), MAX_ROWS, chunk,
    )  # fmt: skip


def _bucket_args(step: _GdnStep, padded: SimpleNamespace, dtype: torch.dtype) -> tuple:
    """The Gated DeltaNet wrappers' arguments for `step` padded to BUCKET tokens."""
    mixed = torch.zeros(BUCKET, step.mixed.shape[1], dtype=dtype)
    ab = torch.zeros(BUCKET, V_HEADS, dtype=dtype)
    return (mixed, ab, ab, *step.gates, step.state, padded, K_HEADS, DIM, DIM)


def _run_wrappers(dtype: torch.dtype) -> None:
    tokens, hidden, heads, head_dim = TOKENS, 1024, 8, 256
    x = torch.zeros(tokens, hidden, dtype=dtype)
    w = torch.zeros(hidden, dtype=torch.float32)
    triton_norms.rms_norm(x, w, 1e-6)
    triton_norms.rms_norm(x, w, 1e-6, residual=x.clone())
    q = torch.zeros(tokens, heads, head_dim, dtype=dtype)
    cos = torch.zeros(tokens, 32, dtype=torch.float32)
    triton_rope.head_norm_rope(q, torch.zeros(head_dim), cos, cos, 1e-6)
    heads_3b = torch.zeros(tokens, 3 * 24 * 128, dtype=dtype)[:, : 24 * 128]  # Llama's q view
    full = torch.zeros(tokens, 64, dtype=torch.float32)  # full rotary: head_dim / 2
    triton_rope.rope(heads_3b.view(tokens, 24, 128), full, full)
    core = torch.zeros(tokens, V_HEADS, DIM, dtype=dtype)
    triton_norms.gated_norm(core, torch.zeros(tokens, V_HEADS * DIM, dtype=dtype), w[:DIM], 1e-6)
    triton_norms.silu_mul(torch.zeros(tokens, 2 * 3584, dtype=dtype))
    query_gate = torch.zeros(tokens, heads, 2 * head_dim, dtype=dtype)  # gated attention's q
    triton_norms.sigmoid_gate(q.view(tokens, -1), query_gate[..., head_dim:])
    cache = torch.zeros(64, 16, 2, 256, dtype=dtype)
    kv = torch.zeros(tokens, 2, 256, dtype=dtype)
    triton_rope.store_kv(kv, kv, cache, cache, torch.zeros(tokens, dtype=torch.int64))
    slots = torch.zeros(tokens, dtype=torch.int64)  # a decode step's K/V stored with its rotary
    store = triton_rope.KvStore(kv, cache, cache, slots)
    triton_rope.qk_rope(q, kv, torch.zeros(head_dim), torch.zeros(head_dim), cos, cos, kv=store)
    triton_argmax.argmax(torch.zeros(64, 248_320, dtype=dtype))  # a decode graph's greedy choice
    step = _gdn_step(dtype)
    meta = step.meta
    triton_gdn.causal_conv(step.mixed, *step.conv, meta)
    decode = SimpleNamespace(**vars(meta), is_decode=True)  # one token a row: the fused conv
    triton_gdn.causal_conv(step.mixed[:3], *step.conv, decode)
    triton_gdn.gated_delta_recurrent(*step.args)
    for chunk in (16, 32, 64):
        triton_gdn.gated_delta_chunked(*step.args, chunk=chunk)
        triton_gdn.gated_delta_chunked_split(*step.args, split=SplitConfig(chunk=chunk))
    for kind in ("triton", "triton_split"):  # row 0 (1 token) recurrent, the rest from ROW0=1
        triton_gdn.gated_delta_prefill(kind, *step.args)
    triton_gdn.gated_delta_prefill("triton", *step.args, pipelined=True)  # engine.gdn_decode
    # the step padded to a bucket, its tables staged
    padded = SimpleNamespace(**vars(meta), gdn_tables=_staged_tables(SPLIT_DEFAULT.chunk))
    args = _bucket_args(step, padded, dtype)
    triton_gdn.causal_conv(args[0], *step.conv, padded)
    triton_gdn.gated_delta_fixed_grid(*args)

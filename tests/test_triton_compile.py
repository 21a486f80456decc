"""Every Triton kernel of the engine compiles for the H200 (sm_90), with the arguments its
wrapper passes at Qwen3.5-0.8B's shapes, in bf16 and fp32, without a GPU: the wrappers run on
CPU tensors with each kernel's launch recorded instead of run, and each recorded launch is
compiled down to a cubin by Triton's own compiler and ptxas.

Why: the interpreter (tests/test_triton_interpret.py) checks what a kernel computes, not
whether the compiler accepts it. A kernel it ran exactly was once refused by the H200's
compile ("constexpr cannot be reassigned" in an unrolled loop), which cost a device call.
Needs the `triton` package (skips where it is missing, as in CI)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.kernels import triton_gdn, triton_norms  # noqa: E402

_TYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64",
}  # fmt: skip


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **constexprs)` records."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.launches.append((self.kernel, args, constexprs))

        return launch


def _source(kernel, args, constexprs) -> ASTSource:
    """The ASTSource of one recorded launch: tensors become typed pointers, ints i32, floats
    fp32, keyword arguments constexprs."""
    names = [p.name for p in kernel.params]
    given = dict(zip(names, args, strict=False))
    signature = {}
    for name in names:
        value = given.get(name)
        if name in constexprs:
            signature[name] = "constexpr"
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise AssertionError(f"{kernel.fn.__name__}: no argument for {name}")
    return ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs))


def _record_launches(monkeypatch, dtype: torch.dtype) -> list:
    launches: list = []
    for module in (triton_norms, triton_gdn):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, triton.runtime.JITFunction):
                monkeypatch.setattr(module, name, _Recorder(value, launches))
    tokens, hidden, heads, head_dim = 70, 1024, 8, 256
    x = torch.zeros(tokens, hidden, dtype=dtype)
    w = torch.zeros(hidden, dtype=torch.float32)
    triton_norms.rms_norm(x, w, 1e-6)
    triton_norms.rms_norm(x, w, 1e-6, residual=x.clone())
    q = torch.zeros(tokens, heads, head_dim, dtype=dtype)
    cos = torch.zeros(tokens, 32, dtype=torch.float32)
    triton_norms.head_norm_rope(q, torch.zeros(head_dim), cos, cos, 1e-6)
    v_heads, k_heads, dim = 16, 16, 128
    core = torch.zeros(tokens, v_heads, dim, dtype=dtype)
    triton_norms.gated_norm(core, torch.zeros(tokens, v_heads * dim, dtype=dtype), w[:dim], 1e-6)
    triton_norms.silu_mul(torch.zeros(tokens, 2 * 3584, dtype=dtype))
    cache = torch.zeros(64, 16, 2, 256, dtype=dtype)
    kv = torch.zeros(tokens, 2, 256, dtype=dtype)
    triton_norms.store_kv(kv, kv, cache, cache, torch.zeros(tokens, dtype=torch.int64))
    rows = [1, 5, 64]
    cu = torch.tensor([0, 1, 6, 70], dtype=torch.int32)
    meta = SimpleNamespace(
        num_rows=len(rows), num_new=rows, cu_seqlens=cu,
        token_row=torch.zeros(tokens, dtype=torch.int32),
        cached=torch.zeros(3, dtype=torch.int32), state_slots=torch.zeros(3, dtype=torch.int32),
    )  # fmt: skip
    channels = 2 * k_heads * dim + v_heads * dim
    mixed = torch.zeros(tokens, channels, dtype=dtype)
    triton_gdn.causal_conv(mixed, torch.zeros(channels, 4, dtype=dtype),
                           torch.zeros(8, channels, 3, dtype=dtype), meta)  # fmt: skip
    ab = torch.zeros(tokens, v_heads, dtype=dtype)
    state = torch.zeros(8, v_heads, dim, dim, dtype=torch.float32)
    gates = (torch.zeros(v_heads), torch.zeros(v_heads))
    triton_gdn.gated_delta_recurrent(mixed, ab, ab, *gates, state, meta, k_heads, dim, dim)
    for chunk in (16, 32, 64):
        for kernel in (triton_gdn.gated_delta_chunked, triton_gdn.gated_delta_chunked_split):
            kernel(mixed, ab, ab, *gates, state, meta, k_heads, dim, dim, chunk=chunk)
    return launches


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_triton_kernel_compiles_for_sm90(monkeypatch, dtype):
    launches = _record_launches(monkeypatch, dtype)
    monkeypatch.undo()  # the kernels call helper @triton.jit functions by their global names
    compiled = set()
    for kernel, args, constexprs in launches:
        source = _source(kernel, args, constexprs)
        binary = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert binary.asm["cubin"], kernel.fn.__name__
        compiled.add(kernel.fn.__name__)
    wanted = {
        "_rms_norm_kernel", "_head_norm_rope_kernel", "_gated_norm_kernel", "_silu_mul_kernel",
        "_store_kv_kernel", "_conv_kernel", "_conv_state_kernel", "_gdn_recurrent_kernel",
        "_gdn_chunked_kernel", "_gdn_prepare_kernel", "_gdn_states_kernel", "_gdn_outputs_kernel",
    }  # fmt: skip
    assert compiled == wanted

"""The engine's Triton kernels compiled without a GPU: each wrapper runs on CPU tensors at
Qwen3.5-0.8B's shapes (the codec's at SNAC 24 kHz's) with its kernels' launches recorded
instead of run, and each recorded
launch is compiled for a CUDA target (sm_90, the H200) by Triton's compiler and ptxas.
Used by tests/test_triton_compile.py (does every kernel compile?),
scripts/kernel_registers.py (registers and spills of each, from `ptxas -v`) and
tests/test_gdn_capture.py (would one CUDA graph serve two steps? `recording` gives the grids).

Needs the `triton` package; nothing here runs a kernel."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from types import SimpleNamespace
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.batch import GdnTables
from engine.kernels import gdn_tables, triton_gdn, triton_norms, triton_snac

H200 = GPUTarget("cuda", 90, 32)
_TYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64",
}  # fmt: skip


# The parameters through which a kernel on a fixed grid reads its bounds from the device
# (None: a grid sized on the host).
FIXED_GRID_BOUNDS = ("ROWS", "ROW_RANGE", "CHUNKS")


class Launch(NamedTuple):
    kernel: triton.runtime.JITFunction
    args: tuple
    constexprs: dict
    grid: tuple

    @property
    def fixed_grid(self) -> bool:
        """A launch on a grid fixed per token bucket: a device bound given."""
        names = [p.name for p in self.kernel.params]
        bounds = (a for n, a in zip(names, self.args, strict=False) if n in FIXED_GRID_BOUNDS)
        return any(isinstance(a, torch.Tensor) for a in bounds)


class _Recorder:
    """Stands in for a @triton.jit kernel: `kernel[grid](*args, **constexprs)` records."""

    def __init__(self, kernel, launches: list):
        self.kernel, self.launches = kernel, launches

    def __getitem__(self, grid):
        def launch(*args, **constexprs):
            self.launches.append(Launch(self.kernel, args, constexprs, tuple(grid)))

        return launch


@contextlib.contextmanager
def recording(launches: list):
    """Every @triton.jit function of the kernel modules swapped for a recorder, and back."""
    swapped = []
    for module in (triton_norms, triton_gdn, triton_snac):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, triton.runtime.JITFunction):
                swapped.append((module, name, value))
                setattr(module, name, _Recorder(value, launches))
    try:
        yield
    finally:  # the kernels call helper @triton.jit functions by their global names
        for module, name, value in swapped:
            setattr(module, name, value)


def record_launches(dtype: torch.dtype) -> list[Launch]:
    """Every launch the wrappers make for one prefill step of 3 rows (1, 5 and 64 tokens) at
    0.8b's shapes, activations in `dtype`, each Gated DeltaNet kernel from row 0 and, as a
    mixed step's dispatch launches it, from row 1; and the conv and Gated DeltaNet of that
    step padded to a bucket of 128 tokens on fixed grids (`gated_delta_fixed_grid`); and the
    SNAC codec's at 24 kHz: a Snake on the first block's input and on the last's output, a
    residual unit of the first block at each dilation and one of the last."""
    launches: list = []
    with recording(launches):
        _run_wrappers(dtype)
        _run_codec_wrappers(dtype)
    return launches


def _run_codec_wrappers(dtype: torch.dtype) -> None:
    windows = 2
    for channels, steps in ((1024, 16), (64, 8192)):
        x = torch.zeros(windows, channels, steps, dtype=dtype)
        triton_snac.snake(x, torch.ones(1, channels, 1, dtype=dtype))
    for channels, steps, dilations in ((512, 128, (1, 3, 9)), (64, 8192, (9,))):
        x = torch.zeros(windows, channels, steps, dtype=dtype)
        alpha = torch.ones(1, channels, 1, dtype=dtype)
        weight = torch.zeros(channels, 1, 7, dtype=dtype)
        bias = torch.zeros(channels, dtype=dtype)
        for dilation in dilations:
            triton_snac.residual_snake_conv(x, alpha, weight, bias, alpha, dilation)


def _run_wrappers(dtype: torch.dtype) -> None:
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
    meta = SimpleNamespace(
        num_rows=len(rows), num_new=rows, cu_seqlens=torch.tensor([0, 1, 6, 70], dtype=torch.int32),
        token_row=torch.zeros(tokens, dtype=torch.int32),
        cached=torch.zeros(3, dtype=torch.int32), state_slots=torch.zeros(3, dtype=torch.int32),
    )  # fmt: skip
    channels = 2 * k_heads * dim + v_heads * dim
    mixed = torch.zeros(tokens, channels, dtype=dtype)
    conv = (torch.zeros(channels, 4, dtype=dtype), torch.zeros(8, channels, 3, dtype=dtype))
    triton_gdn.causal_conv(mixed, *conv, meta)
    decode = SimpleNamespace(**vars(meta), is_decode=True)  # one token a row: the fused conv
    triton_gdn.causal_conv(mixed[:3], *conv, decode)
    ab = torch.zeros(tokens, v_heads, dtype=dtype)
    state = torch.zeros(8, v_heads, dim, dim, dtype=torch.float32)
    gates = (torch.zeros(v_heads), torch.zeros(v_heads))
    triton_gdn.gated_delta_recurrent(mixed, ab, ab, *gates, state, meta, k_heads, dim, dim)
    for chunk in (16, 32, 64):
        for kernel in (triton_gdn.gated_delta_chunked, triton_gdn.gated_delta_chunked_split):
            kernel(mixed, ab, ab, *gates, state, meta, k_heads, dim, dim, chunk=chunk)
    for kind in ("triton", "triton_split"):  # row 0 (1 token) recurrent, the rest from ROW0=1
        triton_gdn.gated_delta_prefill(kind, mixed, ab, ab, *gates, state, meta, k_heads, dim, dim)
    bucket, max_rows = 128, 256  # the step padded to a bucket, its tables staged
    i32 = dict(dtype=torch.int32)
    chunks = gdn_tables.max_chunks(2048, max_rows)
    tables = GdnTables(
        torch.zeros(4, **i32), torch.zeros(chunks, **i32), torch.zeros(chunks, **i32),
        torch.zeros(max_rows + 1, **i32), max_rows, gdn_tables.CHUNK,
    )  # fmt: skip
    padded = SimpleNamespace(**vars(meta), gdn_tables=tables)
    mixed = torch.zeros(bucket, channels, dtype=dtype)
    triton_gdn.causal_conv(mixed, *conv, padded)
    ab = torch.zeros(bucket, v_heads, dtype=dtype)
    triton_gdn.gated_delta_fixed_grid(mixed, ab, ab, *gates, state, padded, k_heads, dim, dim)


def source(kernel, args, constexprs) -> ASTSource:
    """The ASTSource of one recorded launch: tensors become typed pointers, ints i32, floats
    fp32, keyword arguments and None constexprs, in the kernel's parameter order."""
    names = [p.name for p in kernel.params]
    given = dict(zip(names, args, strict=False))
    constexprs = {**constexprs, **{n: None for n, v in given.items() if v is None}}
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
            raise ValueError(f"{kernel.fn.__name__}: no argument for {name}")
    return ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs))


def compile_launch(kernel, args, constexprs, num_warps: int = 4):
    """The compiled kernel (its `asm` holds ptx and cubin) of one recorded launch."""
    return triton.compile(
        source(kernel, args, constexprs), target=H200, options={"num_warps": num_warps}
    )


def ptxas_report(compiled) -> str:
    """`ptxas -v`'s line on a compiled kernel's PTX: registers, stack, spill bytes."""
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(compiled.asm["ptx"])
        ptx.flush()
        done = subprocess.run(
            [ptxas, "-v", "--gpu-name", "sm_90a", ptx.name, "-o", os.devnull],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    lines = [line.split("ptxas info    :")[-1].strip() for line in done.stderr.splitlines()]
    return " | ".join(line for line in lines if "spill" in line or "registers" in line)

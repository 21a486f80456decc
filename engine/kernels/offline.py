"""The engine's Triton kernels compiled without a GPU: each wrapper runs on CPU tensors at
Qwen3.5-0.8B's shapes (the codec's at SNAC 24 kHz's: offline_steps.py) with its kernels'
launches recorded instead of run (here), and each recorded launch is compiled for a CUDA
target (sm_90, the H200) by Triton's compiler and ptxas (offline_compile.py).
Used by tests/test_triton_compile.py (does every kernel compile, and every launch
configuration of the split Gated DeltaNet kernel the benchmark's sweep tries, and the dense
GEMM at every real shape (`record_gemm_launches`)?),
scripts/kernel_registers.py (registers and spills of each, from `ptxas -v`) and
tests/test_gdn_capture.py (would one CUDA graph serve two steps? `recording` gives the grids).

Needs the `triton` package; nothing here runs a kernel."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import NamedTuple

import torch
import triton

from engine.kernels import (
    decode_config,
    triton_argmax,
    triton_decode,
    triton_gdn,
    triton_gdn_chunked,
    triton_gdn_conv,
    triton_gdn_recurrent,
    triton_gdn_split,
    triton_gdn_split_kernels,
    triton_gemm,
    triton_norms,
    triton_rope,
    triton_snac,
)
from engine.kernels.gdn_config import SplitConfig
from engine.kernels.offline_steps import (
    _bucket_args,
    _gdn_step,
    _run_codec_wrappers,
    _run_wrappers,
    _staged_tables,
)
from engine.kernels.triton_launch import BoundKernel

# The parameters through which a kernel on a fixed grid reads its bounds from the device
# (None: a grid sized on the host).
FIXED_GRID_BOUNDS = ("ROWS", "ROW_RANGE", "CHUNKS")
# Keyword arguments of a launch that are compile options, not the kernel's parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages")


class Launch(NamedTuple):
    kernel: triton.runtime.JITFunction
    args: tuple
    constexprs: dict
    grid: tuple
    options: dict  # the launch's num_warps / num_stages where it gave them

    @property
    def key(self) -> tuple:
        """What the launch's compile depends on: the kernel, its constexprs and options, and
        each argument's type (a None argument is a constexpr)."""
        types = tuple(
            str(a.dtype) if isinstance(a, torch.Tensor) else type(a).__name__ for a in self.args
        )
        return (self.kernel.fn.__name__, tuple(sorted(self.constexprs.items())),
                tuple(sorted(self.options.items())), types)  # fmt: skip

    @property
    def variant(self) -> tuple:
        """What Triton compiles this launch as, by its rule (triton/backends/compiler.py,
        `get_int_specialization`, `get_tensor_specialization`): `key`, and per argument it
        specialises, whether an int is divisible by 16 or a tensor's address is 16-byte
        aligned; an int past int32 is another type. Two launches of one variant share a
        compiled kernel; a new variant is a new compile."""
        marks = []
        params = [p for p in self.kernel.params if not p.is_constexpr]
        for param, arg in zip(params, self.args, strict=False):
            if isinstance(arg, bool) or arg is None or isinstance(arg, float):
                continue  # not specialised (bools and floats), or a constexpr (None)
            if isinstance(arg, int):
                wide = not -(2**31) <= arg < 2**31
                marks.append((param.name, wide, not param.do_not_specialize and arg % 16 == 0))
            elif isinstance(arg, torch.Tensor):
                aligned = not (param.do_not_specialize or param.do_not_specialize_on_alignment)
                marks.append((param.name, aligned and arg.data_ptr() % 16 == 0))
        return (*self.key, tuple(marks))

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
        def launch(*args, **keywords):
            options = {k: v for k, v in keywords.items() if k in LAUNCH_OPTIONS}
            constexprs = {k: v for k, v in keywords.items() if k not in LAUNCH_OPTIONS}
            self.launches.append(Launch(self.kernel, args, constexprs, tuple(grid), options))

        return launch


@contextlib.contextmanager
def recording(launches: list):
    """Every @triton.jit function of the kernel modules swapped for a recorder, and back: in
    each module that binds a kernel's name, since the wrappers launch it by that name."""
    swapped = []
    gdn = (triton_gdn_conv, triton_gdn_recurrent, triton_gdn_chunked, triton_gdn_split_kernels,
           triton_gdn_split)  # fmt: skip
    modules = (triton_norms, triton_rope, *gdn, triton_snac, triton_gemm, triton_argmax,
               triton_decode)  # fmt: skip
    for module in modules:
        for name in dir(module):
            value = getattr(module, name)
            kernel = value.kernel if isinstance(value, BoundKernel) else value
            if isinstance(kernel, triton.runtime.JITFunction):
                swapped.append((module, name, value))
                setattr(module, name, _Recorder(kernel, launches))
    try:
        yield
    finally:  # the kernels call helper @triton.jit functions by their global names
        for module, name, value in swapped:
            setattr(module, name, value)


def record_launches(dtype: torch.dtype) -> list[Launch]:
    """Every launch the wrappers make for one prefill step of 3 rows (1, 5 and 64 tokens) at
    0.8b's shapes (and the rotary alone at Llama 3b's heads), activations in `dtype`, each
    Gated DeltaNet kernel from row 0 and, as a mixed step's dispatch launches it, from row 1;
    and the conv and Gated DeltaNet of that step padded to a bucket of 128 tokens on fixed
    grids (`gated_delta_fixed_grid`); and the SNAC codec's at 24 kHz: a Snake on the first
    block's input and on the last's output, a residual unit of the first block at each
    dilation and one of the last; and the decode attention's (`record_decode_launches`)."""
    launches: list = []
    with recording(launches):
        _run_wrappers(dtype)
        _run_codec_wrappers(dtype)
    return launches + record_decode_launches(dtype)


def record_decode_launches(
    dtype: torch.dtype = torch.bfloat16, sweep: bool = False
) -> list[Launch]:
    """The decode attention's launches (`triton_decode.paged_decode`) at each shape of
    decode_config.SHAPES for 64 rows of one page, in one split and in four (the merge too),
    under the head dim's default launch or, with `sweep`, every launch the benchmark's sweep
    tries (`decode_config.launch_sweep`)."""
    launches: list = []
    i32 = {"dtype": torch.int32}
    rows = 64
    with recording(launches):
        for q_heads, kv_heads, head_dim in decode_config.SHAPES.values():
            q = torch.zeros(rows, q_heads, head_dim, dtype=dtype)
            cache = torch.zeros(rows + 1, 16, kv_heads, head_dim, dtype=dtype)
            layout = (torch.arange(rows, **i32), torch.arange(rows + 1, **i32),
                      torch.ones(rows, **i32))  # fmt: skip
            default = [decode_config.launch_for(head_dim)]
            for launch in decode_config.launch_sweep(head_dim) if sweep else default:
                for splits in (1, 4):
                    triton_decode.paged_decode(
                        q, cache, cache, *layout, head_dim**-0.5, splits=splits, launch=launch
                    )
    return launches


# The rows the skinny GEMM takes: a lone decode row, 16, 64 (the decode step measured), its bound.
GEMM_ROWS = (1, 16, 64, triton_gemm.MAX_ROWS)


def record_gemm_launches(dtype: torch.dtype = torch.bfloat16) -> list[Launch]:
    """The skinny GEMM's launches at every shape of triton_gemm.SHAPES for every row count of
    GEMM_ROWS, as `skinny_linear` plans them, and as `engine.dense_epilogues` runs them: the
    MLP's gate|up with SiLU-mul fused, the output projections' partials summed by the norm,
    Gated DeltaNet's in-projection with a decode step's conv.
    The weight is one row broadcast ([N, K], stride 0 along N: nothing of an LM head's 500 MB
    allocated); its compile is the same (a stride of 0 divides by 16 as 1024 does)."""
    launches: list = []
    with recording(launches):
        for shapes in triton_gemm.SHAPES.values():
            for name, (n, k) in shapes.items():
                weight = torch.zeros(1, k, dtype=dtype).expand(n, k)
                for m in GEMM_ROWS:
                    x = torch.zeros(m, k, dtype=dtype)
                    triton_gemm.skinny_linear(x, weight)
                    if name == "mlp_gate_up":
                        triton_gemm.skinny_linear(x, weight, silu_mul=True)
                    elif name == "gdn_in_proj" and triton_gemm.fuses_conv(m, n, k):
                        triton_gemm.skinny_linear(x, weight, conv=_in_proj_conv(m, dtype))
                    elif name in ("out_proj", "o_proj"):
                        product = triton_gemm.skinny_linear(x, weight, partials=True)
                        norm = torch.zeros(n, dtype=torch.float32)
                        triton_norms.rms_norm(product, norm, 1e-6, torch.zeros(m, n, dtype=dtype))
                        if shapes is triton_gemm.SHAPES["0.8b"]:  # Gated DeltaNet, gated attn
                            for prologue in _prologues(x, n):
                                triton_gemm.skinny_linear(x, weight, partials=True,
                                                          prologue=prologue)  # fmt: skip
    return launches


def _prologues(x: torch.Tensor, n: int) -> list:
    """What 0.8b's output projections (both n x 2048) read x through with
    `engine.dense_epilogues`, where `fuses_prologue`: Gated DeltaNet's out_proj the gated norm
    (16 heads of 128), gated attention's o_proj the sigmoid gate (8 heads of 256, a view of
    the packed q). Orpheus's attention has no gate, its model no Gated DeltaNet."""
    m, k = x.shape
    prologues = []
    if triton_gemm.fuses_prologue(m, n, k, 128, True):
        z = torch.zeros(m, 3 * k, dtype=x.dtype)[:, k : 2 * k]  # a view of the in-projection
        prologues.append(triton_gemm.GatedNorm(z, torch.ones(128), 1e-6))
    if triton_gemm.fuses_prologue(m, n, k, 256, False):
        prologues.append(triton_gemm.SigmoidGate(torch.zeros(m, 8, 512, dtype=x.dtype)[..., 256:]))
    return prologues


def _in_proj_conv(rows: int, dtype: torch.dtype):
    """0.8b's decode conv as the in-projection's epilogue takes it (6144 channels, 4 taps)."""
    channels = 6144
    return triton_gemm.ConvEpilogue(
        torch.zeros(channels, 4, dtype=dtype), torch.zeros(rows + 2, channels, 3, dtype=dtype),
        torch.arange(rows, dtype=torch.int32), torch.ones(rows, dtype=torch.int32), channels,
    )  # fmt: skip


def record_split_launches(
    split: SplitConfig, dtype: torch.dtype = torch.bfloat16, eager: bool = True
) -> list[Launch]:
    """The split Gated DeltaNet kernel's launches as `split` configures them, for the step of
    `record_launches` at 0.8b's shapes: padded to a bucket of 128 tokens on fixed grids (its
    tables staged in `split`'s chunks), and with `eager` also on grids sized from the rows."""
    launches: list = []
    step = _gdn_step(dtype)
    with recording(launches):
        if eager:
            triton_gdn.gated_delta_chunked_split(*step.args, split=split)
        padded = SimpleNamespace(**vars(step.meta), gdn_tables=_staged_tables(split.chunk))
        args = _bucket_args(step, padded, dtype)
        triton_gdn.gated_delta_fixed_grid(*args, split=split)
    return launches

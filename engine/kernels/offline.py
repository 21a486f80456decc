"""The engine's Triton kernels compiled without a GPU: each wrapper runs on CPU tensors at
Qwen3.5-0.8B's shapes (the codec's at SNAC 24 kHz's) with its kernels' launches recorded
instead of run, and each recorded
launch is compiled for a CUDA target (sm_90, the H200) by Triton's compiler and ptxas.
Used by tests/test_triton_compile.py (does every kernel compile, and every launch
configuration of the split Gated DeltaNet kernel the benchmark's sweep tries, and the dense
GEMM at every real shape (`record_gemm_launches`)?),
scripts/kernel_registers.py (registers and spills of each, from `ptxas -v`) and
tests/test_gdn_capture.py (would one CUDA graph serve two steps? `recording` gives the grids).

Needs the `triton` package; nothing here runs a kernel."""

from __future__ import annotations

import contextlib
import inspect
import multiprocessing
import os
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from types import SimpleNamespace
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.batch import GdnTables
from engine.kernels import (
    decode_config,
    gdn_tables,
    triton_argmax,
    triton_decode,
    triton_gdn,
    triton_gemm,
    triton_norms,
    triton_snac,
)
from engine.kernels.gdn_config import SPLIT_DEFAULT, SplitConfig
from engine.kernels.triton_launch import BoundKernel

H200 = GPUTarget("cuda", 90, 32)
H200_SHARED_BYTES = 232_448  # the most shared memory a block may have on sm_90 (227 KiB)
_TYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64",
}  # fmt: skip


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
    """Every @triton.jit function of the kernel modules swapped for a recorder, and back."""
    swapped = []
    modules = (triton_norms, triton_gdn, triton_snac, triton_gemm, triton_argmax, triton_decode)
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
    GEMM_ROWS, as `skinny_linear` plans them. The weight is one row broadcast ([N, K], stride 0
    along N: nothing of an LM head's 500 MB allocated); its compile is the same (a stride of 0
    divides by 16 as 1024 does)."""
    launches: list = []
    with recording(launches):
        for shapes in triton_gemm.SHAPES.values():
            for n, k in shapes.values():
                weight = torch.zeros(1, k, dtype=dtype).expand(n, k)
                for m in GEMM_ROWS:
                    triton_gemm.skinny_linear(torch.zeros(m, k, dtype=dtype), weight)
    return launches


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
    triton_norms.head_norm_rope(q, torch.zeros(head_dim), cos, cos, 1e-6)
    heads_3b = torch.zeros(tokens, 3 * 24 * 128, dtype=dtype)[:, : 24 * 128]  # Llama's q view
    full = torch.zeros(tokens, 64, dtype=torch.float32)  # full rotary: head_dim / 2
    triton_norms.rope(heads_3b.view(tokens, 24, 128), full, full)
    core = torch.zeros(tokens, V_HEADS, DIM, dtype=dtype)
    triton_norms.gated_norm(core, torch.zeros(tokens, V_HEADS * DIM, dtype=dtype), w[:DIM], 1e-6)
    triton_norms.silu_mul(torch.zeros(tokens, 2 * 3584, dtype=dtype))
    cache = torch.zeros(64, 16, 2, 256, dtype=dtype)
    kv = torch.zeros(tokens, 2, 256, dtype=dtype)
    triton_norms.store_kv(kv, kv, cache, cache, torch.zeros(tokens, dtype=torch.int64))
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


def source(kernel, args, constexprs, attrs: dict | None = None) -> ASTSource:
    """The ASTSource of one recorded launch: tensors become typed pointers, ints i32, floats
    fp32, keyword arguments and None constexprs, in the kernel's parameter order; `attrs` the
    specialisation hints (`specialisation`), none by default."""
    names = [p.name for p in kernel.params]
    given = dict(zip(names, args, strict=False))
    constexprs = {**constexprs, **{n: None for n, v in given.items() if v is None}}
    for param in kernel.params:  # a constexpr left to its default (`PDL`, `LINES`)
        if param.name not in given and param.name not in constexprs:
            if param.default is not inspect.Parameter.empty:
                constexprs[param.name] = param.default
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
    return ASTSource(fn=kernel, signature=signature, constexprs=dict(constexprs), attrs=attrs)


def specialisation(launch: Launch) -> dict:
    """The divisibility hints the JIT gives a launch on the GPU (`Launch.variant`'s marks): a
    16-byte aligned tensor, an int divisible by 16. Without them the compiler cannot prove a
    vector load aligned: its loads go scalar and its loops unpipelined (the skinny GEMM: 255
    registers and spills, no cp.async, against 80 registers and 4 stages with them)."""
    index = {p.name: i for i, p in enumerate(launch.kernel.params)}
    marks = launch.variant[-1]
    return {(index[mark[0]],): [["tt.divisibility", 16]] for mark in marks if mark[-1]}


def compile_launch(launch: Launch, num_warps: int | None = None, specialise: bool = False):
    """The compiled kernel (its `asm` holds ptx and cubin; `metadata.shared` its shared memory)
    of one recorded launch, with the launch's options (`num_warps` given here overrides);
    `specialise`: with the JIT's divisibility hints, as the GPU compiles it (`specialisation`)."""
    options = {**launch.options} | ({"num_warps": num_warps} if num_warps else {})
    attrs = specialisation(launch) if specialise else None
    return triton.compile(
        source(launch.kernel, launch.args, launch.constexprs, attrs), target=H200, options=options
    )


class SplitCompile(NamedTuple):
    """One compiled launch of the split kernel under a config."""

    split: SplitConfig
    kernel: str
    shared: int  # bytes of shared memory a block takes
    cubin: bool  # a cubin came out


def compile_split_configs(
    configs: list[SplitConfig], workers: int | None = None
) -> list[SplitCompile]:
    """Every distinct launch of the split kernel's captured form (`record_split_launches`,
    `eager=False`) under `configs`, compiled for sm_90 in `workers` processes (default: one
    a core); a launch two configs share is compiled once, under the first."""
    jobs, seen = [], set()
    for split in configs:
        for index, launch in enumerate(record_split_launches(split, eager=False)):
            if launch.key not in seen:
                seen.add(launch.key)
                jobs.append((split, index))
    context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
    with ProcessPoolExecutor(workers or os.cpu_count(), mp_context=context) as pool:
        return list(pool.map(_compile_split_job, jobs))


def _compile_split_job(job: tuple[SplitConfig, int]) -> SplitCompile:
    split, index = job
    launch = record_split_launches(split, eager=False)[index]
    binary = compile_launch(launch)
    return SplitCompile(split, launch.kernel.fn.__name__, binary.metadata.shared,
                        bool(binary.asm["cubin"]))  # fmt: skip


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

"""A recorded launch (offline.py) compiled for a CUDA target without a GPU: sm_90, the H200,
by Triton's compiler (`compile_launch`, with or without the JIT's divisibility hints), every
distinct launch of the split Gated DeltaNet kernel under a set of configs in parallel
(`compile_split_configs`), and `ptxas -v`'s registers and spills of a compiled kernel.

Needs the `triton` package; nothing here runs a kernel."""

from __future__ import annotations

import inspect
import multiprocessing
import os
import subprocess
import tempfile
from concurrent.futures import ProcessPoolExecutor
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.kernels.gdn_config import SplitConfig
from engine.kernels.offline import Launch, record_split_launches

H200 = GPUTarget("cuda", 90, 32)
H200_SHARED_BYTES = 232_448  # the most shared memory a block may have on sm_90 (227 KiB)
_TYPES = {
    torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
    torch.int32: "i32", torch.int64: "i64",
}  # fmt: skip


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

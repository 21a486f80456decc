"""What one kernel launch costs the host: the figure behind the eager step's time.

An eager decode step of 0.8b at batch 64 keeps the GPU busy ~2.2 ms of a ~17 ms step
(docs/BENCHMARKS.md): the rest is the host issuing ~240 launches (97 cuBLAS GEMMs, ~145 Triton
kernels) and the model's Python around them. This measures the host's cost of each kind of
launch alone, at the decode step's shapes, so that time can be divided among them:

- `torch add`: one small elementwise torch op (the floor of torch's dispatcher);
- `torch mm`: a cuBLAS GEMM, 64 x 1024 by 1024 x 8224 (Gated DeltaNet's input projection);
- `triton jit`: our RMS norm kernel through Triton's JIT launcher (`kernel[grid](...)`: binding
  and specialising the arguments, the cache lookup, then the C launcher);
- `triton bound`: the same compiled kernel through its bound runner (the C launcher alone);
- `triton kept`: the same `kernel[grid](...)` with `engine.triton_launch: bound`
  (engine/kernels/triton_launch.py: the compiled kernel kept per call signature, its runner
  called directly);
- `rms_norm`, `silu_mul`: our wrappers as the model calls them (outputs allocated, then the JIT
  launch), and `rms_norm kept`, `silu_mul kept` with the kept kernels.

    python -m benchmarks.bench_launch [--calls 200] [--samples 30]

Each sample times `--calls` back-to-back calls on the host (perf_counter) and then waits for
the GPU; the GPU's work per call is a few microseconds, so the host is the bound and the
figure is host time per call. Needs CUDA and Triton.

    python -m benchmarks.bench_launch --host-only [--calls 200] [--samples 30]

times the kept path's own Python on any machine, without CUDA or Triton: the same
`kernel[grid](...)` through `bound` over a stand-in kernel whose compiled kernel's runner does
nothing, against a direct call of that runner with every parameter by position, at RMS norm's
arguments (10 positional, 2 keywords) and at a Gated DeltaNet prepare launch's (19 positional,
5 keywords, 2 launch options). The difference of the two is what the kept path adds to the
C launcher's own time.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Callable
from types import SimpleNamespace

import torch

from benchmarks import stats
from benchmarks.options import positive_int


def _per_call_us(
    call, calls: int, samples: int, wait: Callable[[], None] = torch.cuda.synchronize
) -> stats.Summary:
    for _ in range(3):  # warm: compiles, allocator pools
        call()
    wait()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
        wait()
    return stats.summarise(times)


class _StandInCompiled:
    """A Triton 3.6 CompiledKernel's launch surface: `[grid]` checks its handles and returns a
    runner closure (as Triton's does), whose call does nothing."""

    packed_metadata = b""

    def _init_handles(self) -> None:
        pass

    def __getitem__(self, grid):
        self._init_handles()

        def runner(*args, stream=None):
            pass

        return runner


class StandInKernel:
    """A @triton.jit kernel's surface: `params` and `kernel[grid](...)`, which counts its
    launches and returns the one compiled kernel."""

    def __init__(self, names: list[str]):
        self.params = [SimpleNamespace(name=n, default=inspect.Parameter.empty) for n in names]
        self.compiled = _StandInCompiled()
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            return self.compiled

        return launch


def _host_launches() -> dict[str, tuple[list[str], tuple, dict]]:
    """Per launch: the kernel's parameters, the positional arguments and the keywords, as the
    model passes them, at 64 rows."""
    x = torch.zeros(64, 1024, dtype=torch.bfloat16)
    weight = torch.ones(1024)
    rms_norm = (
        ["X", "R", "OUT", "RES_OUT", "W", "stride_x", "stride_r", "stride_out", "N", "eps",
         "HAS_RES", "BLOCK"],
        (x, x, x, x, weight, 1024, 1024, 1024, 1024, 1e-6),
        {"HAS_RES": False, "BLOCK": 1024},
    )  # fmt: skip
    qkv, gates, rows = (
        torch.zeros(64, 6144, dtype=torch.bfloat16),
        torch.zeros(64, 16),
        torch.zeros(65, dtype=torch.int32),
    )
    scratch = torch.zeros(64, 16, 128)
    gdn_prepare = (
        ["QKV", "A", "B", "A_LOG", "DT_BIAS", "CHUNK_ROW", "CHUNK_START", "CU", "W", "U", "KD",
         "G", "SCORES", "CHUNKS", "stride_t", "stride_ab", "HK", "HV", "scale", "DK", "DV", "C",
         "LEVELS", "PERSISTENT"],
        (qkv, gates, gates, gates[0], gates[0], rows, rows, rows, scratch, scratch, scratch,
         gates, None, rows[:1], 6144, 16, 16, 16, None),
        {"DK": 128, "DV": 128, "C": 64, "LEVELS": 6, "PERSISTENT": False, "num_warps": 4,
         "num_stages": 2},
    )  # fmt: skip
    return {"rms_norm": rms_norm, "gdn prepare": gdn_prepare}


def _no_wait() -> None:
    pass


def measure_kept_python(
    kernel: StandInKernel, args: tuple, kwargs: dict, calls: int, samples: int
) -> tuple[stats.Summary, stats.Summary]:
    """Host time per call of the stand-in's runner called directly, every parameter by
    position, and of the same launch through `bound` (`engine.triton_launch: bound`)."""
    from engine.kernels import triton_launch

    runner = kernel.compiled[(64, 1, 1)]
    values = (*args, *(kwargs[p.name] for p in kernel.params[len(args) :]))
    kernel = triton_launch.bound(kernel)
    direct = _per_call_us(lambda: runner(*values), calls, samples, _no_wait)
    triton_launch.set_launch("bound")
    try:
        kept = _per_call_us(lambda: kernel[(64,)](*args, **kwargs), calls, samples, _no_wait)
    finally:
        triton_launch.set_launch("jit")
    return direct, kept


def host_only(calls: int, samples: int) -> None:
    print(f"host time per call (no GPU), {calls} calls a sample, {samples} samples")
    for name, (params, args, kwargs) in _host_launches().items():
        direct, kept = measure_kept_python(StandInKernel(params), args, kwargs, calls, samples)
        print(f"  {name + ' runner':<20} {stats.render(direct, 'us')}")
        print(f"  {name + ' kept':<20} {stats.render(kept, 'us')}")
        print(f"  {name + ' kept Python':<20} {kept.median - direct.median:.3f} us (medians)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_launch")
    parser.add_argument("--calls", type=positive_int, default=200, help="launches per sample")
    parser.add_argument("--samples", type=positive_int, default=30)
    parser.add_argument(
        "--host-only",
        action="store_true",
        help="time the kept path's Python over a stand-in kernel (no CUDA, no Triton)",
    )
    args = parser.parse_args(argv)
    if args.host_only:
        host_only(args.calls, args.samples)
        return
    if not torch.cuda.is_available():
        parser.error("needs CUDA")
    import triton

    from engine.kernels import triton_launch, triton_norms

    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(64, 1024, device=dev, dtype=bf16)
    out = torch.empty_like(x)
    weight = torch.ones(1024, device=dev, dtype=torch.float32)
    w_in = torch.randn(8224, 1024, device=dev, dtype=bf16)
    gate_up = torch.randn(64, 7168, device=dev, dtype=bf16)
    block = triton.next_power_of_2(1024)

    def jit():
        return triton_norms._rms_norm_kernel[(64,)](
            x, x, out, x, weight, 1024, 1024, 1024, 1024, 1e-6, HAS_RES=False, BLOCK=block
        )

    runner = jit()[(64, 1, 1)]  # the compiled kernel's runner: every argument by position,
    # constexprs included (Triton's C launcher takes and ignores them)
    calls = {
        "torch add": lambda: torch.add(x, x, out=out),
        "torch mm": lambda: torch.mm(x, w_in.t()),
        "triton jit": jit,
        "triton bound": lambda: runner(
            x, x, out, x, weight, 1024, 1024, 1024, 1024, 1e-6, False, block
        ),
        "triton kept": jit,
        "rms_norm": lambda: triton_norms.rms_norm(x, weight, 1e-6),
        "silu_mul": lambda: triton_norms.silu_mul(gate_up),
        "rms_norm kept": lambda: triton_norms.rms_norm(x, weight, 1e-6),
        "silu_mul kept": lambda: triton_norms.silu_mul(gate_up),
    }
    print(f"host time per call, {args.calls} calls a sample, {args.samples} samples")
    for name, call in calls.items():
        triton_launch.set_launch("bound" if name.endswith("kept") else "jit")
        summary = _per_call_us(call, args.calls, args.samples)
        print(f"  {name:<13} {stats.render(summary, 'us')}")


if __name__ == "__main__":
    main()

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
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks import stats
from benchmarks.options import positive_int


def _per_call_us(call, calls: int, samples: int) -> stats.Summary:
    for _ in range(3):  # warm: compiles, allocator pools
        call()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        times.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return stats.summarise(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_launch")
    parser.add_argument("--calls", type=positive_int, default=200, help="launches per sample")
    parser.add_argument("--samples", type=positive_int, default=30)
    args = parser.parse_args(argv)
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

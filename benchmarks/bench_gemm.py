"""The dense GEMMs of a decode step alone: torch's (cuBLAS) against ours for few rows
(engine/kernels/triton_gemm.py, `engine.dense_kernel: triton`), at each real shape
(triton_gemm.SHAPES: 0.8b's and Orpheus 3b's) and rows 1, 16, 32, 64 and 128.

    python -m benchmarks.bench_gemm
    python -m benchmarks.bench_gemm --model 0.8b --rows 64 --split 1 --json gemm.jsonl

Each call is captured in a CUDA graph (as the decode graphs run it: no host launch cost in
the figure) and timed by CUDA events around its replay, after a 256 MB write that evicts the
weight from the 50 MB L2 (a decode step streams each weight once: a warm L2 would flatter the
smaller GEMMs). GB/s is the weight's bytes over the median time: the H200's HBM gives ~4.8 TB/s
at best. `--split` forces our kernel's K split (its plan's otherwise).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from functools import partial

import torch

from benchmarks import stats
from benchmarks.options import append_json_lines, positive_int


@dataclass(frozen=True)
class GemmTiming:
    model: str
    gemm: str
    n: int
    k: int
    rows: int
    kernel: str  # "torch" or "triton"
    split: int  # our kernel's K split (1 for torch)
    times_us: list[float]


def _timed(call, repeats: int, flush: torch.Tensor) -> list[float]:
    """`call` captured in a CUDA graph, each replay timed by events after an L2 flush (us)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile and warm up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    pairs = []
    for _ in range(repeats):
        flush.zero_()  # ~100 us of GPU work queued ahead: the replay starts right after it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return [start.elapsed_time(end) * 1e3 for start, end in pairs]


def measure(models, rows_list, repeats: int, split: int | None) -> list[GemmTiming]:
    from engine.kernels import triton_gemm  # imports triton: here, not at import (asv's
    # discovery imports every module of benchmarks/ on machines without it)

    flush = torch.empty(256 * 2**20 // 4, dtype=torch.float32, device="cuda")
    timings = []
    for model in models:
        for gemm, (n, k) in triton_gemm.SHAPES[model].items():
            weight = (torch.randn(n, k, device="cuda") / k**0.5).bfloat16()
            for rows in rows_list:
                x = torch.randn(rows, k, device="cuda").bfloat16()
                arms = {
                    "torch": (torch.nn.functional.linear, 1),
                    "triton": (triton_gemm.skinny_linear, triton_gemm.plan(rows, n, k).split),
                }
                if split is not None:
                    arms["triton"] = (
                        lambda x, w: triton_gemm.skinny_linear(x, w, split=split),
                        triton_gemm.plan(rows, n, k, split).split,
                    )
                for kernel, (gemm_fn, splits) in arms.items():
                    times = _timed(partial(gemm_fn, x, weight), repeats, flush)
                    timing = GemmTiming(model, gemm, n, k, rows, kernel, splits, times)
                    timings.append(timing)
                    print(render(timing), flush=True)
    return timings


def render(timing: GemmTiming) -> str:
    summary = stats.summarise(timing.times_us)
    gbs = 2 * timing.n * timing.k / (summary.median * 1e-6) / 1e9
    return (
        f"{timing.model} {timing.gemm:<12} {timing.n:>6} x {timing.k:<5} M={timing.rows:<3} "
        f"{timing.kernel:<6} split {timing.split}: {stats.render(summary, 'us')} "
        f"= {gbs:,.0f} GB/s of weight"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, read without triton (a bad count is refused on any machine)."""
    parser = argparse.ArgumentParser(prog="benchmarks.bench_gemm")
    parser.add_argument("--model", nargs="*", default=None, help="default: triton_gemm.SHAPES'")
    parser.add_argument("--rows", type=positive_int, nargs="*", default=[1, 16, 32, 64, 128])
    parser.add_argument("--repeats", type=positive_int, default=50)
    parser.add_argument("--split", type=positive_int, default=None, help="force our K split")
    parser.add_argument("--json", default=None, help="append one JSON line a timing here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from engine.kernels import triton_gemm

    models = list(triton_gemm.SHAPES) if args.model is None else args.model
    timings = measure(models, args.rows, args.repeats, args.split)
    if args.json:
        append_json_lines(args.json, timings)


if __name__ == "__main__":
    main()

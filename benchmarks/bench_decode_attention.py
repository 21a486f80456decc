"""A decode step's attention alone, one layer call: FlashInfer's decode on CUDA cores and on
tensor cores, planned as the engine's decode graphs plan it (`use_cuda_graph` wrappers of the
rows' bucket), against our Triton kernel (engine/kernels/triton_decode.py,
`engine.decode_attention: triton`), at 0.8b's heads (8 over 2, head dim 256) and Orpheus 3b's
(24 over 8, 128), rows 1, 16, 64 and 128, contexts of 256, 512 and 2048 tokens.

    python -m benchmarks.bench_decode_attention
    python -m benchmarks.bench_decode_attention --model 3b --rows 64 --contexts 256 --sweep
    python -m benchmarks.bench_decode_attention --json decode.jsonl --profile decode.txt

The three arms run through the engine's own FlashInferAttention (`plan` once for the step,
`run` a layer). `--sweep` adds our kernel with each split count (1 to 16) and each launch of
`decode_config.launch_sweep` (tile, warps, stages moved one at a time), through
`paged_decode` directly.

Timing, as the decode graphs see a layer: `--calls` calls captured in one CUDA graph (no host
launch cost), each after a 128 MB write that evicts the cache from the 50 MB L2 (in a decode
step the layers between two attention calls stream their weights through it); a graph of the
writes alone is replayed beside it, and a call's time is the pair's difference over the calls,
timed by CUDA events, `--repeats` pairs. GB/s: the K/V bytes the step reads (rows x context x
kv_heads x head_dim x 2 bytes x 2) over the median time; the H200's HBM gives ~4.8 TB/s at
best. `err`: the largest difference from FlashInfer's CUDA-core output (a fast wrong arm shows
itself). Rows have the context's length each, their pages scattered over the pool.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from types import SimpleNamespace

import torch

from benchmarks import stats
from benchmarks.options import append_json_lines, positive_int
from engine.kernels.decode_config import SHAPES, DecodeLaunch, decode_splits, launch_sweep

PAGE = 16
FLUSH_BYTES = 128 << 20
SWEEP_SPLITS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class DecodeTiming:
    model: str
    rows: int
    context: int
    arm: str  # "flashinfer-cuda-cores", "flashinfer-tensor-cores", "triton", "triton <option>"
    splits: int | None  # our kernel's split count (None: FlashInfer's)
    kv_bytes: int  # what the step's K/V reads take
    times_us: list[float]  # a call's time, one per repeat
    max_err: float  # the largest difference from FlashInfer's CUDA-core output


def kv_bytes(rows: int, context: int, kv_heads: int, head_dim: int, itemsize: int = 2) -> int:
    """The bytes of K and V a decode step over `rows` rows of `context` tokens reads."""
    return 2 * rows * context * kv_heads * head_dim * itemsize


def gb_per_s(timing: DecodeTiming) -> float:
    return timing.kv_bytes / (stats.summarise(timing.times_us).median * 1e-6) / 1e9


def render(timing: DecodeTiming) -> str:
    """One timing as a line."""
    summary = stats.summarise(timing.times_us)
    splits = "" if timing.splits is None else f" ({timing.splits} splits)"
    return (
        f"{timing.model} {timing.rows:>3} rows x {timing.context:<4} {timing.arm}{splits}: "
        f"{stats.render(summary, 'us')} = {gb_per_s(timing):,.0f} GB/s, err {timing.max_err:.2e}"
    )


def table(timings: list[DecodeTiming]) -> str:
    """Us a call and GB/s, a line per (model, rows, context) and a column per arm."""
    arms = list(dict.fromkeys(t.arm for t in timings))
    cells: dict[tuple, dict[str, str]] = {}
    for t in timings:
        median = stats.summarise(t.times_us).median
        cells.setdefault((t.model, t.rows, t.context), {})[t.arm] = (
            f"{median:.1f} us {gb_per_s(t):,.0f} GB/s"
        )
    width = max(len(arm) for arm in arms) + 2
    lines = ["model rows context " + "".join(f"{arm:>{width}}" for arm in arms)]
    for (model, rows, context), row in cells.items():
        values = "".join(f"{row.get(arm, '-'):>{width}}" for arm in arms)
        lines.append(f"{model:<5} {rows:>4} {context:>7} {values}")
    return "\n".join(lines)


def _timed(call: Callable, calls: int, repeats: int, flush: torch.Tensor) -> list[float]:
    """`calls` calls, each after an L2-evicting write, in one CUDA graph, less a graph of the
    writes alone: a call's time (us), one per repeat."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile and warm up off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graphs = {"both": torch.cuda.CUDAGraph(), "flush": torch.cuda.CUDAGraph()}
    for name, graph in graphs.items():
        with torch.cuda.graph(graph):
            for _ in range(calls):
                flush.zero_()
                if name == "both":
                    call()
    pairs = []
    for _ in range(repeats):
        events = []
        for graph in graphs.values():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            events.append((start, end))
        pairs.append(events)
    torch.cuda.synchronize()
    return [
        (both[0].elapsed_time(both[1]) - alone[0].elapsed_time(alone[1])) * 1e3 / calls
        for both, alone in pairs
    ]


def _step(rows: int, context: int, kv_heads: int, head_dim: int, gen: torch.Generator):
    """A decode step of `rows` rows of `context` tokens on scattered pages: the batch fields
    FlashInferAttention.plan reads, and the caches."""
    per_row = -(-context // PAGE)
    pages = rows * per_row + 1
    order = torch.randperm(pages - 1, generator=gen).to(torch.int32)
    indptr = torch.arange(0, rows * per_row + 1, per_row, dtype=torch.int32)
    last = torch.full((rows,), context - (per_row - 1) * PAGE, dtype=torch.int32)
    shape = (pages, PAGE, kv_heads, head_dim)
    k_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    batch = SimpleNamespace(
        is_decode=True, num_rows=rows, kv_indices=order.cuda(), kv_indptr=indptr.cuda(),
        kv_last_page_len=last.cuda(), host=SimpleNamespace(kv_indptr=indptr, kv_last_page_len=last),
    )  # fmt: skip
    return batch, k_cache, v_cache, per_row


def _arms(model: str, rows: int, batch, per_row: int, sweep: bool) -> dict[str, tuple]:
    """Each arm's layer call and our kernel's split count: the engine's attention (FlashInfer
    CUDA cores, tensor cores, our kernel at its defaults), then the sweep's variants."""
    from engine.kernels import triton_decode
    from engine.kernels.flashinfer_attention import FlashInferAttention

    q_heads, kv_heads, head_dim = SHAPES[model]
    shape = (q_heads, kv_heads, head_dim, PAGE, torch.bfloat16, "cuda")
    engine_arms = {
        "flashinfer-cuda-cores": {"tensor_cores": False},
        "flashinfer-tensor-cores": {"tensor_cores": True},
        "triton": {"decode_kernel": "triton"},
    }
    arms = {}
    for arm, options in engine_arms.items():
        attention = FlashInferAttention(*shape, slots=1, **options)
        attention.add_graph_bucket(rows, per_row)
        attention.plan(batch, bucket=rows)
        splits = decode_splits(rows, kv_heads, attention.sms) if arm == "triton" else None
        arms[arm] = (attention.run, splits)
    if sweep:
        layout = (batch.kv_indices, batch.kv_indptr, batch.kv_last_page_len)

        def ours(splits: int | None = None, launch: DecodeLaunch | None = None):
            def run(q, k_cache, v_cache, scale):
                return triton_decode.paged_decode(
                    q, k_cache, v_cache, *layout, scale, splits=splits, launch=launch
                )

            return run

        default = arms["triton"][1]
        for splits in (s for s in SWEEP_SPLITS if s != default):
            arms[f"triton splits={splits}"] = (ours(splits=splits), splits)
        for launch in launch_sweep(head_dim)[1:]:
            name = f"triton block_n={launch.block_n} warps={launch.warps} stages={launch.stages}"
            arms[name] = (ours(default, launch), default)
    return arms


def measure(args: argparse.Namespace, profiles: list[str] | None = None) -> list[DecodeTiming]:
    """Every arm at every model, context and row count of `args`, each timing printed as it
    comes; with `profiles`, each arm's kernel table appended to it."""
    flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    gen = torch.Generator().manual_seed(0)
    timings = []
    for model in args.model:
        q_heads, kv_heads, head_dim = SHAPES[model]
        scale, read = head_dim**-0.5, partial(kv_bytes, kv_heads=kv_heads, head_dim=head_dim)
        for context in args.contexts:
            for rows in args.rows:
                batch, k_cache, v_cache, per_row = _step(rows, context, kv_heads, head_dim, gen)
                q = torch.randn(rows, q_heads, head_dim, device="cuda", dtype=torch.bfloat16)
                want = None  # the first arm's output: FlashInfer's CUDA cores
                for arm, (run, splits) in _arms(model, rows, batch, per_row, args.sweep).items():
                    call = partial(run, q, k_cache, v_cache, scale)
                    out = call().float()
                    want = out if want is None else want
                    times = _timed(call, args.calls, args.repeats, flush)
                    err = (out - want).abs().max().item()
                    timing = DecodeTiming(
                        model, rows, context, arm, splits, read(rows, context), times, err
                    )
                    timings.append(timing)
                    print(render(timing), flush=True)
                    if profiles is not None:
                        profiles.append(_profile(timing, call))
    return timings


def _profile(timing: DecodeTiming, call: Callable) -> str:
    """The kernels of a few calls (which launches an arm makes, and their GPU time)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            call()
        torch.cuda.synchronize()
    head = f"== {timing.model} {timing.rows} rows x {timing.context}, {timing.arm}, 5 calls\n"
    return head + prof.key_averages().table(sort_by="cuda_time_total", row_limit=8)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, read without CUDA (a bad count is refused on any machine)."""
    parser = argparse.ArgumentParser(prog="benchmarks.bench_decode_attention")
    parser.add_argument("--model", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rows", type=positive_int, nargs="*", default=[1, 16, 64, 128])
    parser.add_argument("--contexts", type=positive_int, nargs="*", default=[256, 512, 2048])
    parser.add_argument("--calls", type=positive_int, default=20, help="calls a graph")
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument(
        "--sweep", action="store_true", help="our kernel's split counts and launches too"
    )
    parser.add_argument("--json", default=None, help="append one JSON line a timing here")
    parser.add_argument("--profile", default=None, help="write each arm's kernels here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit(
            "bench_decode_attention: needs CUDA (FlashInfer and our kernel run on a GPU)"
        )
    profiles = [] if args.profile else None
    timings = measure(args, profiles)
    print(table(timings))
    if args.profile:
        with open(args.profile, "w") as out:
            out.write("\n".join(profiles))
    if args.json:
        append_json_lines(args.json, timings)


if __name__ == "__main__":
    main()

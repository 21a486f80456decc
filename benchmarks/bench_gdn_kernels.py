"""Gated DeltaNet's kernels for one layer call: each path the engine has, per step shape, and
the split kernel's launch configurations (docs/KERNELS.md, "Tuning the split kernel").

    python -m benchmarks.bench_gdn_kernels                   (default shapes, every path)
    python -m benchmarks.bench_gdn_kernels --profile          (+ the per-kernel split)
    python -m benchmarks.bench_gdn_kernels --sweep            (SplitConfig's sweep, captured form)
    python -m benchmarks.bench_gdn_kernels --sweep "fixed_states_rows=4" "chunk=64,prepare_warps=8"
    python -m benchmarks.bench_gdn_kernels --recurrent        (the recurrence's launches, decode)
    python -m benchmarks.bench_gdn_kernels --device cpu --size tiny --shapes 2d+1x40   (interpreter)

A shape `RxL` is R new rows (prompts, nothing cached) of L tokens; `Nd+RxL` puts N decode rows
(one token each, a state cached) ahead of them, as a mixed step does; `Nd` alone is a decode
step (the recurrence only). The layer is one Gated
DeltaNet of the model size's shapes with the model's seeded random weights; its projections
of random hidden states and its conv (run once, not timed) give q, k, v and the gates' a and b
as a step gives them. Each path runs the engine's own op, `CudaOps.delta_rule` (what
`linear_attention` runs after the conv), on a step staged by the engine's `StepInputs`:

- `fla`, `triton`, `triton_split`, `auto`: engine.gdn_prefill's kernels, launched eagerly as
  a step without engine.piecewise_gdn runs them (the step's chunk tables and scratch kept
  from the first call, as for every layer of a step after its first);
- `captured`: the fixed-grid form engine.piecewise_gdn captures, the step padded to its token
  bucket, its grids sized by the bucket and `--max-rows` (the engine's: the scenario's).

Timing (CUDA): a spin kernel holds the GPU while the host enqueues a call, so the figure is
the GPU's time for the call's launches (what a CUDA graph replays), taken with CUDA events;
the median, p10 and p90 over --repeats after --warmup (benchmarks/stats.py), the host's
enqueue time (its median) beside it. A call whose enqueue outlasted its spin is counted as
doubtful (the GPU may have waited for the host).
`err` is the largest difference of a call's output from the first path's (the sweep: the
default config's) on the same inputs and states, relative to the output's largest value.
On the CPU (--device cpu: Triton's interpreter) the times are wall times: a smoke run only.
A call that fails (a compile error, too much shared memory) shows its error in its row; an
illegal memory access poisons the CUDA context, so every later row fails too: rerun with
`--sweep CONFIG ...` without the config that did it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from types import SimpleNamespace

import torch

from benchmarks import stats
from benchmarks.options import positive_int
from engine.config import TRITON_LAUNCHES, KernelsConfig
from engine.config.gdn_split import SPLIT_DEFAULT, SplitConfig, parse_split_config
from engine.kernels.gdn_config import SWEEP_AXES, combine_winners, split_sweep
from engine.kernels.gdn_launch import (
    PIPELINED_LAUNCH,
    RECURRENT_LAUNCH,
    PipelinedLaunch,
    RecurrentLaunch,
)
from engine.models.qwen35_config import LINEAR, PRESETS
from harness.scenario import load_scenario

PATHS = ("fla", "triton", "triton_split", "auto", "captured")
SCHEMA = 1  # of the --json records
# An output further than this from the first path's (relative to its largest value) is
# flagged: bf16 outputs round at ~4e-3 of their size, TF32 products differ by less.
ERR_FLAG = 2e-2
PAGE = 16  # the KV page size of the staged steps (the scenario's)
# The recurrence's launches a case hands the CUDA ops: the grid kernel's and the pipelined's.
Launches = tuple[RecurrentLaunch, PipelinedLaunch]
DEFAULT_LAUNCHES: Launches = (RECURRENT_LAUNCH, PIPELINED_LAUNCH)


@dataclass(frozen=True)
class Shape:
    decode: int  # leading one-token rows with cached states
    rows: int  # new prompts
    length: int  # tokens a prompt

    @classmethod
    def parse(cls, text: str) -> Shape:
        decode = re.fullmatch(r"(\d+)d", text)
        if decode and int(decode[1]):
            return cls(int(decode[1]), 0, 0)
        match = re.fullmatch(r"(?:(\d+)d\+)?(\d+)x(\d+)", text)
        if not match or not int(match[2]) or not int(match[3]):
            raise ValueError(
                f"a shape is RxL, Nd+RxL or Nd (e.g. 4x256, 64d+1x384, 64d), got {text!r}"
            )
        return cls(int(match[1] or 0), int(match[2]), int(match[3]))

    def __str__(self) -> str:
        if not self.rows:
            return f"{self.decode}d"
        prefix = f"{self.decode}d+" if self.decode else ""
        return f"{prefix}{self.rows}x{self.length}"

    @property
    def num_new(self) -> list[int]:
        return [1] * self.decode + [self.length] * self.rows


# --- records (raw facts) ---------------------------------------------------------------------
@dataclass
class Sample:
    """One (shape, path, state dtype, split config) measured: raw per-call figures (us)."""

    shape: str
    path: str
    state_dtype: str
    split: str  # SplitConfig as text ("default")
    kind: str  # path | sweep | combined (a shape's winning sweep values together)
    gpu_us: list[float] = field(default_factory=list)  # CUDA: event time; CPU: wall time
    host_us: list[float] = field(default_factory=list)  # the host's time to enqueue the call
    spin_us: list[float] = field(default_factory=list)  # the spin that held the GPU (CUDA)
    err: float | None = None  # max |out - first path's out| / max |first path's out|
    kernels: dict[str, float] = field(default_factory=dict)  # --profile: kernel -> us a call
    error: str | None = None  # why no figure (not importable, failed to compile or launch)


# --- measuring -------------------------------------------------------------------------------
class Bench:
    """One layer, its state pools and the engine's step inputs on one device."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.device = torch.device(args.device)
        self.dtype = getattr(torch, args.dtype)
        self.config = PRESETS[args.size]
        self.layer = _layer(self.config, self.dtype, self.device)
        self.inputs: dict[int, object] = {}  # StepInputs by chunk size

    def step_inputs(self, chunk: int):
        from engine.worker.step_inputs import StepInputs

        if chunk not in self.inputs:
            pages = -(-(512 + self.args.max_tokens) // PAGE)  # a row's most pages
            self.inputs[chunk] = StepInputs(self.args.max_tokens, self.args.max_rows, pages,
                                            self.device, slots=1, gdn_chunk=chunk)  # fmt: skip
        return self.inputs[chunk]

    def ops(self, path: str, split: SplitConfig, launches: Launches = DEFAULT_LAUNCHES):
        from engine.kernels.cuda_ops import CudaOps

        gdn_prefill = {"captured": "auto", "pipelined": "triton"}.get(path, path)
        kernels = KernelsConfig(
            gdn_prefill=gdn_prefill,
            piecewise_gdn=path == "captured",
            gdn_split=str(split),
            gdn_decode="pipelined" if path == "pipelined" else "grid",
        )
        return CudaOps(self.layer, self.device, PAGE, 1, kernels, *launches)

    def case(
        self, shape: Shape, path: str, state_dtype: str, split: SplitConfig, launches: Launches
    ):
        """A zero-argument call of the layer's op for `shape` on `path` (the recurrence launched
        as `launches` say), and a function that restores the state pools and returns one call's
        output (the real tokens')."""
        from engine.kernels import triton_gdn
        from engine.worker.piecewise import token_buckets_up_to

        tokens = sum(shape.num_new)
        bucket = next(b for b in token_buckets_up_to(self.args.max_tokens) if b >= tokens)
        ops = self.ops(path, split, launches)
        gen = torch.Generator().manual_seed(tokens)  # every path of a shape: the same inputs
        x = torch.randn(bucket, self.config.hidden_size, generator=gen)
        x = x[: bucket if path == "captured" else tokens].to(self.device, self.dtype)
        layer = self.layer
        slots = len(shape.num_new) + 1
        window = layer.conv1d.weight.shape[-1] - 1
        conv = torch.randn(slots, layer.conv_dim, window, generator=gen)
        conv = conv.to(self.device, self.dtype)
        state0 = 0.1 * torch.randn(slots, layer.v_heads, layer.k_dim, layer.v_dim, generator=gen)
        state0 = state0.to(self.device, getattr(torch, state_dtype))
        state = state0.clone()
        batch = _stage(self.step_inputs(split.chunk), shape, ops, bucket, path == "captured")
        ops.begin_step(batch)
        with torch.inference_mode():
            mixed, _, b, a = ops.project(
                x, (layer.in_proj_qkv, layer.in_proj_z, layer.in_proj_b, layer.in_proj_a)
            )
            qkv = triton_gdn.causal_conv(mixed, layer.conv1d.weight[:, 0, :], conv, batch)

        def call() -> torch.Tensor:
            with torch.inference_mode():
                return ops.delta_rule(layer, qkv, a, b, state, batch)

        def fresh() -> torch.Tensor:
            state.copy_(state0)
            return call()[:tokens].float()

        return call, fresh


def _layer(config, dtype: torch.dtype, device: torch.device):
    """One Gated DeltaNet of `config` with the model's seeded random weights (engine.models)."""
    from engine.models.qwen35 import Qwen35DecoderLayer, random_weight
    from engine.models.random_weights import random_model

    layer = random_model(
        lambda: Qwen35DecoderLayer(config, LINEAR, 0),
        lambda name, shape: random_weight(f"model.layers.0.{name}", shape, config, 0),
        dtype, device,
    )  # fmt: skip
    return layer.linear_attn


def _stage(inputs, shape: Shape, ops, bucket: int, captured: bool):
    """The step of `shape` as the engine stages it: decode rows (a cached context of 512
    tokens) then prompts, each with a state slot of its own; padded to `bucket` with the
    Gated DeltaNet tables for the captured form."""
    rows, page = [], 0
    for i, new in enumerate(shape.num_new):
        cached = 512 if i < shape.decode else 0
        pages = -(-(cached + new) // PAGE)
        request = SimpleNamespace(num_cached=cached, pages=list(range(page, page + pages)),
                                  tokens=[1] * (cached + new), slot=i, rid=i)  # fmt: skip
        rows.append(SimpleNamespace(num_new=new, walk="decode" if cached else "prefill",
                                    request=request))  # fmt: skip
        page += pages
    cache = SimpleNamespace(page_size=PAGE, sink_page=page, sink_slot=len(rows))
    if captured:
        return inputs.stage(rows, cache, ops, pad_tokens_to=bucket, gdn_tables=True)
    return inputs.stage(rows, cache, ops)


def measure(
    bench: Bench,
    sample: Sample,
    split: SplitConfig,
    want: torch.Tensor | None,
    launches: Launches = DEFAULT_LAUNCHES,
):
    """Fill `sample` (its error where the call fails); returns the call's fresh output."""
    args = bench.args
    try:
        shape = Shape.parse(sample.shape)
        call, fresh = bench.case(shape, sample.path, sample.state_dtype, split, launches)
        out = fresh()
        if want is not None:
            sample.err = ((out - want).abs().max() / want.abs().max().clamp(min=1e-30)).item()
        for _ in range(args.warmup):
            call()
        _time(call, bench.device, args.repeats, sample)
        if args.profile and bench.device.type == "cuda":
            sample.kernels = _profile(call)
        return out
    except Exception as error:  # recorded and shown, not swallowed: a config may not launch
        sample.error = f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"
        return None


def _time(call, device: torch.device, repeats: int, sample: Sample) -> None:
    if device.type != "cuda":
        for _ in range(repeats):
            t0 = time.perf_counter()
            call()
            sample.gpu_us.append((time.perf_counter() - t0) * 1e6)
        return
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    host = time.perf_counter() - t0
    cycles = int(max(4 * host, 200e-6) * 2e9)  # ~2 GHz: the figure checks itself (spin_us)
    events = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(repeats)]
    for begin, start, end in events:
        begin.record()
        torch.cuda._sleep(cycles)
        start.record()
        t0 = time.perf_counter()
        call()
        sample.host_us.append((time.perf_counter() - t0) * 1e6)
        end.record()
    torch.cuda.synchronize()
    sample.gpu_us = [start.elapsed_time(end) * 1e3 for _, start, end in events]
    sample.spin_us = [begin.elapsed_time(start) * 1e3 for begin, start, _ in events]


def _profile(call, calls: int = 5) -> dict[str, float]:
    """Each CUDA kernel's device time per call (us), from the torch profiler."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        total = getattr(event, "self_device_time_total", None)
        if total is None:
            total = getattr(event, "self_cuda_time_total", 0)
        if total:
            times[event.key[:60]] = times.get(event.key[:60], 0.0) + total / calls
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def run_paths(bench: Bench, split: SplitConfig, show: Callable[[Sample], None]) -> list[Sample]:
    """Every shape, state dtype and path under `split`, each sample shown once measured."""
    args, samples = bench.args, []
    for shape in args.shapes:
        for state_dtype in args.state_dtypes:
            want = None
            for path in args.paths:
                sample = Sample(str(shape), path, state_dtype, str(split), "path")
                if path == "fla" and not _fla_importable():
                    sample.error = "flash-linear-attention is not importable"
                else:
                    out = measure(bench, sample, split, want)
                    want = out if want is None else want
                samples.append(sample)
                show(sample)
    return samples


def run_sweep(
    bench: Bench, configs: list[SplitConfig], show: Callable[[Sample], None]
) -> list[Sample]:
    """Every config on every shape (the sweep path, the first state dtype), then per shape the
    combination of its winning axis values (`combine_winners`) where it is a new config."""
    args, samples = bench.args, []
    state_dtype = args.state_dtypes[0]
    for shape in args.shapes:
        want, rows = None, []
        for split in configs:
            sample = Sample(str(shape), args.sweep_path, state_dtype, str(split), "sweep")
            out = measure(bench, sample, split, want)
            want = out if want is None else want
            rows.append((split, sample))
            show(sample)
        samples += [sample for _, sample in rows]
        best = combine_winners(axis_winners(rows))
        if best is not None and best not in configs:
            sample = Sample(str(shape), args.sweep_path, state_dtype, str(best), "combined")
            measure(bench, sample, best, want)
            samples.append(sample)
            show(sample)
    return samples


# The recurrence's launches --recurrent takes: value columns and warps a program; with no
# launch named it tries every pair.
RECURRENT_BVS, RECURRENT_WARPS = (16, 32, 64, 128), (1, 2, 4, 8)
RECURRENT_SWEEP = tuple((bv, warps) for bv in RECURRENT_BVS for warps in RECURRENT_WARPS)
RECURRENT_SHAPES = ("64d", "128d")  # decode steps at the c=64 and c=128 loads
# engine.gdn_decode pipelined's launches --recurrent times after the grid's (path `pipelined`):
# value columns, warps, programs an SM, stages; the module's default first. At BV 64 the sm_90
# compile takes 167 registers (3 programs an SM at 4 warps) and 34 KB of shared memory a stage.
PIPELINED_SWEEP = ((64, 4, 3, 2), (64, 4, 2, 2), (64, 4, 3, 3), (32, 4, 4, 2), (32, 4, 6, 3),
                   (64, 8, 1, 2), (128, 8, 1, 2))  # fmt: skip


def parse_recurrent(text: str) -> tuple[int, int]:
    """`BV:WARPS` (e.g. 64:8): the recurrence's value columns and warps a program."""
    match = re.fullmatch(r"(\d+):(\d+)", text)
    launch = (int(match[1]), int(match[2])) if match else None
    if launch not in RECURRENT_SWEEP:
        bvs, warps = ("/".join(map(str, values)) for values in (RECURRENT_BVS, RECURRENT_WARPS))
        raise argparse.ArgumentTypeError(
            f"a recurrent launch is BV:WARPS, BV of {bvs} and WARPS of {warps}, got {text!r}"
        )
    return launch


def run_recurrent(
    bench: Bench, launches: list[tuple[int, int]], show: Callable[[Sample], None]
) -> list[Sample]:
    """Every recurrent launch on every decode shape (path `triton`: a decode step's op), each
    against the engine's launch (gdn_launch.RECURRENT_LAUNCH, measured first), then the
    engine's launch in the recurrence's other form (`one_pass` flipped, labelled
    `one_pass=...`), then the pipelined kernel (engine.gdn_decode pipelined) under each launch
    of PIPELINED_SWEEP, every output held to the first's; each handed to the engine's CUDA ops,
    which run it in the engine's own op."""
    args, samples = bench.args, []
    default = RECURRENT_LAUNCH
    runs = [default, replace(default, one_pass=not default.one_pass)]
    runs += [
        RecurrentLaunch(bv, warps, default.one_pass)
        for bv, warps in launches
        if (bv, warps) != (default.bv, default.warps)
    ]
    state_dtype = args.state_dtypes[0]
    for shape in args.recurrent_shapes:
        want = None
        for launch in runs:
            label = f"recurrent bv={launch.bv},warps={launch.warps}"
            if launch.one_pass != default.one_pass:
                label += f",one_pass={launch.one_pass}"
            sample = Sample(str(shape), "triton", state_dtype, label, "recurrent")
            out = measure(bench, sample, SPLIT_DEFAULT, want, (launch, PIPELINED_LAUNCH))
            want = out if want is None else want
            samples.append(sample)
            show(sample)
        for pipelined in PIPELINED_SWEEP:
            label = "pipelined bv={},warps={},per_sm={},stages={}".format(*pipelined)
            sample = Sample(str(shape), "pipelined", state_dtype, label, "recurrent")
            measure(bench, sample, SPLIT_DEFAULT, want, (default, PipelinedLaunch(*pipelined)))
            samples.append(sample)
            show(sample)
    return samples


def _fla_importable() -> bool:
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except ImportError:
        return False
    return True


# --- analysis (pure) -------------------------------------------------------------------------
@dataclass(frozen=True)
class CallSummary:
    gpu: stats.Summary | None  # None: no call timed (the call failed), so no figure at all
    host: stats.Summary | None  # the enqueue times
    doubtful: int  # calls whose enqueue outlasted the spin before them


def summarise(sample: Sample) -> CallSummary:
    gpu = stats.summarise(sample.gpu_us)
    if gpu is None:
        return CallSummary(None, None, 0)
    doubtful = sum(h >= s for h, s in zip(sample.host_us, sample.spin_us, strict=False))
    return CallSummary(gpu, stats.summarise(sample.host_us), doubtful)


def median_us(sample: Sample) -> float | None:
    """The sample's median GPU time a call; None where no call was timed."""
    gpu = summarise(sample).gpu
    return gpu.median if gpu is not None else None


def axis_winners(rows: list[tuple[SplitConfig, Sample]]) -> list[SplitConfig]:
    """For each sweep axis, the config of that axis alone (or the default) with the lowest
    median, where it beats the default: the parts `combine_winners` joins."""
    medians = {split: median_us(sample) for split, sample in rows}
    base = medians.get(SPLIT_DEFAULT)
    winners = []
    for axis, values in SWEEP_AXES.items():
        tried = [SplitConfig(**{axis: v}) for v in values]
        timed = [(medians[c], c) for c in tried if medians.get(c) is not None]
        if timed and base is not None and min(timed)[0] < base:
            winners.append(min(timed, key=lambda item: item[0])[1])
    return winners


def best_per_shape(samples: list[Sample]) -> dict[str, tuple[Sample, Sample]]:
    """Per shape: (the default config's sample, the fastest sample)."""
    out: dict[str, tuple[Sample, Sample]] = {}
    for sample in samples:
        if median_us(sample) is None:
            continue
        default, best = out.get(sample.shape, (None, sample))
        if sample.split == str(SPLIT_DEFAULT):
            default = sample
        if median_us(sample) < median_us(best):
            best = sample
        out[sample.shape] = (default, best)
    return out


# --- showing ---------------------------------------------------------------------------------
def _cell(value: float | None, width: int = 9) -> str:
    return f"{value:{width}.1f}" if value is not None else f"{'-':>{width}}"


def header(title: str) -> str:
    return (f"\n{title}\n{'shape':<11} {'path':<12} {'state':<8} {'us/call':>9} {'p10':>9} "
            f"{'p90':>9} {'host us':>9} {'err':>8}  split")  # fmt: skip


def row(sample: Sample, profile: bool) -> str:
    """One sample's line (and with `profile` a line per kernel)."""
    s = summarise(sample)
    median, p10, p90 = (s.gpu.median, s.gpu.p10, s.gpu.p90) if s.gpu else (None, None, None)
    host = s.host.median if s.host else None
    err = f"{sample.err:8.1e}" if sample.err is not None else f"{'-':>8}"
    line = (f"{sample.shape:<11} {sample.path:<12} {sample.state_dtype:<8} {_cell(median)} "
            f"{_cell(p10)} {_cell(p90)} {_cell(host)} {err}  {sample.split}")  # fmt: skip
    if sample.kind == "combined":
        line += "  (the shape's winning axis values combined)"
    if sample.error:
        line += f"  {sample.error}"
    if sample.err is not None and sample.err > ERR_FLAG:
        line += "  (output differs from the first row's: check before trusting the time)"
    if s.doubtful:
        line += f"  ({s.doubtful} calls doubtful: enqueue outlasted the spin; rerun)"
    kernels = sample.kernels.items() if profile else ()
    return "\n".join([line, *(f"{'':<11}   {kernel:<60} {us:9.1f}" for kernel, us in kernels)])


def render_best(samples: list[Sample]) -> None:
    print("\nbest split config per shape")
    for shape, (default, best) in best_per_shape(samples).items():
        base = median_us(default) if default else None
        ratio = f" ({base / median_us(best):.2f}x)" if base else ""
        print(f"{shape:<12} default {_cell(base)} us  best {_cell(median_us(best))} us"
              f"{ratio}  {best.split}")  # fmt: skip


# --- wiring ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_gdn_kernels")
    parser.add_argument("--size", default="0.8b", choices=list(PRESETS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--shapes", nargs="+", type=Shape.parse,
                        default=[Shape.parse(s) for s in ("1x128", "1x384", "4x256", "1x1536",
                                                           "64d+1x384")])  # fmt: skip
    parser.add_argument("--paths", nargs="*", choices=PATHS, default=list(PATHS),
                        help="none (--paths alone): only the sweep")  # fmt: skip
    parser.add_argument("--state-dtypes", nargs="+", choices=["float32", "bfloat16", "float16"],
                        default=["float32", "bfloat16"])  # fmt: skip
    parser.add_argument(
        "--split", type=parse_split_config, default=SPLIT_DEFAULT, help="e.g. chunk=64"
    )
    parser.add_argument(
        "--sweep", nargs="*", default=None, metavar="CONFIG", help="SplitConfig's or these"
    )
    parser.add_argument("--sweep-path", default="captured", choices=["captured", "triton_split"])
    parser.add_argument(
        "--recurrent",
        nargs="*",
        type=parse_recurrent,
        default=None,
        metavar="BV:WARPS",
        help="the recurrence's launches on decode steps (none given: a 4 x 4 sweep)",
    )
    parser.add_argument("--recurrent-shapes", nargs="+", type=Shape.parse,
                        default=[Shape.parse(s) for s in RECURRENT_SHAPES])  # fmt: skip
    scenario = load_scenario("qwen35", "0.8b").engine
    parser.add_argument("--max-rows", type=positive_int, default=scenario.max_rows)
    parser.add_argument("--max-tokens", type=positive_int, default=scenario.max_tokens_per_step)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=positive_int, default=30)
    parser.add_argument("--profile", action="store_true", help="per-kernel device time (CUDA)")
    parser.add_argument("--json", default=None, help="write the raw samples here (JSON lines)")
    parser.add_argument(  # engine.triton_launch: the host us column with the kept kernels
        "--triton-launch", default="jit", choices=list(TRITON_LAUNCHES)
    )
    args = parser.parse_args(argv)
    if args.sweep is not None:
        args.sweep = split_sweep() if not args.sweep else [
            SPLIT_DEFAULT, *(parse_split_config(text) for text in args.sweep)
        ]  # fmt: skip
    if args.recurrent is not None and not args.recurrent:
        args.recurrent = list(RECURRENT_SWEEP)
    shapes = [*args.shapes, *args.recurrent_shapes]
    longest = max(sum(s.num_new) for s in shapes)
    if longest > args.max_tokens or max(len(s.num_new) for s in shapes) > args.max_rows:
        parser.error(f"a shape exceeds --max-tokens {args.max_tokens} or --max-rows "
                     f"{args.max_rows}: raise them or drop the shape")  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.device == "cpu":  # before the kernels are defined: Triton's interpreter
        os.environ["TRITON_INTERPRET"] = "1"
    torch.manual_seed(0)
    from engine.kernels import triton_launch

    triton_launch.set_launch(args.triton_launch)
    bench = Bench(args)
    where = torch.cuda.get_device_name() if bench.device.type == "cuda" else "cpu (interpreter)"
    head = f"Gated DeltaNet, one layer call, {args.size} {args.dtype} on {where}, max_rows " \
           f"{args.max_rows}, triton launch {args.triton_launch}, " \
           f"median of {args.repeats}"  # fmt: skip
    records = open(args.json, "w") if args.json else None  # JSON lines, one per sample
    if records:
        env = {"device": where, "torch": torch.__version__, "size": args.size,
               "dtype": args.dtype, "max_rows": args.max_rows,
               "triton_launch": args.triton_launch}  # fmt: skip
        records.write(json.dumps({"schema": SCHEMA, "environment": env}) + "\n")

    def show(sample: Sample) -> None:  # as soon as measured: a run cut short keeps its rows
        print(row(sample, args.profile), flush=True)
        if records:
            records.write(json.dumps(asdict(sample)) + "\n")
            records.flush()

    if args.paths:
        print(header(f"{head}: paths (split {args.split})"))
        run_paths(bench, args.split, show)
    if args.sweep:
        print(header(f"{head}: split configs on {args.sweep_path}"))
        render_best(run_sweep(bench, args.sweep, show))
    if args.recurrent:
        print(header(f"{head}: the recurrence's launches (decode steps)"))
        run_recurrent(bench, args.recurrent, show)
    if records:
        records.close()


if __name__ == "__main__":
    main()

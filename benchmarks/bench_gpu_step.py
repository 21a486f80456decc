"""The engine's step on one GPU: decode at a batch size over contexts of a length, and
prefill (or mixed) steps beside it.

    python -m benchmarks.bench_gpu_step --size 0.8b --batch 64 --context 512 --kernels cuda
    python -m benchmarks.bench_gpu_step --batch 64 --graphs --piecewise --prefill 1x384 4x256
    python -m benchmarks.bench_gpu_step --scenario orpheus --size 3b --context 256 --graphs
    python -m benchmarks.bench_gpu_step --batch 64 --graphs --dense-kernel triton
    python -m benchmarks.bench_gpu_step --batch 64 --graphs --decode-attention triton

Runs the engine's own step (`Engine.launch`, the wait, the host copy, `step_finished`) on a
batch of requests whose prompts are prefilled first, then times decode steps: wall time per
step from schedule to the tokens on the host (what the worker loop pays), its median, p10 and
p90 (benchmarks/stats.py).
`--profile FILE` adds a torch profiler table of a few steps (where the time goes); `--stacks`
groups the steps' host calls by the Python lines that make them (only where torch records
Python stacks: the GPU machine's torch 2.11 gives the table without them);
`--cprofile FILE` times 5 decode steps under cProfile instead: the host's time by Python
function (own and cumulative), on any torch: where an eager step's host time goes.
`--prefill RxL ...` then times steps that prefill R new prompts of L tokens while the batch
decodes: with `mixing` off (the scenario's) a prefill-only step, with `--mixing` one mixed
step of the batch's decode rows and the new prompts; each new request is removed after its
step, so every repeat sees the same batch.

`--scenario orpheus` times Orpheus's LLM (docs/ORPHEUS.md) the same way: its engine is the
worker's (`build_engine`), so its node's logit mask is in effect (each row samples the 4096
audio codes of its token's position in a frame, from the step's logits); the prompts carry the
speech format's markers around random ids, as /v1/audio/speech builds them. The codec is not
run: benchmarks/bench_orpheus_iteration.py times the worker's iteration with both nodes.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from benchmarks import device_streams, stats
from benchmarks.options import positive_int
from engine.config import (
    DECODE_ATTENTIONS,
    DENSE_KERNELS,
    GDN_DECODES,
    TRITON_LAUNCHES,
    EngineConfig,
)
from engine.config.kernels import GDN_PREFILLS
from engine.messages import AddRequest
from engine.models import architecture
from engine.worker.engine import Engine
from engine.worker.main import build_engine
from harness.scenario import Scenario, load_scenario


def _step(engine: Engine) -> int:
    rows, _ = engine.run_step()
    return len(rows)


def prompt_ids(arch: str, vocab: int, length: int, gen: torch.Generator) -> list[int]:
    """`length` prompt ids as the scenario's server runs them: random ids in [1, vocab), for a
    model that speaks between its speech format's markers (what /v1/audio/speech makes of a
    token-id input)."""
    speech = architecture(arch).speech
    prefix, suffix = (speech.prefix, speech.suffix) if speech is not None else ([], [])
    body = length - len(prefix) - len(suffix)
    if body < 1:
        raise ValueError(f"a {arch} prompt needs more than {length} tokens")
    return prefix + torch.randint(1, vocab, (body,), generator=gen).tolist() + suffix


def build(
    scenario: Scenario,
    batch: int,
    context: int,
    steps: int,
    kernels: str,
    graphs: bool,
    **engine,
) -> Engine:
    """The scenario's engine (its first node's, as the worker builds it), `batch` requests of
    `context`-token prompts prefilled, each with room for `steps` more decode steps."""
    engine.setdefault("max_rows", batch)
    config = replace(scenario.engine, kernels=kernels, cuda_graphs=graphs, **engine)
    engine, _ = build_engine(scenario.model, config)
    gen = torch.Generator().manual_seed(0)
    vocab = engine.model.config.vocab_size
    for rid in range(batch):
        prompt = prompt_ids(scenario.model.arch, vocab, context, gen)
        msg = AddRequest(rid, prompt, steps + 64, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid  # the runtime handle a worker would set
    while any(not r.prefill_done for r in engine.requests.values()):
        _step(engine)
    return engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_gpu_step")
    parser.add_argument("--scenario", default="qwen35", choices=["qwen35", "orpheus"])
    parser.add_argument("--size", default=None, help="default: the scenario's for this machine")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--context", type=positive_int, default=512)
    parser.add_argument("--steps", type=positive_int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--kernels", default="cuda", choices=["cuda", "torch", "auto"])
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--piecewise", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--mixing", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument(  # engine.piecewise_gdn: Gated DeltaNet inside the piecewise graphs
        "--piecewise-gdn", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument("--gdn-prefill", default="auto", choices=list(GDN_PREFILLS))
    parser.add_argument(  # engine.gdn_split: the split kernel's launch configuration
        "--gdn-split", default="default", help="SplitConfig's fields, e.g. states_bv=32"
    )
    parser.add_argument(
        "--decode-tensor-cores", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument(  # engine.decode_attention: decode steps on FlashInfer's or ours
        "--decode-attention", default=EngineConfig.decode_attention, choices=list(DECODE_ATTENTIONS)
    )
    parser.add_argument(  # engine.dense_kernel: the dense projections on cuBLAS or ours
        "--dense-kernel", default="torch", choices=list(DENSE_KERNELS)
    )
    parser.add_argument(  # engine.dense_epilogues: on ours, SiLU-mul and the split's sum fused
        "--dense-epilogues", action=argparse.BooleanOptionalAction, default=True
    )
    parser.add_argument(
        "--state-dtype", default="float32", choices=["float32", "bfloat16", "float16"]
    )
    parser.add_argument(  # engine.triton_launch: Triton's own launch, or the kept kernels'
        "--triton-launch", default="jit", choices=list(TRITON_LAUNCHES)
    )
    parser.add_argument(  # engine.gdn_decode: the decode recurrence on its grid or pipelined
        "--gdn-decode", default=EngineConfig.gdn_decode, choices=list(GDN_DECODES)
    )
    parser.add_argument(  # engine.prefill_stream: off here (a step timed alone gains nothing)
        "--prefill-stream", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument(  # engine.pdl: our kernels' launches programmatic (Hopper)
        "--pdl", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument(  # engine.masked_head: a masked node's logits over its span alone
        "--masked-head", action=argparse.BooleanOptionalAction, default=False
    )
    parser.add_argument(
        "--replays", type=int, default=0,
        help="then time this many back-to-back replays of the batch's decode graph, no host "
        "work between (CUDA events): the step's device time alone",
    )  # fmt: skip
    parser.add_argument("--prefill", nargs="*", default=[], metavar="RxL")
    parser.add_argument("--profile", default=None, help="write a profiler table here")
    parser.add_argument(
        "--stacks", action="store_true",
        help="with --profile: the steps' host calls also grouped by their Python stack",
    )  # fmt: skip
    parser.add_argument(
        "--cprofile", default=None, help="write 5 decode steps' host time by function here"
    )
    args = parser.parse_args(argv)
    steps = args.steps + args.warmup + 5 + 40 * len(args.prefill)
    scenario = load_scenario(args.scenario, args.size)
    engine = build(
        scenario, args.batch, args.context, steps, args.kernels, args.graphs,
        piecewise_graphs=args.piecewise, piecewise_gdn=args.piecewise_gdn, mixing=args.mixing,
        prefill_stream=args.prefill_stream,
        gdn_prefill=args.gdn_prefill, gdn_split=args.gdn_split,
        decode_tensor_cores=args.decode_tensor_cores, decode_attention=args.decode_attention,
        state_dtype=args.state_dtype, dense_kernel=args.dense_kernel,
        dense_epilogues=args.dense_epilogues, triton_launch=args.triton_launch, masked_head=args.masked_head, pdl=args.pdl,
        gdn_decode=args.gdn_decode,
        max_rows=args.batch + max((int(p.split("x")[0]) for p in args.prefill), default=0),
    )  # fmt: skip
    for _ in range(args.warmup):
        _step(engine)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        _step(engine)
        times.append((time.perf_counter() - t0) * 1e3)
    decode = stats.summarise(times)
    print(
        f"decode step, size {scenario.size}, batch {args.batch}, context {args.context}, "
        f"kernels {engine.ops.name}, graphs {engine.graphs is not None}, decode tensor cores "
        f"{args.decode_tensor_cores}, decode attention {args.decode_attention}, state "
        f"{args.state_dtype}, dense {args.dense_kernel} (epilogues {args.dense_epilogues}), triton launch {args.triton_launch}, "
        f"pdl {args.pdl}, gdn decode {args.gdn_decode}, masked head {engine.first_logit > 0}: "
        f"{stats.render(decode)} over "
        f"{decode.n} steps = {args.batch / decode.median * 1e3:,.0f} tok/s{_mask_note(engine)}"
    )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
        with profile(activities=activities, with_stack=args.stacks) as prof:
            start = time.perf_counter()
            for _ in range(5):
                _step(engine)
            wall_us = (time.perf_counter() - start) * 1e6
        table = _device_busy(prof, wall_us, steps=5)
        table += prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        if args.stacks:  # the decode step's host calls by the Python lines that make them
            by_stack = prof.key_averages(group_by_stack_n=6)
            table += "\n" + by_stack.table(sort_by="self_cpu_time_total", row_limit=40)
        with open(args.profile, "w") as out:
            out.write(table)
        print(table[:6000])
    if args.cprofile:
        Path(args.cprofile).write_text(_host_by_function(engine, steps=5))
    arch = scenario.model.arch
    for spec in args.prefill:
        rows, length = (int(part) for part in spec.split("x"))
        prefill = stats.summarise(_prefill_times(engine, arch, rows, length, repeats=30))
        if args.profile:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
            with profile(activities=activities, with_stack=args.stacks) as prof:
                _prefill_times(engine, arch, rows, length, repeats=2)
            averages = prof.key_averages()  # the host's time, then the GPU's
            tables = [averages.table(sort_by=key, row_limit=row_limit) for key, row_limit in
                      (("self_cpu_time_total", 30), ("self_cuda_time_total", 12))]  # fmt: skip
            if args.stacks:  # which lines of ours (or a library's) make the host's calls
                by_stack = prof.key_averages(group_by_stack_n=6)
                tables.append(by_stack.table(sort_by="self_cpu_time_total", row_limit=40))
            Path(f"{args.profile}.prefill_{spec}").write_text("\n".join(tables))
        print(
            f"{'mixed' if args.mixing else 'prefill'} step, {rows} new x {length} tokens beside "
            f"{args.batch} decoding, piecewise {engine.piecewise is not None}, Gated DeltaNet "
            f"{'captured' if args.piecewise_gdn else args.gdn_prefill} (split "
            f"{args.gdn_split}): "
            f"{stats.render(prefill)} over {prefill.n} steps"
        )
    if args.replays:  # last: the replays leave the batch's state as no real step would
        times = _replay_times(engine, args.replays, args.profile and f"{args.profile}.replays")
        print(
            f"decode graph replay, batch {args.batch}, pdl {args.pdl}, dense "
            f"{args.dense_kernel} (epilogues {args.dense_epilogues}), gdn decode {args.gdn_decode}: "
            f"{np.median(times) * 1e3:.1f} us a replay (runs "
            f"{', '.join(f'{t * 1e3:.1f}' for t in times)}; {args.replays} back to back each)"
        )


def _replay_times(engine: Engine, replays: int, profile: str | None = None) -> list[float]:
    """ms a replay of the next decode step's graph, in 5 runs of `replays` back-to-back replays
    timed by CUDA events (staged once: each replay reruns the same step's kernels on the state
    the last one left, which is what a decode step's device time depends on). `profile`: then
    20 replays under the torch profiler, their GPU busy time and op table written there (to
    set beside bench_decode_loop's profile of the served loop's iterations)."""
    if engine.graphs is None:
        raise SystemExit("--replays needs --graphs")
    step = engine.graphs.replay(engine.scheduler.schedule())
    if profile:

        def replay_and_wait() -> None:
            step.graph.replay()
            torch.cuda.synchronize()

        done = device_streams.profile_calls(replay_and_wait, 20, cuda=True)
        busy = device_streams.busy_us(done.spans) / 20
        Path(profile).write_text(
            f"GPU busy {busy / 1e3:.3f} ms a replay of {done.wall_us / 20 / 1e3:.3f} ms wall "
            f"(each replay waited for) over 20 replays\n{done.op_tables}"
        )
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(6):
        start.record()
        for _ in range(replays):
            step.graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    return times[1:]  # the first run warms clocks and caches


def _host_by_function(engine, steps: int) -> str:
    """`steps` decode steps under cProfile: the host's time by Python function, by own time
    and by cumulative time (cProfile's overhead inflates both; their shares are the figure)."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        _step(engine)
    profiler.disable()
    out = io.StringIO()
    out.write(f"host time by Python function over {steps} decode steps (cProfile)\n")
    for key in ("tottime", "cumulative"):
        pstats.Stats(profiler, stream=out).sort_stats(key).print_stats(40)
    return out.getvalue()


def _device_busy(prof, wall_us: float, steps: int) -> str:
    """The GPU's busy time a step (its kernels and copies on any stream: the step's own device
    time) against the step's wall time under the profiler; nothing on a CPU."""
    spans = device_streams.device_spans(prof.events())
    if not spans:
        return ""
    busy = device_streams.busy_us(spans)
    return (
        f"GPU busy {busy / steps / 1e3:.3f} ms a step of {wall_us / steps / 1e3:.3f} ms wall "
        f"({busy / wall_us:.0%}) over {steps} profiled steps\n"
    )


def _mask_note(engine: Engine) -> str:
    """What the printed line says of the node's logit mask (nothing for a model without)."""
    if engine.logit_mask is None:
        return ""
    _, width = engine.logit_mask(np.zeros(1, dtype=np.int64))
    vocab = engine.model.config.vocab_size
    return f", each row sampling its logit mask's {width:,} of {vocab:,} ids"


def _prefill_times(engine: Engine, arch: str, rows: int, length: int, repeats: int) -> list[float]:
    gen = torch.Generator().manual_seed(length)
    vocab = engine.model.config.vocab_size
    times = []
    for i in range(repeats + 3):
        rids = [1_000_000 + i * rows + j for j in range(rows)]
        for rid in rids:
            prompt = prompt_ids(arch, vocab, length, gen)
            msg = AddRequest(rid, prompt, 4, ignore_eos=True, temperature=0)
            engine.add_request(msg, prompt).handle = rid
        t0 = time.perf_counter()
        _step(engine)
        if i >= 3:  # the first steps compile kernels for the new shapes
            times.append((time.perf_counter() - t0) * 1e3)
        for rid in rids:
            engine.remove_request(rid)
    return times


if __name__ == "__main__":
    main()

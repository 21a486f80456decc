"""Would a prefill step on a CUDA stream of its own overlap the decode steps? The GPU's answer,
before the engine is built for it.

    python -m benchmarks.bench_prefill_overlap --size 0.8b --prefill 3x320 --every 18 \
        [--set engine.piecewise_gdn=true]

Why: at c=64 the decode loop runs at ~85% of its ceiling (docs/BENCHMARKS.md):
every ~18 decode iterations a prefill step of ~3 prompts stalls all 64 decoding rows for
~3.7 ms more than a decode iteration, and makes ~3 tokens where a decode step makes 64. The
decode step is latency-bound (its GEMMs stream weights at a third of the bandwidth, the
recurrence at 72%), so a prefill launched on a second stream might run in its gaps. How much
of the prefill's GPU time the decode steps hide decides whether an engine with a prefill
stream is worth building.

Two engines of the scenario's model in one process, so neither shares a staging buffer, a
plan or a graph pool with the other: D holds `--batch` requests decoding at `--context`
tokens on its decode graph (the same graph replayed: a decode step's device work), P runs one
prefill step of `--prefill RxL` new prompts (its piecewise runner, as served; the same
prompts prefilled again each time). A cycle is one prefill and `--every` decode steps, run
`--cycles` times:

- device: a spin kernel holds both streams while the host enqueues every cycle, so the time
  from its end to the last step's end is the GPU's alone: decode alone, prefill alone, both
  on one stream (the engine without engine.prefill_stream), both on two streams. `hidden` is the share of the prefill's
  own time the two streams save: (serial - two streams) / prefill alone.
- loop: the host drives it as the overlapped worker does (a decode step launched, then the
  one before waited for; `--host-ms` of host work per iteration standing in for staging and
  postprocess), the prefill launched after a cycle's first decode step, on the decode stream
  or its own; ms a cycle and the output tok/s it makes (every decode step's `--batch` tokens,
  the prefill's R first tokens).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from benchmarks.bench_gpu_step import build, prompt_ids
from benchmarks.options import positive_int
from engine.config import ConfigError, parse_overrides
from engine.messages import AddRequest
from engine.worker.engine import Engine
from engine.worker.main import build_engine
from engine.worker.planted import spin
from harness.scenario import load_scenario

CLOCK_HZ = 1.98e9  # the H200's SM clock under load: torch.cuda._sleep counts its cycles


@dataclass(frozen=True)
class DeviceTimes:
    """ms of GPU time a cycle, each arrangement held by a spin while enqueued."""

    decode: float
    prefill: float
    serial: float
    streams: float
    doubtful: int  # arrangements whose enqueue outlasted the spin (host time in the figure)


def hidden_share(t: DeviceTimes) -> float:
    """The share of the prefill's own GPU time that two streams save against one."""
    return (t.serial - t.streams) / t.prefill if t.prefill > 0 else 0.0


def held_ms(work: Callable[[torch.cuda.Stream, torch.cuda.Stream], None], two: bool,
            spin_ms: float) -> tuple[float, bool]:  # fmt: skip
    """Run `work(decode_stream, prefill_stream)` behind a spin that holds both streams; the
    GPU's ms from the spin's end to the last stream's end, and whether the host's enqueue
    outlasted the spin (then the figure has host time in it)."""
    gate, a = torch.cuda.Stream(), torch.cuda.Stream()
    b = torch.cuda.Stream() if two else a
    start = torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(gate):
        torch.cuda._sleep(int(spin_ms * 1e-3 * CLOCK_HZ))
        start.record()
    for stream in {a, b}:
        stream.wait_event(start)
    t0 = time.perf_counter()
    work(a, b)
    host_ms = (time.perf_counter() - t0) * 1e3
    ends = []
    for stream in {a, b}:
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)
        ends.append(end)
    torch.cuda.synchronize()
    return max(start.elapsed_time(end) for end in ends), host_ms >= spin_ms


def device_times(decode, prefill, every: int, cycles: int, spin_ms: float) -> DeviceTimes:
    def run(with_decode: bool, with_prefill: bool):
        def work(a, b):
            for _ in range(cycles):
                if with_prefill:
                    with torch.cuda.stream(b):
                        prefill()
                if with_decode:
                    with torch.cuda.stream(a):
                        for _ in range(every):
                            decode()

        return work

    arrangements = [(run(True, False), False), (run(False, True), False),
                    (run(True, True), False), (run(True, True), True)]  # fmt: skip
    figures, doubtful = [], 0
    for work, two in arrangements:
        ms, late = held_ms(work, two, spin_ms)
        figures.append(ms / cycles)
        doubtful += late
    return DeviceTimes(*figures, doubtful=doubtful)


def loop_ms(decode, prefill, every: int, cycles: int, two: bool, host_ms: float) -> float:
    """ms a cycle with the host in the loop, as the overlapped worker runs: each iteration
    launches a decode step, then waits for the one before (and spends `host_ms` as if
    postprocessing it); a cycle's first iteration also launches the prefill, on the decode
    stream (`two` False: as without engine.prefill_stream, the decode steps wait for it) or its
    own."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    before = None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(cycles):
        for i in range(every):
            decode()
            done = torch.cuda.Event()
            done.record(main)
            if i == 0:
                if two:  # its own engine: its staging copies and plans on its stream
                    with torch.cuda.stream(side):
                        prefill()
                else:
                    prefill()
            if before is not None:
                before.synchronize()
            spin(host_ms / 1e3)
            before = done
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / cycles


def prefill_engine(scenario, rows: int, length: int, overrides: dict) -> tuple[Engine, Callable]:
    """An engine of the scenario's model with `rows` prompts of `length` tokens admitted, and
    a call that launches their prefill step (the same prompts again each call)."""
    config = replace(scenario.engine, cuda_graphs=False, prefill_hold_steps=0, **overrides,
                     prefill_stream=False)  # this benchmark places the streams itself  # fmt: skip
    engine, _ = build_engine(scenario.model, config)
    gen = torch.Generator().manual_seed(length)
    vocab = engine.model.config.vocab_size
    for rid in range(rows):
        prompt = prompt_ids(scenario.model.arch, vocab, length, gen)
        msg = AddRequest(rid, prompt, 16, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid
    scheduled = engine.scheduler.schedule()
    if len(scheduled) != rows or any(r.num_new != length for r in scheduled):
        raise ValueError(f"{rows} x {length} tokens do not fit one step of this engine")

    def prefill() -> None:
        for row in scheduled:
            row.request.num_cached = 0
        engine.launch(scheduled)

    return engine, prefill


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_prefill_overlap")
    parser.add_argument("--size", default=None, help="default: the scenario's for this machine")
    parser.add_argument("--batch", type=positive_int, default=64)
    parser.add_argument("--context", type=positive_int, default=512)
    parser.add_argument("--prefill", default="3x320", metavar="RxL")
    parser.add_argument("--every", type=positive_int, default=18, help="decode steps a prefill")
    parser.add_argument("--cycles", type=positive_int, default=4)
    parser.add_argument("--loop-cycles", type=positive_int, default=20)
    parser.add_argument("--host-ms", type=float, default=1.0)
    parser.add_argument("--spin-ms", type=float, default=400.0)
    parser.add_argument(
        "--set", action="append", default=[], metavar="engine.KEY=VALUE",
        help="an engine setting for both engines (e.g. engine.piecewise_gdn=true)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: bench_prefill_overlap measures CUDA streams; no CUDA here", file=sys.stderr)
        return 2
    try:
        rows, length = (int(part) for part in args.prefill.split("x"))
        overrides = parse_overrides(",".join(args.set))
        if any(not key.startswith("engine.") for key in overrides):
            raise ValueError("--set takes engine settings only (engine.KEY=VALUE)")
        engine_overrides = {key.removeprefix("engine."): v for key, v in overrides.items()}
        scenario = load_scenario("qwen35", args.size)
        # the decode graph replays one staged step: its requests need no room to grow
        decoder = build(scenario, args.batch, args.context, 16, "cuda", True,
                        **{**engine_overrides, "piecewise_graphs": False, "piecewise_gdn": False,
                           "prefill_stream": False})  # fmt: skip
        _, prefill = prefill_engine(scenario, rows, length, engine_overrides)
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if decoder.graphs is None:
        print("error: the decode engine has no decode graphs (kernels)", file=sys.stderr)
        return 2
    step = decoder.graphs.replay(decoder.scheduler.schedule())
    decode = step.graph.replay
    for _ in range(3):  # compiles, plans, first touches
        prefill()
        decode()
    torch.cuda.synchronize()
    print(
        f"size {scenario.size}, decode batch {args.batch} at context {args.context} (graph), "
        f"prefill {rows} x {length} (piecewise, {overrides or 'scenario defaults'}), "
        f"{args.every} decode steps a prefill"
    )
    t = device_times(decode, prefill, args.every, args.cycles, args.spin_ms)
    print(
        f"device, ms a cycle (median-free: {args.cycles} cycles held by a spin): decode alone "
        f"{t.decode:.2f} ({t.decode / args.every:.3f} a step), prefill alone {t.prefill:.2f}, "
        f"one stream {t.serial:.2f}, two streams {t.streams:.2f}: hidden "
        f"{hidden_share(t):.0%} of the prefill"
        + (f" ({t.doubtful} arrangements' enqueue outlasted the spin)" if t.doubtful else "")
    )
    tokens = args.every * args.batch + rows
    for two in (False, True, False, True):
        ms = loop_ms(decode, prefill, args.every, args.loop_cycles, two, args.host_ms)
        print(
            f"loop, {'two streams' if two else 'one stream '}: {ms:.2f} ms a cycle = "
            f"{tokens / ms * 1e3:,.0f} output tok/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The engine's eager step on one GPU: decode at a batch size over contexts of a length.

    python -m benchmarks.bench_gpu_step --size 0.8b --batch 64 --context 512 --kernels cuda

Runs the engine's own step (`Engine.launch`, the wait, the host copy, `step_finished`) on a
batch of requests whose prompts are prefilled first, then times decode steps: wall time per
step from schedule to the tokens on the host (what the worker loop pays), median and spread.
`--profile FILE` adds a torch profiler table of a few steps (where the time goes).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from engine.config import load_scenario
from engine.messages import AddRequest
from engine.models import build_model
from engine.worker.engine import Engine


def _step(engine: Engine) -> int:
    rows = engine.scheduler.schedule()
    pending = engine.launch(rows)
    pending.wait()
    engine.step_finished(pending.to_host())
    return len(rows)


def build(size: str, batch: int, context: int, steps: int, kernels: str, graphs: bool) -> Engine:
    scenario = load_scenario("qwen35", size)
    config = replace(scenario.engine, kernels=kernels, max_rows=batch, cuda_graphs=graphs)
    spec = scenario.model
    model = build_model(spec.arch, spec.preset, spec.seed, config.dtype, config.device)
    engine = Engine(model, config)
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    for rid in range(batch):
        prompt = torch.randint(1, vocab, (context,), generator=gen).tolist()
        msg = AddRequest(rid, prompt, steps + 64, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid  # the runtime handle a worker would set
    while any(not r.prefill_done for r in engine.requests.values()):
        _step(engine)
    return engine


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_gpu_step")
    parser.add_argument("--size", default="0.8b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--kernels", default="cuda", choices=["cuda", "torch", "auto"])
    parser.add_argument("--graphs", action=argparse.BooleanOptionalAction, default=False)
    parser.add_argument("--profile", default=None, help="write a profiler table here")
    args = parser.parse_args(argv)
    steps = args.steps + args.warmup + 5
    engine = build(args.size, args.batch, args.context, steps, args.kernels, args.graphs)
    for _ in range(args.warmup):
        _step(engine)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        _step(engine)
        times.append((time.perf_counter() - t0) * 1e3)
    q = statistics.quantiles(times, n=10)
    median = statistics.median(times)
    print(
        f"decode step, size {args.size}, batch {args.batch}, context {args.context}, "
        f"kernels {engine.ops.name}, graphs {engine.graphs is not None}: median {median:.3f} ms (p10 {q[0]:.3f}, p90 {q[-1]:.3f}) "
        f"over {args.steps} steps = {args.batch / median * 1e3:,.0f} tok/s"
    )
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                _step(engine)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)
        with open(args.profile, "w") as out:
            out.write(table)
        print(table[:6000])


if __name__ == "__main__":
    main()

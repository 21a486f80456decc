"""Probe (temporary): the decode-graph-vs-eager check of test_08b run for several engines in
one process, in an order given on the command line, printing per count the graph-vs-eager
difference and each engine's eager and graph logits against the first engine's.

    python -m benchmarks.probe_graph_order flashinfer triton flashinfer
    python -m benchmarks.probe_graph_order --poison triton flashinfer

`--poison`: before each engine is built, and again once it is, the memory the caching allocator
hands out next is filled with 0xFF bytes (NaN in bf16 and fp32, -1 in int32) and, the first
time, given back to the driver too (a later cudaMalloc, a graph pool's, may get those pages
back unzeroed). A kernel that reads memory no one wrote then reads NaN: a difference that came
and went with what ran before becomes a NaN every time.
"""

from __future__ import annotations

import gc
import sys
from dataclasses import replace

import torch

from engine.messages import AddRequest
from engine.models import build_model
from engine.worker.engine import Engine
from harness.scenario import load_scenario

COUNTS = (1, 3, 8, 20, 33, 64)


def poison(release: bool) -> None:
    """Fill up to 8 GiB of fresh device memory with 0xFF and free it (see the module's doc);
    `release`: give it back to the driver as well."""
    chunk = 256 << 20
    room = max(torch.cuda.mem_get_info()[0] - (4 << 30), 0)
    blocks = [
        torch.full((chunk,), 0xFF, dtype=torch.uint8, device="cuda")
        for _ in range(min(room, 8 << 30) // chunk)
    ]
    torch.cuda.synchronize()
    del blocks
    if release:
        torch.cuda.empty_cache()


def one(decode_attention: str, poisoned: bool = False) -> dict:
    if poisoned:
        poison(release=True)
        poison(release=False)
    config = replace(
        load_scenario("qwen35", "0.8b").engine, kv_pages=1024, state_slots=72, max_rows=64,
        decode_attention=decode_attention,
    )  # fmt: skip
    model = build_model("qwen35", "0.8b", 0, "bfloat16", "cuda")
    engine = Engine(model, config)
    if poisoned:
        poison(release=False)
    for rid in range(64):
        prompt = [(17 * rid + 3 * j) % 240_000 + 1 for j in range(1 + 3 * rid)]
        engine.add_request(
            AddRequest(rid, prompt, 16, ignore_eos=True, temperature=0), prompt
        ).handle = rid
    while any(not r.prefill_done for r in engine.requests.values()):
        engine.run_step()
    rows = engine.scheduler.schedule()
    cache = engine.cache
    tensors = [*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state]
    torch.cuda.synchronize()  # every stream idle (the prefill lane's too) before the snapshot
    saved = [t.clone() for t in tensors]
    out = {"state": [t.float().norm().item() for t in cache.ssm_state[:2]]}
    for count in COUNTS:
        for t, s in zip(tensors, saved, strict=True):
            t.copy_(s)
        with torch.inference_mode():
            batch = engine.inputs.stage(rows[:count], cache, engine.ops)
            engine.ops.begin_step(batch)
            eager = model(batch, cache).float().clone()
        for t, s in zip(tensors, saved, strict=True):
            t.copy_(s)
        graph = engine.graphs.replay(rows[:count]).logits[:count].float().clone()
        torch.cuda.synchronize()
        out[count] = (eager, graph)
    del engine, model, cache, tensors, saved, rows
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main(order: list[str]) -> None:
    poisoned = "--poison" in order
    order = [kind for kind in order if kind != "--poison"]
    first = None
    for n, kind in enumerate(order):
        got = one(kind, poisoned)
        print(f"engine {n} ({kind}) prefilled state norms {got['state']}")
        for count in COUNTS:
            eager, graph = got[count]
            diff = (graph - eager).abs()
            worst = divmod(diff.argmax().item(), diff.shape[-1])
            nan = f" NaN eager {eager.isnan().sum().item()} graph {graph.isnan().sum().item()}"
            line = nan + (
                f"  count {count:2d}: |graph-eager| {diff.max().item():.3f} at (row, id) {worst}"
                f" eager {eager[worst].item():.3f} graph {graph[worst].item():.3f}"
                f" max|logit| {eager.abs().max().item():.2f}"
            )
            if first is not None:
                e0, g0 = first[count]
                line += (
                    f"  |eager-eager0| {(eager - e0).abs().max().item():.3f}"
                    f"  |graph-graph0| {(graph - g0).abs().max().item():.3f}"
                )
            print(line, flush=True)
        first = first or got


if __name__ == "__main__":
    main(sys.argv[1:] or ["flashinfer", "triton", "flashinfer"])

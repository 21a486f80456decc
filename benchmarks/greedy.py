"""Greedy tokens from a worker (`greedy_run`): the GPU tests' engine runs (tests/test_gpu.py)
and the prefill-stream probe (benchmarks/probe_prefill_stream.py) drive a worker of the tiny
scenario's settings at a preset the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from engine.messages import AddRequest, StepFrames
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer
from harness.scenario import load_scenario


def greedy_run(
    device: str,
    dtype: str,
    preset: str,
    prompts: list[list[int]],
    n: int,
    kernels: str = "auto",
    overlap: bool = False,
    stagger: bool = False,
    steps: list | None = None,
    prepare: Callable | None = None,
    **engine,
):
    """Each prompt's n greedy tokens from a worker; `stagger`: one arrival a step (steps of
    changing sizes) instead of all at once; `steps`, when given, gets each postprocessed step's
    rows (their request ids, in order); `prepare(worker)` runs before the first request;
    `engine`: settings over the scenario's. Returns (rid -> tokens, the worker's model)."""
    scenario = load_scenario("qwen35", "tiny")
    settings = {"kv_pages": 1024, "max_rows": 64} | engine
    config = replace(
        scenario.engine, device=device, dtype=dtype, kernels=kernels, overlap=overlap, **settings
    )
    spec = replace(scenario.model, preset=preset)
    frames: list[StepFrames] = []
    worker = build_worker(spec, config, PhaseTimer(0, "g", []), frames.append)
    if prepare is not None:
        prepare(worker)
    for rid, prompt in enumerate(prompts):
        worker.handle(AddRequest(rid, prompt, n, ignore_eos=True, temperature=0))
        if stagger:
            worker.iteration()
    while worker.iteration():
        pass
    out: dict[int, list[int]] = {rid: [] for rid in range(len(prompts))}
    for step in frames:
        for frame in step.frames:
            out[frame.rid].extend(frame.tokens)
    if steps is not None:
        steps.extend(tuple(frame.rid for frame in step.frames) for step in frames)
    return out, worker.engine.model

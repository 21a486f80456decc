"""What a 16-bit recurrent state (`engine.state_dtype: bfloat16` or `float16`) costs in
accuracy: greedy decodes of the same prompts with the Gated DeltaNet state slots stored in 16
bits against fp32.

    python -m benchmarks.bench_state_accuracy --size 0.8b --requests 16 --prompt 128 --tokens 512
    python -m benchmarks.bench_state_accuracy --state-dtype float16 ...

Three runs after the fp32 reference (every one the engine's own steps, greedy):
- free: the 16-bit state, free-running: per request, the first output position whose token differs
  from the reference's (a flip compounds: everything after it differs).
- forced: the 16-bit state, teacher-forced (each step's input is the reference's token, whatever it
  chose): the share of positions whose greedy choice equals the reference's, by position band,
  so rounding that accumulates over a long decode shows as a falling band.
- floor: fp32 state, teacher-forced, the batch one request larger: how often the choice flips
  from GEMM blocking alone (a near-tie among the logits), the noise any change pays.
On a CPU the tiny size in fp32 runs it in seconds (tests/test_bench_state_accuracy.py).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import torch

from benchmarks import stats
from engine.config import load_scenario
from engine.messages import AddRequest
from engine.models import build_model, vocab_size
from engine.worker.engine import Engine

BANDS = (0, 64, 128, 256, 512, 1024)


def _engine(size: str, state_dtype: str, rows: int, **overrides) -> Engine:
    scenario = load_scenario("qwen35", size)
    config = replace(
        scenario.engine, state_dtype=state_dtype, max_rows=rows, state_slots=rows + 2,
        **overrides,
    )  # fmt: skip
    spec = scenario.model
    model = build_model(spec.arch, spec.preset, spec.seed, config.dtype, config.device)
    return Engine(model, config)


def greedy(
    engine: Engine, prompts: list[list[int]], tokens: int, forced: dict | None = None
) -> dict[int, list[int]]:
    """Each prompt's `tokens` greedy choices (request id = its index). With `forced`, the
    input after each step is the forced token at that position, not the one chosen."""
    for rid, prompt in enumerate(prompts):
        msg = AddRequest(rid, prompt, tokens, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid
    chosen: dict[int, list[int]] = {rid: [] for rid in range(len(prompts))}
    while engine.scheduler.has_work():
        _, out = engine.run_step()
        for rid, token in zip(out.rids.tolist(), out.tokens.tolist(), strict=True):
            request = engine.requests[rid]
            chosen[rid].append(token)
            if forced is not None and rid in forced:
                request.tokens[-1] = forced[rid][len(chosen[rid]) - 1]
            if len(chosen[rid]) >= tokens:
                engine.remove_request(rid)
    return chosen


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def agreement_by_band(runs: dict[int, list[int]], reference: dict[int, list[int]]) -> dict:
    """The share of positions whose choice equals the reference's, per position band."""
    bands = {}
    for lo, hi in zip(BANDS, BANDS[1:], strict=False):
        pairs = [(r[i], reference[rid][i]) for rid, r in runs.items() for i in range(lo, hi)
                 if i < len(r)]  # fmt: skip
        if pairs:
            bands[f"{lo}-{hi}"] = sum(x == y for x, y in pairs) / len(pairs)
    return bands


def measure(
    size: str, requests: int, prompt: int, tokens: int, seed: int = 0,
    state_dtype: str = "bfloat16",
) -> dict:  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(load_scenario("qwen35", size).model)
    prompts = [torch.randint(1, vocab, (prompt,), generator=gen).tolist() for _ in range(requests)]
    extra = [torch.randint(1, vocab, (prompt,), generator=gen).tolist()]

    def run(state_dtype: str, batch: list[list[int]], forced=None) -> dict[int, list[int]]:
        engine = _engine(size, state_dtype, len(batch))
        try:
            return greedy(engine, batch, tokens, forced)
        finally:
            del engine
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    reference = run("float32", prompts)
    free = run(state_dtype, prompts)
    forced = run(state_dtype, prompts, reference)
    floor = run("float32", prompts + extra, reference)
    floor.pop(len(prompts))  # the extra request only changes the batch
    firsts = [first_difference(free[rid], reference[rid]) for rid in reference]
    diverged_at = stats.summarise([f for f in firsts if f is not None])
    return {
        "size": size, "state_dtype": state_dtype, "requests": requests, "prompt": prompt,
        "tokens": tokens,
        "free_identical": firsts.count(None),
        "free_first_difference_median": diverged_at.median if diverged_at else None,
        "forced_agreement": agreement_by_band(forced, reference),
        "floor_agreement": agreement_by_band(floor, reference),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_state_accuracy")
    parser.add_argument("--size", default="0.8b")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--state-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = parser.parse_args(argv)
    figures = measure(args.size, args.requests, args.prompt, args.tokens,
                      state_dtype=args.state_dtype)  # fmt: skip
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

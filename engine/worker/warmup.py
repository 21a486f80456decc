"""The start-up warmup: a few throwaway steps through the production path before Ready.

A step's kernels compile on first use (Triton, FlashInfer's JIT). Capturing the decode graphs
runs the decode path's; nothing ran the prefill path's, so the first real requests waited for
their compiles (an H200 server's first 64 requests: 104 s to the first token). So the worker
runs, through the engine's scheduler and `Engine.launch`: a prefill step of one row below the
Gated DeltaNet split threshold and one above, one of several rows, a few decode steps, a
mixed step when `engine.mixing` (or `split_mixed`) is on, greedy and sampled rows (top-k,
top-p, log-probs); then it removes its requests, leaving the engine as it found it
(INVARIANTS 54). The sampled rows are seeded: they draw from generators of their own, never
the process-wide one that unseeded requests share. The strict loop's steps only (an overlapped loop's fed decode rows
gather on the device, nothing to compile); the codec stream stages are not warmed (their
graphs' capture runs their kernels; eager codec steps compile on the first speech request).
"""

from __future__ import annotations

import logging
import time

from engine.messages import AddRequest
from engine.worker.scheduler import ScheduledRow
from engine.worker.worker import Worker

log = logging.getLogger("engine.worker")

DECODE_STEPS = 3  # after the several-row prefill; one of them mixed when mixing is on


def warm_up(worker: Worker) -> str:
    """Run the warmup's steps on the worker's engine, sending nothing and recording no span;
    what ran, as the log line says it."""
    engine, start = worker.engine, time.perf_counter()
    parts, vocab = engine.config.parts, engine.model.config.vocab_size
    split, decoding = parts.kernels.gdn_split_from_tokens, DECODE_STEPS + 1
    room = parts.cache.max_model_len - decoding - 1
    longest = max(1, min(parts.scheduler.max_tokens_per_step, room))

    def throwaway(n: int, tokens: int, max_tokens: int = 1, **sampling) -> AddRequest:
        """Request -n (no API server's id is negative), its prompt clipped to fit a step."""
        prompt = [(31 * n + i) % vocab for i in range(max(1, min(tokens, longest)))]
        return AddRequest(-n, prompt, max_tokens, ignore_eos=True, **sampling)

    filtered = dict(temperature=0.8, top_p=0.9, top_k=20, seed=4, logprobs=True)
    arrivals = [  # the requests that arrive before each step
        [throwaway(1, split // 2, temperature=0)],
        [throwaway(2, split + split // 2, temperature=0)],
        [
            throwaway(3, split // 4, decoding, temperature=0),
            throwaway(4, split // 2, decoding, **filtered),
            throwaway(5, split, decoding, temperature=1.0, seed=5),
        ],
        [],  # a decode step, then a prompt beside the decoding rows
        [throwaway(6, split // 2, temperature=0)] if parts.scheduler.mixes else [],
    ]
    arrived, steps = engine.arrivals, []
    while arrivals or engine.scheduler.has_work():
        for msg in arrivals.pop(0) if arrivals else []:
            # the handle only labels its rows' output: they never reach the postprocess
            engine.add_request(msg, list(msg.prompt)).handle = msg.rid
        rows, out = engine.run_step()
        if out is None:
            continue
        for rid in out.rids.tolist():
            if engine.requests[rid].num_output >= engine.requests[rid].max_tokens:
                engine.remove_request(rid)
        steps.append(rows)
    engine.arrivals = arrived
    engine.scheduler.schedule()  # nothing left: an empty schedule restarts the hold's count
    summary = f"{len(steps)} steps ({_kinds(steps)}), {time.perf_counter() - start:.1f} s"
    log.info("warmup: %s%s", summary, "; codec stages not warmed" if worker.stages else "")
    return summary


def _kinds(steps: list[list[ScheduledRow]]) -> str:
    """`prefill 1x128, 1x384, 3x64-256, decode x2, mixed x1, sampled`: each prefill step's
    rows x new tokens, then how many decode and mixed steps, and whether any row sampled."""
    walks = [{r.walk for r in rows} for rows in steps]
    prefills = [
        [r.num_new for r in rows] for rows, w in zip(steps, walks, strict=True) if w == {"prefill"}
    ]
    parts = [f"{len(n)}x{min(n)}" + (f"-{max(n)}" if max(n) > min(n) else "") for n in prefills]
    parts.append(f"decode x{walks.count({'decode'})}")
    if mixed := sum(len(w) == 2 for w in walks):
        parts.append(f"mixed x{mixed}")
    if any(not r.request.sampling.greedy for rows in steps for r in rows):
        parts.append("sampled")
    return "prefill " + ", ".join(parts)

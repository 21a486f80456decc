"""Probe: do two staggered runs that take the same steps give the same tokens with the prefill
on its own stream? (docs/GPU_TESTS.md, "Open": an H100 run of
test_08b_prefill_stream_emits_the_tokens_of_one_stream[False] read two such runs apart.)

    python -m benchmarks.probe_prefill_stream --runs 8              # 0.8b, bf16, CUDA
    python -m benchmarks.probe_prefill_stream --runs 8 --serial     # the streams never overlap
    python -m benchmarks.probe_prefill_stream --size tiny --device cpu --runs 2

Each run is the test's: a worker of the tiny scenario's settings at the size's preset, the
overlapped loop, `engine.prefill_stream` on, eight prompts arriving an iteration apart, 32
greedy tokens each. It prints per run the steps it took (each postprocessed step's request
ids, hashed) and its tokens (hashed), then the runs grouped by their steps. `--serial`: every
prefill step waits for the decode step launched beside it (`Engine.mark` gives no event, so
`launch_prefill` waits for all the current stream holds): if the difference goes with it, the
two steps running at once is the cause. Exits 1 when two runs of the same steps gave
different tokens, 0 otherwise (also when no two runs took the same steps: it says so).
"""

from __future__ import annotations

import argparse
import hashlib
import sys

from benchmarks.greedy import greedy_run
from benchmarks.options import positive_int

LENGTHS = (5, 40, 300, 700, 128, 256, 33, 512)  # the test's: below and above the split kernel's


def run_once(size: str, device: str, serial: bool, piecewise_gdn: bool, tokens: int):
    """One staggered run: (the steps it took, each request's tokens)."""
    vocab = 240_000 if size != "tiny" else 4_000
    prompts = [[(13 * rid + j) % vocab + 1 for j in range(n)] for rid, n in enumerate(LENGTHS)]
    settings = {"piecewise_gdn": True} if piecewise_gdn else {}
    steps: list[tuple[int, ...]] = []
    out, _ = greedy_run(
        device, "bfloat16" if device == "cuda" else "float32", size, prompts, tokens,
        overlap=True, stagger=True, steps=steps, prefill_stream=True,
        prepare=_serial if serial else None, **settings,
    )  # fmt: skip
    return tuple(steps), out


def _serial(worker) -> None:
    """Every prefill waits for all the current stream holds (`Engine.mark` gives no event)."""
    worker.engine.mark = lambda: None


def first_difference(a: list[int], b: list[int]) -> int:
    """The index of the first token where two equally long streams part."""
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def digest(value) -> str:
    return hashlib.sha1(repr(value).encode()).hexdigest()[:10]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="0.8b")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--runs", type=positive_int, default=6)
    parser.add_argument("--tokens", type=positive_int, default=32)
    parser.add_argument("--serial", action="store_true", help="no prefill beside a decode step")
    parser.add_argument("--piecewise-gdn", action="store_true")
    args = parser.parse_args(argv)
    by_steps: dict[tuple, list[tuple[int, dict]]] = {}
    for run in range(1, args.runs + 1):
        steps, tokens = run_once(args.size, args.device, args.serial, args.piecewise_gdn,
                                 args.tokens)  # fmt: skip
        print(f"run {run}: {len(steps)} steps {digest(steps)}, tokens {digest(tokens)}")
        by_steps.setdefault(steps, []).append((run, tokens))
    parted = 0
    for steps, runs in by_steps.items():
        if len(runs) < 2:
            continue
        first_run, first = runs[0]
        for run, tokens in runs[1:]:
            apart = [rid for rid in first if first[rid] != tokens[rid]]
            parted += bool(apart)
            where = ", ".join(
                f"request {rid} from token {first_difference(first[rid], tokens[rid])}"
                for rid in apart
            )
            print(f"steps {digest(steps)}: run {run} against run {first_run}: "
                  f"{'different tokens: ' + where if apart else 'the same tokens'}")  # fmt: skip
    if all(len(runs) < 2 for runs in by_steps.values()):
        print(f"no two of {args.runs} runs took the same steps: nothing to compare")
    mode = "serial" if args.serial else "beside"
    print(f"{mode}: {len(by_steps)} step sequences over {args.runs} runs; "
          f"{parted} same-steps pairs with different tokens")  # fmt: skip
    return 1 if parted else 0


if __name__ == "__main__":
    sys.exit(main())

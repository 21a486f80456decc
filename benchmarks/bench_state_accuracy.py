"""What a 16-bit recurrent state (`engine.state_dtype: bfloat16` or `float16`) costs in
accuracy: greedy decodes of the same prompts with the Gated DeltaNet state slots stored in 16
bits against fp32.

    python -m benchmarks.bench_state_accuracy --size 0.8b --requests 16 --prompt 128 --tokens 512
    python -m benchmarks.bench_state_accuracy --state-dtype float16 ...

The fp32 reference also records, at every (request, position), the margin of its choice: the
top-1 minus the top-2 logit of the distribution the choice was made from (logit units; the
sampler's fp32 logits, on the GPU the decode graph's bf16 ones widened). Three runs follow it
(every one the engine's own steps, greedy):
- free: the 16-bit state, free-running: per request, the first output position whose token differs
  from the reference's (a flip compounds: everything after it differs).
- forced: the 16-bit state, teacher-forced (each step's input is the reference's token, whatever it
  chose): the share of positions whose greedy choice equals the reference's, by position band,
  so rounding that accumulates over a long decode shows as a falling band; and by band of the
  reference's margin (`forced_agreement_by_margin`: each band's share of the positions, their
  count, its agreement), so flips of near-ties, which any rounding makes and a trained model's
  decisive logits rarely meet, read apart from flips of choices the reference led clearly.
- floor: fp32 state, teacher-forced, the batch one request larger: how often the choice flips
  from GEMM blocking alone (a near-tie among the logits), the noise any change pays. On the GPU
  its decode steps take the graph's own argmax, the reference's the sampler (to record the
  margins), so a floor of 100% also shows that the two chose alike.
- versus (`--versus engine.KEY=VALUE`, each its own run): fp32 state, teacher-forced, one
  engine setting changed, e.g. `engine.dense_kernel=torch` (cuBLAS's GEMMs for ours): what a
  change of kernel that keeps the model's dtypes, one the project has already taken, flips. A
  16-bit state whose agreement by margin matches such a run's rounds no more than a GEMM's
  summation order does; one that flips clear margins a kernel change keeps does not.

The margin bands (`MARGIN_BANDS`): [0, 0.05) near-ties, a few of bf16's steps at logits of 2
to 8 (1/64 to 1/32: the 0.8b's decode graph rounds its logits to bf16, exact ties included);
[0.05, 0.2) close; [0.2, 1) clear; [1, inf) decisive, a whole logit. On the tiny model (fp32,
8 requests, 16-token prompts, 256 tokens: 2,048 positions) the reference's margins have a
median of 0.59 and quartiles of 0.26 and 1.11, so every band holds positions (6%, 14%, 51%,
29%). There an fp16 state flipped 8 of the 117 near-ties and nothing above 0.025; a bf16 state
flipped 45 of the 117, 57 of the 286 close, 11 of the 1,053 clear (the largest margin 0.68)
and none of the 592 decisive.
On a CPU the tiny size in fp32 runs it in seconds (tests/test_bench_state_accuracy.py).
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, replace

import torch

from benchmarks import stats
from engine.layers.sampler import SamplingParams
from engine.messages import AddRequest
from engine.models import build_model, vocab_size
from engine.worker.engine import Engine
from harness.scenario import ConfigError, load_scenario, parse_overrides

BANDS = (0, 64, 128, 256, 512, 1024)
MARGIN_BANDS = (0.0, 0.05, 0.2, 1.0, math.inf)


def _engine(size: str, state_dtype: str, rows: int, settings: dict | None = None) -> Engine:
    """`settings`: scenario overrides (`engine.KEY: value`) over the size's."""
    scenario = load_scenario("qwen35", size, settings)
    config = replace(scenario.engine, state_dtype=state_dtype, max_rows=rows, state_slots=rows + 2)
    spec = scenario.model
    model = build_model(spec.arch, spec.preset, spec.seed, config.dtype, config.device)
    return Engine(model, config)


class MarginRecorder:
    """An engine's ops whose `sample` first keeps each row's top-1 minus top-2 logit: the
    margin of the distribution the choice is made from. Its rows are the step's sampled rows,
    in the order of the step's output rids (Engine.launch samples `logits[sampled]`,
    PendingStep.to_host lists `sampled`'s rids). Everything else is the wrapped ops'. It wraps
    one engine's ops, never the shared object itself (the CPU's ops are one for every engine)."""

    def __init__(self, ops) -> None:
        self.ops = ops
        self.margins: torch.Tensor | None = None

    def __getattr__(self, name: str):
        return getattr(self.ops, name)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams], output_index: list[int]):
        top = logits.topk(2, dim=-1).values
        self.margins = top[:, 0] - top[:, 1]
        return self.ops.sample(logits, params, output_index)

    def take(self) -> list[float]:
        """The last sampled step's margins (once: a step that samples no row records none)."""
        margins, self.margins = self.margins, None
        return margins.tolist()


@dataclass(frozen=True)
class Decodes:
    tokens: dict[int, list[int]]  # request id -> its greedy choices
    margins: dict[int, list[float]] | None  # request id -> each choice's margin, if recorded


def greedy(
    engine: Engine, prompts: list[list[int]], tokens: int, forced: dict | None = None,
    margins: bool = False,
) -> Decodes:  # fmt: skip
    """Each prompt's `tokens` greedy choices (request id = its index). With `forced`, the
    input after each step is the forced token at that position, not the one chosen. With
    `margins`, each choice's top-1 minus top-2 logit too: the requests ask for log-probs, so
    every step goes through the sampler (a decode graph's greedy step takes its own argmax
    and skips it), whose greedy choice is the same first maximum of the same logits."""
    recorder = None
    if margins:  # Engine.launch samples through engine.ops
        recorder = engine.ops = MarginRecorder(engine.ops)
    for rid, prompt in enumerate(prompts):
        msg = AddRequest(rid, prompt, tokens, ignore_eos=True, temperature=0, logprobs=margins)
        engine.add_request(msg, prompt).handle = rid
    chosen: dict[int, list[int]] = {rid: [] for rid in range(len(prompts))}
    recorded: dict[int, list[float]] = {rid: [] for rid in range(len(prompts))}
    while engine.scheduler.has_work():
        _, out = engine.run_step()
        rids = out.rids.tolist()
        if recorder is not None and rids:
            for rid, margin in zip(rids, recorder.take(), strict=True):
                recorded[rid].append(margin)
        for rid, token in zip(rids, out.tokens.tolist(), strict=True):
            request = engine.requests[rid]
            chosen[rid].append(token)
            if forced is not None and rid in forced:
                request.tokens[-1] = forced[rid][len(chosen[rid]) - 1]
            if len(chosen[rid]) >= tokens:
                engine.remove_request(rid)
    return Decodes(chosen, recorded if margins else None)


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


def agreement_by_margin(
    runs: dict[int, list[int]], reference: dict[int, list[int]], margins: dict[int, list[float]]
) -> dict:
    """Per band of the reference's margin (`MARGIN_BANDS`, top-1 minus top-2 logit): the
    band's share of the reference's positions, their count, and the share of them whose
    choice equals the reference's (None for an empty band)."""
    positions = [
        (margin, runs[rid][i] == reference[rid][i])
        for rid, row in margins.items() for i, margin in enumerate(row)
    ]  # fmt: skip
    bands = {}
    for lo, hi in zip(MARGIN_BANDS, MARGIN_BANDS[1:], strict=False):
        agree = [same for margin, same in positions if lo <= margin < hi]
        bands[f"{lo:g}-{hi:g}"] = {
            "share": len(agree) / len(positions),
            "positions": len(agree),
            "agreement": sum(agree) / len(agree) if agree else None,
        }
    return bands


def measure(
    size: str, requests: int, prompt: int, tokens: int, seed: int = 0,
    state_dtype: str = "bfloat16", versus: tuple[str, ...] = (), base: str | None = None,
) -> dict:  # fmt: skip
    """`versus`: engine settings (`engine.KEY=VALUE`), each a teacher-forced fp32 run of its own.
    `base`: settings under every run (`--set`), e.g. `engine.device=cpu,engine.dtype=float32`
    to read a GPU size's shapes on a CPU."""
    under = parse_overrides(base)
    gen = torch.Generator().manual_seed(seed)
    vocab = vocab_size(load_scenario("qwen35", size).model)
    prompts = [torch.randint(1, vocab, (prompt,), generator=gen).tolist() for _ in range(requests)]
    extra = [torch.randint(1, vocab, (prompt,), generator=gen).tolist()]

    def run(state_dtype, batch, forced=None, margins=False, settings=None) -> Decodes:
        engine = _engine(size, state_dtype, len(batch), under | (settings or {}))
        try:
            return greedy(engine, batch, tokens, forced, margins)
        finally:
            del engine
            if torch.cuda.is_available():
                torch.cuda.empty_cache()

    reference = run("float32", prompts, margins=True)
    free = run(state_dtype, prompts).tokens
    forced = run(state_dtype, prompts, reference.tokens).tokens
    floor = run("float32", prompts + extra, reference.tokens).tokens
    floor.pop(len(prompts))  # the extra request only changes the batch
    changed = {}
    for setting in versus:
        tokens_of = run("float32", prompts, reference.tokens, settings=parse_overrides(setting))
        changed[setting] = {
            "forced_agreement": agreement_by_band(tokens_of.tokens, reference.tokens),
            "forced_agreement_by_margin": agreement_by_margin(
                tokens_of.tokens, reference.tokens, reference.margins
            ),
        }
    firsts = [first_difference(free[rid], reference.tokens[rid]) for rid in reference.tokens]
    diverged_at = stats.summarise([f for f in firsts if f is not None])
    return {
        "size": size, "state_dtype": state_dtype, "requests": requests, "prompt": prompt,
        "tokens": tokens, "settings": base or "",
        "free_identical": firsts.count(None),
        "free_first_difference_median": diverged_at.median if diverged_at else None,
        "forced_agreement": agreement_by_band(forced, reference.tokens),
        "forced_agreement_by_margin": agreement_by_margin(
            forced, reference.tokens, reference.margins
        ),
        "floor_agreement": agreement_by_band(floor, reference.tokens),
        "versus": changed,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_state_accuracy")
    parser.add_argument("--size", default="0.8b")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--state-dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument(
        "--versus", action="append", default=[], metavar="engine.KEY=VALUE",
        help="also a teacher-forced fp32 run with this setting changed (repeatable)",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="engine.KEY=VALUE", dest="base",
        help="a setting under every run (repeatable), e.g. engine.device=cpu",
    )  # fmt: skip
    args = parser.parse_args(argv)
    base = ",".join(args.base)
    for flag, setting in [("--set", base), *(("--versus", s) for s in args.versus)]:
        try:  # a bad setting ends here, before any engine is built
            load_scenario("qwen35", args.size, parse_overrides(base) | parse_overrides(setting))
        except ConfigError as error:
            parser.error(f"{flag} {setting}: {error}")
    figures = measure(args.size, args.requests, args.prompt, args.tokens,
                      state_dtype=args.state_dtype, versus=tuple(args.versus), base=base)  # fmt: skip
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()

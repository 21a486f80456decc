"""qwen35's worker loop on decode steps alone: where an iteration's time goes, host and GPU.

    python -m benchmarks.bench_decode_loop --size 0.8b --requests 64 --profile FILE
    python -m benchmarks.bench_decode_loop --size 0.8b --pdl --loop overlapped
    python -m benchmarks.bench_decode_loop --size tiny --device cpu --requests 8

Why: a served c=64 decode iteration (ITL p50 2.19-2.22 ms on the H200) is slower than its
decode graph alone (2.05-2.17 ms of back-to-back replays, `bench_gpu_step --replays`), and
`engine.pdl` took 5.8% off the graph (2.170 -> 2.045 ms) but only 1.6% off the served ITL.
Either the GPU idles between steps (the host's path around a step, its copies) or the
host's own work bounds the loop. This runs the worker the server runs (`build_worker`, the
scenario's settings, its overlapped or strict loop) with the phase spans on, admits N requests
of one prompt length, prefills them, then times K iterations of `Worker.iteration` in which
every row decodes (no arrivals, no prefill steps: the server's ITL, not its TPOT), and prints:

- the iteration's median, p10, p90 (benchmarks/stats.py) and the output tok/s it makes;
- the worker's own spans over those iterations (median ms an iteration: schedule, forward,
  postprocess, the completion wait inside it; docs/SPANS.md): the host's work is the
  iteration less the completion wait;
- with `--profile FILE`, a few more iterations under the torch profiler: the GPU's busy time
  an iteration against the wall (benchmarks/device_streams.py), and the op tables to FILE.

If the GPU's busy time an iteration is well under the iteration and the completion wait is
small, the host bounds the loop; if the GPU is busy nearly all of it, the device does.

`--closed` runs the server's closed loop instead, in process: N requests, each one that ends
replaced at once by a new one whose prompt and output lengths are drawn (seeded, uniform) from
the scenario's load (qwen35: 128-512 and 256-512 tokens, ignore_eos), so prefill steps and
the prefill hold happen as they do under `bench measure -c N`, without HTTP, the API server or
the load generator. It prints the output tok/s of the timed iterations (the served headline's
counterpart: the same worker, the same arrivals), and the iterations with prompt work and
those without apart, each with its spans: what the prefill steps cost the decoding rows (TPOT
against ITL) and whether their host or their device does; and what the prompt work cost: the
ceiling of every row decoding at the decode iterations' median, the run's share of it, the
run's time beyond as many iterations at that median. As a server before Ready, it runs
the engine's warmup steps first (`engine.warmup`); --warmup defaults to 1000 iterations
there, past the first generation of requests, whose ends the start synchronises.

    python -m benchmarks.bench_decode_loop --size 0.8b --closed --iterations 3000 [--pdl]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from benchmarks import device_streams, stats
from benchmarks.bench_gpu_step import prompt_ids
from benchmarks.options import LOOPS, LoopSettings, add_loop_options, positive_int
from engine.config import DENSE_KERNELS, GDN_DECODES, parse_overrides
from engine.messages import AddRequest, StepFrames, encode
from engine.spans import PREFILL_STEPS, ROWS_PER_STEP
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer
from engine.worker.warmup import warm_up
from harness.scenario import load_scenario

NEVER = 10**9  # a PhaseTimer period that never flushes: the spans stay to be read
# the settings every run's line names (as the built engine holds them), whatever was given
NAMED = {"engine.pdl": "pdl", "engine.dense_kernel": "dense", "engine.gdn_decode": "gdn decode"}


@dataclass(frozen=True)
class Settings(LoopSettings):
    # closed: each request that ends is replaced at once by a new one, prompt and output
    # lengths drawn from the scenario's load (ignore_eos): the server's closed loop at
    # c=requests without HTTP, prefill steps and the hold included (`prompt` unused)
    closed: bool = False
    # settings over the scenario's, as bench's overrides (`--set`, `--pdl`, ...)
    overrides: dict = field(default_factory=dict)


@dataclass
class LoopRun:
    """What one loop's measurement recorded: raw facts, no figure computed."""

    settings: Settings
    built: str
    iteration_s: list[float] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # rows each timed iteration emitted
    tokens: list[int] = field(default_factory=list)  # output tokens each timed iteration sent
    prompt_work: list[int] = field(default_factory=list)  # 1: the iteration's step had some
    admitted: int = 0  # requests admitted in all (closed: the first N and every replacement)
    spans_ns: dict[str, list[int]] = field(default_factory=dict)  # the worker's, timed ones
    prefill_steps: int = 0  # steps with prompt work among the timed ones (0 for a good run)
    profile_wall_us: float = 0.0
    device: list[device_streams.DeviceSpan] = field(default_factory=list)
    op_tables: str = ""


def measure(settings: Settings) -> LoopRun:
    scenario = load_scenario("qwen35", settings.size, settings.overrides)
    config = replace(scenario.engine, overlap=settings.loop == "overlapped")
    if settings.device is not None:
        config = replace(config, device=settings.device)
    needed = settings.warmup + settings.iterations + settings.profile_iterations + 16
    if not settings.closed and settings.prompt + needed > config.max_model_len:
        raise ValueError(
            f"{settings.prompt} prompt + {needed} output tokens exceed engine.max_model_len "
            f"{config.max_model_len}: fewer --iterations or a shorter --prompt"
        )
    timer = PhaseTimer(NEVER, "bench", [])
    sent = Sent()
    worker = build_worker(scenario.model, config, timer, sent)
    if config.warmup and settings.closed:  # as a server before Ready: the prefill and mixed
        warm_up(worker)  # steps' kernels compile here, not under the measured iterations
    engine = worker.engine
    named = [f"{label} {_setting(config, key, None)}" for key, label in NAMED.items()]
    others = [
        f"{key} {_setting(config, key, value)}"
        for key, value in settings.overrides.items()
        if key not in NAMED
    ]
    built = [f"device {config.device}", f"graphs {engine.graphs is not None}", *named, *others]
    run = LoopRun(settings, ", ".join(built))
    arrivals = Arrivals(worker, scenario, settings, needed)
    for _ in range(settings.requests):
        arrivals.add()
    if not settings.closed:  # every row decoding before the measurement
        while not all(r.prefill_done for r in engine.requests.values()):
            worker.iteration()
    for _ in range(settings.warmup):
        worker.iteration()
        arrivals.replace(sent.take_finished())
    for spans in (timer._spans, timer._counts):  # the timed iterations' alone
        spans.clear()
    for _ in range(settings.iterations):
        sent.tokens = 0
        start = time.perf_counter()
        worker.iteration()
        run.iteration_s.append(time.perf_counter() - start)
        run.tokens.append(sent.tokens)
        arrivals.replace(sent.take_finished())
    run.spans_ns = {name: list(values) for name, values in timer._spans.items()}
    run.rows = list(timer._counts.get(ROWS_PER_STEP, []))
    run.prompt_work = list(timer._counts.get(PREFILL_STEPS, []))
    run.prefill_steps = sum(run.prompt_work)
    run.admitted = arrivals.next_rid
    if settings.profile_iterations:
        _profile(worker, arrivals, sent, run, settings.profile_iterations)
    return run


def _setting(config, key: str, given):
    """What the built engine holds for an override (an engine setting's value as the worker
    got it; another section's as given)."""
    section, _, name = key.partition(".")
    return getattr(config, name) if section == "engine" else given


class Sent:
    """The worker's send: each message encoded as the worker process sends it; the output
    tokens of its frames counted, the requests that ended kept."""

    def __init__(self) -> None:
        self.tokens = 0
        self.finished: list[int] = []

    def __call__(self, msg) -> None:
        encode(msg)
        if isinstance(msg, StepFrames):
            for frame in msg.frames:
                self.tokens += len(frame.tokens)
                if frame.finish_reason is not None:
                    self.finished.append(frame.rid)

    def take_finished(self) -> list[int]:
        finished, self.finished = self.finished, []
        return finished


class Arrivals:
    """The requests the benchmark admits: decode-only, N of `prompt` tokens that outlast the
    measurement; closed, N at first and a new one for each that ends, prompt and output
    lengths drawn (uniform, seeded) from the scenario's load."""

    def __init__(self, worker, scenario, settings: Settings, needed: int):
        self.worker, self.settings, self.needed = worker, settings, needed
        self.arch, self.load = scenario.model.arch, scenario.load
        self.vocab = worker.engine.model.config.vocab_size
        self.gen = torch.Generator().manual_seed(0)
        self.lengths = np.random.default_rng(self.load.seed)
        self.next_rid = 0

    def add(self) -> None:
        prompt_len, max_tokens = self.settings.prompt, self.needed
        if self.settings.closed:
            prompt_len = int(self.lengths.integers(*self.load.prompt_tokens, endpoint=True))
            max_tokens = int(self.lengths.integers(*self.load.output_tokens, endpoint=True))
        prompt = prompt_ids(self.arch, self.vocab, prompt_len, self.gen)
        msg = AddRequest(self.next_rid, prompt, max_tokens, ignore_eos=True, temperature=0)
        self.worker.handle(msg)
        self.next_rid += 1

    def replace(self, finished: list[int]) -> None:
        if self.settings.closed:
            for _ in finished:
                self.add()


def _profile(worker, arrivals: Arrivals, sent: Sent, run: LoopRun, iterations: int) -> None:
    """The profiled iterations go on as the measured ones (closed: arrivals replaced, so
    they hold prompt iterations in the measured proportion)."""

    def iteration() -> None:
        worker.iteration()
        arrivals.replace(sent.take_finished())

    cuda = worker.engine.device.type == "cuda"
    done = device_streams.profile_calls(iteration, iterations, cuda)
    run.profile_wall_us, run.device, run.op_tables = done.wall_us, done.spans, done.op_tables


# --- showing -----------------------------------------------------------------------------
def render(run: LoopRun) -> str:
    s = run.settings
    iteration = stats.summarise([t * 1e3 for t in run.iteration_s])
    if s.closed:
        head = (
            f"closed loop, qwen35 {s.size}, c={s.requests}, the scenario's lengths, loop "
            f"{s.loop}, {run.built}: {sum(run.tokens) / sum(run.iteration_s):,.0f} output "
            f"tok/s over {iteration.n} iterations ({sum(run.tokens):,} tokens), "
            f"{run.prefill_steps} of them with prompt work"
        )
    else:
        rows = statistics.mean(run.rows) if run.rows else float("nan")
        head = (
            f"decode loop, qwen35 {s.size}, {s.requests} requests, prompt {s.prompt}, loop "
            f"{s.loop}, {run.built}: {stats.render(iteration)} over {iteration.n} iterations, "
            f"{rows:.1f} rows an iteration = {rows / iteration.median * 1e3:,.0f} tok/s"
        )
    lines = [head]
    kinds = {"": list(range(len(run.iteration_s)))}
    if s.closed and len(run.prompt_work) == len(run.iteration_s):  # the two kinds apart
        kinds = {
            kind: [i for i, work in enumerate(run.prompt_work) if work == flag]
            for kind, flag in (("decode ", 0), ("prompt ", 1))
        }
    for kind, at in kinds.items():
        if not at:
            continue
        if kind:
            times = stats.summarise([run.iteration_s[i] * 1e3 for i in at])
            lines.append(f"  {kind}iterations: {stats.render(times)} over {len(at)}")
        for name in sorted(run.spans_ns):
            values = run.spans_ns[name]
            if len(values) == len(run.iteration_s):  # one a timed iteration: split by kind
                values = [values[i] for i in at]
            elif kind:  # not one an iteration: shown once, over every iteration (below)
                continue
            lines.append(_span_line(kind, name, values, len(at)))
    if len(kinds) > 1:
        for name in sorted(run.spans_ns):
            values = run.spans_ns[name]
            if len(values) != len(run.iteration_s):
                lines.append(_span_line("all ", name, values, len(run.iteration_s)))
    if s.closed and "decode " in kinds and kinds["decode "] and run.prefill_steps:
        lines.append(_prompt_cost(run, kinds["decode "]))
    if run.prefill_steps and not s.closed:
        lines.append(f"  DOUBTFUL: {run.prefill_steps} timed iterations had prompt work")
    if run.profile_wall_us:
        n = s.profile_iterations
        if run.device:
            busy = device_streams.busy_us(run.device)
            lines.append(
                f"  GPU busy {busy / n / 1e3:.3f} ms an iteration of "
                f"{run.profile_wall_us / n / 1e3:.3f} ms wall ({busy / run.profile_wall_us:.0%}) "
                f"over {n} profiled iterations"
            )
        else:
            lines.append(f"  no device events in {n} profiled iterations (a CPU run)")
    return "\n".join(lines)


def _prompt_cost(run: LoopRun, decode_at: list[int]) -> str:
    """What prompt work costs a closed loop: the ceiling of every row decoding at the decode
    iterations' median, the run's share of it, and the run's time beyond as many iterations
    at that median (the prompt iterations' own and what they add to the decode iterations
    that launch them, in the overlapped loop), a prompt iteration's share of it."""
    median_ms = statistics.median(run.iteration_s[i] for i in decode_at) * 1e3
    ceiling = run.settings.requests / median_ms * 1e3
    whole_ms = sum(run.iteration_s) * 1e3
    beyond = whole_ms - len(run.iteration_s) * median_ms
    achieved = sum(run.tokens) / (whole_ms / 1e3)
    return (
        f"  every row decoding at the decode median ({median_ms:.3f} ms): {ceiling:,.0f} tok/s, "
        f"this run {achieved / ceiling:.0%} of it; time beyond {len(run.iteration_s)} decode "
        f"medians {beyond:,.0f} ms of {whole_ms:,.0f} ({beyond / whole_ms:.0%}), "
        f"{beyond / run.prefill_steps:.2f} ms a prompt iteration"
    )


def _span_line(kind: str, name: str, values: list[int], iterations: int) -> str:
    return (
        f"  {kind}{name:<40} median {statistics.median(values) / 1e6:7.3f} ms, "
        f"mean {sum(values) / iterations / 1e6:7.3f} ms an iteration ({len(values)})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_decode_loop")
    add_loop_options(parser, loop="overlapped")
    parser.add_argument("--prompt", type=positive_int, default=512)
    parser.add_argument("--warmup", type=int, default=None, help="default: 20, closed 1000")
    parser.add_argument("--iterations", type=positive_int, default=200)
    parser.add_argument(
        "--closed", action="store_true",
        help="replace each request that ends by a new one, lengths from the scenario's load "
        "(the server's closed loop without HTTP); --warmup then defaults to 1000",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
        help="a scenario setting, as bench's overrides (e.g. engine.triton_launch=bound)",
    )  # fmt: skip
    parser.add_argument("--pdl", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--dense-kernel", default=None, choices=list(DENSE_KERNELS))
    parser.add_argument("--gdn-decode", default=None, choices=list(GDN_DECODES))
    parser.add_argument("--profile", default=None, help="write the profiler's op tables here")
    parser.add_argument("--profile-iterations", type=positive_int, default=20)
    args = parser.parse_args(argv)
    size = args.size or load_scenario("qwen35").size
    failed = False
    try:
        overrides = parse_overrides(",".join(args.set))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    flags = {"pdl": args.pdl, "dense_kernel": args.dense_kernel, "gdn_decode": args.gdn_decode}
    overrides |= {f"engine.{key}": value for key, value in flags.items() if value is not None}
    for loop in LOOPS[args.loop]:
        warmup = args.warmup if args.warmup is not None else (1000 if args.closed else 20)
        settings = Settings(
            size, args.device, loop, args.requests, args.prompt, warmup, args.iterations,
            args.profile_iterations if args.profile else 0, args.closed, overrides,
        )  # fmt: skip
        try:
            run = measure(settings)
        except ValueError as exc:  # settings that cannot run (a ConfigError too): one line
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(render(run), flush=True)
        failed |= run.prefill_steps > 0 and not settings.closed
        if args.profile and run.op_tables:
            path = args.profile if len(LOOPS[args.loop]) == 1 else f"{args.profile}.{loop}"
            with open(path, "w") as out:
                out.write(f"{render(run)}\n\n{run.op_tables}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

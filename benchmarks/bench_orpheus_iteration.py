"""Orpheus's worker iteration: both nodes (the LLM and the SNAC codec) on the worker the server
runs, timed in the worker's own loop.

    python -m benchmarks.bench_orpheus_iteration --size 3b --requests 64 --profile FILE
    python -m benchmarks.bench_orpheus_iteration --size tiny --device cpu --requests 8

Builds the worker as the worker process does (`build_worker`, the scenario's engine settings:
`engine.codec_graphs` as configured, `--codec-overlap` optional) and admits N requests (speech
prompts, ignore_eos, greedy) in FRAME_TOKENS groups, each after the last group's prefill and one
decode step, so their frames, and so the codec's windows, spread over the iterations as under a
closed-loop load rather than all landing on every seventh. Then, per loop (`--loop strict`,
`overlapped` or `both`, a fresh worker each): warmup iterations, K timed iterations of
`Worker.iteration`, then (`--profile`) a few more under the torch profiler, then a drain until
every request has ended. The send is the worker's (each message encoded) without the socket.

Prints the iteration time (median, p10, p90: benchmarks/stats.py), audio-seconds per second
(the PCM the worker sent in the timed iterations, 2 bytes a sample at the speech format's rate,
over their wall time) and the codec's windows per iteration; and checks the drain: each
request's PCM must be 2048 samples x 2 bytes for each window `windows_for` gives its tokens,
and its finish "length". A request that ended before the measurement did, or a check that
fails, is flagged and the exit code is 1. `--profile FILE` writes, for the profiled iterations,
the device time by CUDA stream (the LLM's default stream and the codec's: each one's busy time,
both at once, the GPU busy and idle against the wall; benchmarks/device_streams.py) and the
profiler's op tables (with `--loop both`, to FILE.strict and FILE.overlapped). On a CPU there
are no streams: the file has the host's ops only.
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from dataclasses import dataclass, field, replace

import msgspec
import torch

from benchmarks import device_streams, stats
from benchmarks.bench_gpu_step import prompt_ids
from benchmarks.options import LOOPS, LoopSettings, add_loop_options, positive_int
from engine.messages import AddRequest, StepFrames, encode
from engine.models import architecture
from engine.models.orpheus import FRAME_TOKENS, SAMPLES_PER_FRAME, WINDOW_TOKENS, windows_for
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer
from engine.worker.worker import Worker
from harness.scenario import load_scenario

BYTES_PER_SAMPLE = 2  # s16le


@dataclass(frozen=True)
class Settings(LoopSettings):
    codec_graphs: bool | None = None  # None: the scenario's
    codec_overlap: bool | None = None
    masked_head: bool | None = None


@dataclass
class Profile:
    wall_us: float
    spans: list[device_streams.DeviceSpan]
    labels: dict[int, str]  # profiler stream id -> which node's
    op_tables: str


@dataclass
class IterationRun:
    """What one loop's measurement recorded: raw facts, no figure computed."""

    settings: Settings
    built: str  # what the worker runs: device, LLM graphs, codec graphs, codec overlap
    iteration_s: list[float] = field(default_factory=list)
    audio_bytes: list[int] = field(default_factory=list)  # PCM sent in each timed iteration
    running_after: int = 0  # requests still running when the measured iterations ended
    max_tokens: dict[int, int] = field(default_factory=dict)
    pcm_bytes: dict[int, int] = field(default_factory=dict)  # per request, once drained
    finish: dict[int, str] = field(default_factory=dict)
    profile: Profile | None = None


class Sent:
    """The worker's send: each message encoded as the worker process sends it, the PCM bytes
    and last frames of its frames kept."""

    def __init__(self) -> None:
        self.total = 0
        self.pcm: dict[int, int] = {}
        self.finish: dict[int, str] = {}

    def __call__(self, msg: msgspec.Struct) -> None:
        encode(msg)
        if not isinstance(msg, StepFrames):
            return
        for frame in msg.frames:
            audio = len(frame.audio or b"")
            self.total += audio
            self.pcm[frame.rid] = self.pcm.get(frame.rid, 0) + audio
            if frame.finish_reason is not None:
                self.finish[frame.rid] = frame.finish_reason


# --- measuring ----------------------------------------------------------------------------
def measure(settings: Settings) -> IterationRun:
    scenario = load_scenario("orpheus", settings.size)
    config = replace(scenario.engine, overlap=settings.loop == "overlapped")
    chosen = {"device": settings.device, "codec_graphs": settings.codec_graphs,
              "codec_overlap": settings.codec_overlap, "masked_head": settings.masked_head}  # fmt: skip
    config = replace(config, **{key: value for key, value in chosen.items() if value is not None})
    threads = torch.get_num_threads()
    if config.device == "cpu":  # as the worker process runs on a CPU
        torch.set_num_threads(max(1, config.cpu_threads))
    try:
        sent = Sent()
        worker = build_worker(scenario.model, config, PhaseTimer(0, "bench", []), sent)
        return _run(worker, sent, settings, scenario.model.arch)
    finally:
        torch.set_num_threads(threads)


def _run(worker: Worker, sent: Sent, settings: Settings, arch: str) -> IterationRun:
    config, (stage,) = worker.engine.config, worker.stages
    built = (
        f"device {config.device}, LLM graphs {worker.engine.graphs is not None}, codec graphs "
        f"{stage.graphs is not None}, codec overlap {stage.overlap}, masked head "
        f"{worker.engine.first_logit > 0}"
    )
    run = IterationRun(settings, built)
    group = math.ceil(settings.requests / FRAME_TOKENS)
    prefill_steps = math.ceil(group * settings.prompt / config.max_tokens_per_step) + 1
    spread = FRAME_TOKENS * (prefill_steps + 2)  # iterations the admission takes, at most
    needed = spread + settings.warmup + settings.iterations + settings.profile_iterations + 8
    if settings.prompt + needed + FRAME_TOKENS > config.max_model_len:
        raise ValueError(
            f"{settings.prompt} prompt + {needed + FRAME_TOKENS} output tokens exceed "
            f"engine.max_model_len {config.max_model_len}: fewer --iterations or --prompt"
        )
    for rid in range(settings.requests):  # ends spread over a frame: windows_for checks more
        run.max_tokens[rid] = needed + rid % FRAME_TOKENS
    gen = torch.Generator().manual_seed(0)
    vocab = worker.engine.model.config.vocab_size
    for first in range(FRAME_TOKENS):
        for rid in range(first, settings.requests, FRAME_TOKENS):
            prompt = prompt_ids(arch, vocab, settings.prompt, gen)
            worker.handle(AddRequest(rid, prompt, run.max_tokens[rid], ignore_eos=True,
                                     temperature=0))  # fmt: skip
        while not all(r.prefill_done for r in worker.engine.requests.values()):
            worker.iteration()
        worker.iteration()  # one decode step of all: this group's tokens lag the last one's
    for _ in range(settings.warmup):
        worker.iteration()
    for _ in range(settings.iterations):
        before, start = sent.total, time.perf_counter()
        worker.iteration()
        run.iteration_s.append(time.perf_counter() - start)
        run.audio_bytes.append(sent.total - before)
    if settings.profile_iterations:
        run.profile = _profile(worker, settings.profile_iterations)
    run.running_after = len(worker.engine.requests)
    while worker.iteration():
        pass
    run.pcm_bytes, run.finish = sent.pcm, sent.finish
    return run


def _profile(worker: Worker, iterations: int) -> Profile:
    cuda = worker.engine.device.type == "cuda"
    labels = {}
    if cuda:
        streams = {"llm (the default stream)": torch.cuda.current_stream()}
        streams |= {f"codec ({s.node.graph.node})": s.cuda_stream for s in worker.stages}
        labels = device_streams.stream_labels(streams)
    done = device_streams.profile_calls(worker.iteration, iterations, cuda)
    return Profile(done.wall_us, done.spans, labels, done.op_tables)


# --- figures -----------------------------------------------------------------------------
def audio_seconds_per_s(run: IterationRun, sample_rate: int) -> float:
    """Audio-seconds the timed iterations' PCM holds, per second of their wall time."""
    return sum(run.audio_bytes) / BYTES_PER_SAMPLE / sample_rate / sum(run.iteration_s)


def problems(run: IterationRun) -> list[str]:
    """What makes the run's figures doubtful or wrong (none: a good run)."""
    found = []
    if bad := pcm_mismatches(run):
        found.append(f"MISMATCH: the PCM or finish of requests {bad[:8]} is not their windows'")
    if ended := run.settings.requests - run.running_after:
        found.append(
            f"DOUBTFUL: {ended} requests ended inside the measurement (its batch shrank); "
            "a bug of the benchmark's output lengths"
        )
    return found


def pcm_mismatches(run: IterationRun) -> list[int]:
    """Requests whose drained PCM is not their windows' (2048 samples each, `windows_for`
    of their tokens) or that did not end on their length."""
    per_window = SAMPLES_PER_FRAME * BYTES_PER_SAMPLE
    return [
        rid for rid, tokens in run.max_tokens.items()
        if run.pcm_bytes.get(rid, 0) != per_window * windows_for(tokens)
        or run.finish.get(rid) != "length"
    ]  # fmt: skip


# --- showing -----------------------------------------------------------------------------
def render(run: IterationRun, sample_rate: int) -> str:
    s = run.settings
    iteration = stats.summarise([t * 1e3 for t in run.iteration_s])
    windows = sum(run.audio_bytes) / (SAMPLES_PER_FRAME * BYTES_PER_SAMPLE) / iteration.n
    lines = [
        f"orpheus iteration, size {s.size}, {s.requests} requests, prompt {s.prompt}, loop "
        f"{s.loop}, {run.built}: {stats.render(iteration)} over "
        f"{iteration.n} iterations = {audio_seconds_per_s(run, sample_rate):.2f} audio-s/s, "
        f"{windows:.2f} codec windows an iteration"
    ]
    good = len(run.max_tokens) - len(pcm_mismatches(run))
    lines.append(
        f"  PCM of {good} of {len(run.max_tokens)} requests = {SAMPLES_PER_FRAME} samples x "
        f"{BYTES_PER_SAMPLE} B x windows_for(its tokens), each ended on its length"
    )
    lines += [f"  {problem}" for problem in problems(run)]
    return "\n".join(lines)


def render_profile(profile: Profile, iterations: int) -> str:
    if not profile.spans:  # the host's ops, the costliest first
        head = "\n".join(profile.op_tables.splitlines()[:16])
        return (
            f"no device events in {iterations} profiled iterations (a CPU run); host ops:\n{head}"
        )
    report = device_streams.summarize(profile.spans, profile.labels, profile.wall_us, iterations)
    return device_streams.render(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_orpheus_iteration")
    add_loop_options(parser, loop="both")
    parser.add_argument("--prompt", type=int, default=256, help="tokens, markers included")
    parser.add_argument(  # the last group's first window comes 28 tokens after its prefill
        "--warmup", type=int, default=WINDOW_TOKENS + FRAME_TOKENS
    )
    parser.add_argument("--iterations", type=positive_int, default=100)
    parser.add_argument("--codec-graphs", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--codec-overlap", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--masked-head", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--profile", default=None, help="write the profile tables here")
    parser.add_argument(  # one frame's worth: the codec's windows come in a 7-iteration cycle
        "--profile-iterations", type=positive_int, default=FRAME_TOKENS
    )
    args = parser.parse_args(argv)
    size = args.size or load_scenario("orpheus").size
    sample_rate = architecture("orpheus").speech.sample_rate
    failed = False
    for loop in LOOPS[args.loop]:
        settings = Settings(
            size, args.device, loop, args.requests, args.prompt, args.warmup, args.iterations,
            args.profile_iterations if args.profile else 0, args.codec_graphs, args.codec_overlap,
            args.masked_head,
        )  # fmt: skip
        try:
            run = measure(settings)
        except ValueError as exc:  # settings that cannot run: one line, what to change
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(render(run, sample_rate), flush=True)
        failed |= bool(problems(run))
        if run.profile is not None:
            table = render_profile(run.profile, args.profile_iterations)
            print(table, flush=True)
            path = args.profile if len(LOOPS[args.loop]) == 1 else f"{args.profile}.{loop}"
            with open(path, "w") as out:
                out.write(f"{render(run, sample_rate)}\n{table}\n\n{run.profile.op_tables}")
        del run
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

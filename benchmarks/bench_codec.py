"""The codec's step on one device: B windows of Orpheus's SNAC decoded, eagerly and replayed
from the codec graphs, on each of the codec's kernel settings (`engine.codec_kernels`).

    python -m benchmarks.bench_codec                  # 3b's codec (SNAC 24 kHz), bf16, CUDA
    python -m benchmarks.bench_codec --kernels torch fused --windows 16 64 --profile prof.txt
    python -m benchmarks.bench_codec --kernels folded --sines exact approx  # engine.codec_sine
    python -m benchmarks.bench_codec --device cpu --preset tiny --windows 1 2 --repeats 3

A step is the stage's own device side (`WindowDecoder.begin`, engine/worker/stream_pending.py):
the windows' codes sent up, the decode (eager, or the bucket's graph replayed), the PCM copied
back into pinned memory; then the host waits for it, as the strict stage does. Per step: the
device's time from the codes' copy to the PCM's (CUDA events on the codec's stream; an eager
step's includes the gaps while the host launches) and the host's wall time to the PCM on the
host. Medians, p10 and p90 (benchmarks/stats.py) over `--repeats` steps; with several
settings, each one's median over the first's. Each setting builds its own network (the same
seeded weights) and its own graphs (buckets up to the largest B), one after another.
`--profile FILE` adds a torch profiler table per setting and mode at the largest B.
On a CPU (tiny, fp32) it runs the reference in seconds (tests/test_bench_codec.py); the
kernels and the graphs are CUDA's, so there it times the eager decode and the graphs' eager
twin, and only `torch` by default.
"""

from __future__ import annotations

import argparse
import gc
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch

from benchmarks import stats
from benchmarks.options import positive_int
from engine.config.codec import CODEC_KERNELS, CODEC_SINES
from engine.models import build_streams
from engine.models.orpheus import CODEBOOK, WINDOW_TOKENS, audio_token_low
from engine.worker.codec_graphs import CodecGraphs
from engine.worker.stream_pending import WindowDecoder

MODES = ("eager", "graphs")  # on a CPU "graphs" is the runner's eager twin (nothing captured)


@dataclass(frozen=True)
class StepTimes:
    """One setting's raw step times at one window count."""

    kernels: str
    mode: str
    windows: int
    device_ms: list[float]  # CUDA events, codes up to PCM back (empty on a CPU)
    wall_ms: list[float]  # the host: begin to the PCM on the host


class Codec:
    """One kernel setting's network, its stage-side decoder and its graphs. (No method named
    time_*: asv, which imports benchmarks/ for the nightly, would take the class for its own.)"""

    def __init__(
        self, preset: str, dtype: str, device: str, kernels: str, max_windows: int,
        sine: str = "exact",
    ):  # fmt: skip
        ((self.network, self.node),) = build_streams(
            "orpheus", preset, 0, dtype, device, kernels, sine
        )
        # the setting's name in the tables: the kernels, and the sine where not the default
        self.label = kernels if sine == "exact" else f"{kernels}+{sine}"
        self.decoder = WindowDecoder(self.network, self.node, max_windows)
        forward = partial(self.node.pcm, self.network)
        self.graphs = CodecGraphs(
            forward, self.node.code_width, max_windows, torch.device(device),
            self.decoder.cuda_stream,
        )  # fmt: skip

    def step(self, codes: np.ndarray, mode: str) -> torch.cuda.Event | None:
        """One step of B windows' codes [B, 28] (the node's `codes`); returns an event after
        its PCM's copy (None on a CPU), having waited for it."""
        _, done = self.decoder.begin(codes, self.graphs if mode == "graphs" else None)
        stream = self.decoder.cuda_stream
        if stream is None:
            return None
        end = torch.cuda.Event(enable_timing=True)
        end.record(stream)  # `done`, timed
        end.synchronize()
        return end

    def measure(self, windows: np.ndarray, mode: str, repeats: int, warmup: int) -> StepTimes:
        """`repeats` steps of `windows` [B, 28] (audio tokens) after `warmup` untimed ones."""
        codes = self.node.codes(windows)
        device_ms, wall_ms = [], []
        stream = self.decoder.cuda_stream
        for i in range(warmup + repeats):
            start = torch.cuda.Event(enable_timing=True) if stream is not None else None
            if start is not None:
                start.record(stream)
            t0 = time.perf_counter()
            end = self.step(codes, mode)
            wall = (time.perf_counter() - t0) * 1e3
            if i >= warmup:
                wall_ms.append(wall)
                if end is not None:
                    device_ms.append(start.elapsed_time(end))
        return StepTimes(self.label, mode, len(codes), device_ms, wall_ms)


def windows_of(count: int, seed: int = 0) -> np.ndarray:
    """`count` windows of audio tokens of valid codes (random), as the stage takes them."""
    codes = np.random.default_rng(seed).integers(0, CODEBOOK, (count, WINDOW_TOKENS))
    return audio_token_low(np.arange(WINDOW_TOKENS)) + codes


@dataclass(frozen=True)
class StepSummary:
    kernels: str
    mode: str
    windows: int
    clock: str  # "device" (CUDA events) or "wall" (a CPU)
    step_ms: stats.Summary  # the clock's
    wall_ms: float  # median


def summarise(times: StepTimes) -> StepSummary:
    """The device times' median, p10 and p90 (the wall times' on a CPU), and the wall
    times' median."""
    return StepSummary(
        times.kernels, times.mode, times.windows, "device" if times.device_ms else "wall",
        stats.summarise(times.device_ms or times.wall_ms), stats.summarise(times.wall_ms).median,
    )  # fmt: skip


def against_first(summaries: list[StepSummary]) -> dict[tuple[str, int], dict[str, float]]:
    """Per (mode, windows): each setting's median over the first setting's."""
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for s in summaries:
        medians.setdefault((s.mode, s.windows), {})[s.kernels] = s.step_ms.median
    return {
        key: {kernels: ms / next(iter(by.values())) for kernels, ms in by.items()}
        for key, by in medians.items()
    }


def render(s: StepSummary) -> str:
    return (
        f"codec step, kernels {s.kernels:5s} {s.mode:6s} {s.windows:3d} windows: {s.clock} "
        f"{stats.render(s.step_ms)}, wall {s.wall_ms:.3f} ms, "
        f"{s.step_ms.median / s.windows * 1e3:.0f} us a window over {s.step_ms.n} steps"
    )


def render_ratios(ratios: dict[tuple[str, int], dict[str, float]]) -> str:
    lines = []
    for (mode, windows), by in ratios.items():
        shown = ", ".join(f"{kernels} {ratio:.2f}" for kernels, ratio in by.items())
        lines.append(f"{mode:6s} {windows:3d} windows, median over the first: {shown}")
    return "\n".join(lines)


def profile_table(codec: Codec, windows: np.ndarray, mode: str) -> str:
    """The profiler's table of 5 steps, sorted by the device's own time (the host's on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if codec.decoder.cuda_stream is not None:
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        for _ in range(5):
            codec.step(codec.node.codes(windows), mode)
    key = "self_cuda_time_total" if len(activities) == 2 else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=25)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.bench_codec")
    parser.add_argument("--preset", default="3b", help="the Orpheus preset whose codec: 3b, tiny")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, else float32")
    parser.add_argument(
        "--kernels", nargs="+", choices=CODEC_KERNELS, default=None,
        help="engine.codec_kernels settings to time (default: all on CUDA, torch on a CPU)",
    )  # fmt: skip
    parser.add_argument(
        "--sines", nargs="+", choices=CODEC_SINES, default=["exact"],
        help="engine.codec_sine settings, each with every --kernels setting but torch",
    )  # fmt: skip
    parser.add_argument("--windows", type=positive_int, nargs="+", default=[1, 8, 16, 32, 64])
    parser.add_argument("--repeats", type=positive_int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile", default=None, help="write profiler tables here")
    args = parser.parse_args(argv)
    cuda = args.device == "cuda"
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    kernel_settings = args.kernels or (list(CODEC_KERNELS) if cuda else ["torch"])
    settings = [
        (kernels, sine)
        for kernels in kernel_settings
        for sine in (["exact"] if kernels == "torch" else args.sines)  # torch has no sines of ours
    ]
    print(f"codec of orpheus {args.preset}, {dtype} on {args.device}")
    summaries, tables = [], []
    for kernels, sine in settings:
        codec = Codec(args.preset, dtype, args.device, kernels, max(args.windows), sine)
        for mode in MODES:
            for count in args.windows:
                times = codec.measure(windows_of(count), mode, args.repeats, args.warmup)
                summaries.append(summarise(times))
                print(render(summaries[-1]), flush=True)
            if args.profile:
                table = profile_table(codec, windows_of(max(args.windows)), mode)
                tables.append(
                    f"== kernels {codec.label}, {mode}, {max(args.windows)} windows\n{table}"
                )
        del codec  # its graphs and their pool, before the next setting captures its own
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    if len(settings) > 1:
        print(render_ratios(against_first(summaries)))
    if args.profile:
        Path(args.profile).write_text("\n".join(tables))


if __name__ == "__main__":
    main()

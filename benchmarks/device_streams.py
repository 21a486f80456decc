"""A profile's device time by CUDA stream: what each stream kept the GPU busy, how much of it
ran while another stream's work did, and the GPU's busy time against the host's wall time.

Orpheus's worker runs its LLM on the default stream and the codec on a stream of its own
(engine/worker/stream_pending.py); whether the two overlap on the device, and what each
costs, is read from the device events of a torch profile (`prof.events()`: kernels, copies
and memsets, each with its stream as `device_resource_id`). The profiler names streams by
CUPTI's ids, not torch's, so `stream_labels` finds each named stream's id by profiling one
marker kernel on it. Measuring (`device_spans`, `stream_labels`), the pure arithmetic
(`busy_us`, `concurrency_us`, `summarize`) and the rendering (`render`) are apart.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceSpan:
    stream: int
    name: str
    start_us: float
    end_us: float


@dataclass(frozen=True)
class StreamTime:
    label: str
    busy_us: float  # the union of its spans
    events: int
    top: list[tuple[str, float]]  # its costliest device ops: name, total us


@dataclass(frozen=True)
class StreamReport:
    wall_us: float  # the host's wall time over the profiled work
    iterations: int
    streams: list[StreamTime]
    busy_us: float  # any stream busy
    concurrent_us: float  # two or more streams busy at once


# --- measuring --------------------------------------------------------------------------
@dataclass
class Profiled:
    wall_us: float  # the host's wall time over the profiled calls
    spans: list[DeviceSpan]  # their device work (none on a CPU)
    op_tables: str  # the profiler's ops by device time, then by host time (host alone: CPU)


def profile_calls(call, times: int, cuda: bool) -> Profiled:
    """`times` calls of `call` (a worker's iteration) under the torch profiler."""
    import time

    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(times):
            call()
        wall_us = (time.perf_counter() - start) * 1e6
    averages = prof.key_averages()
    keys = ("self_cuda_time_total", "self_cpu_time_total") if cuda else ("self_cpu_time_total",)
    tables = "\n".join(averages.table(sort_by=key, row_limit=30) for key in keys)
    return Profiled(wall_us, device_spans(prof.events()), tables)


def device_spans(events: Iterable) -> list[DeviceSpan]:
    """The device work of a profile's events (kernels, copies, memsets; not annotations)."""
    from torch.autograd import DeviceType

    return [
        DeviceSpan(
            getattr(e, "device_resource_id", e.thread), e.name, e.time_range.start,
            e.time_range.end,
        )
        for e in events
        if e.device_type == DeviceType.CUDA and not getattr(e, "is_user_annotation", False)
    ]  # fmt: skip


def stream_labels(streams: dict[str, object]) -> dict[int, str]:
    """The profiler's id of each named CUDA stream (torch.cuda.Stream), found by profiling one
    marker kernel on it; a stream whose marker the profiler did not show is left out."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    labels = {}
    for label, stream in streams.items():
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            with torch.cuda.stream(stream):
                marker.add_(1)
            torch.cuda.synchronize()
        ids = {span.stream for span in device_spans(prof.events())}
        if len(ids) == 1:
            labels[ids.pop()] = label
    return labels


# --- arithmetic -------------------------------------------------------------------------
def _merged(spans: Iterable[DeviceSpan]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted((s.start_us, s.end_us) for s in spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


def busy_us(spans: Iterable[DeviceSpan]) -> float:
    """The time at least one of `spans` runs (their union's length)."""
    return sum(end - start for start, end in _merged(spans))


def concurrency_us(spans: Iterable[DeviceSpan]) -> dict[int, float]:
    """Streams busy at once -> the time that many are (1, 2, ...; never 0)."""
    by_stream: dict[int, list[DeviceSpan]] = defaultdict(list)
    for span in spans:
        by_stream[span.stream].append(span)
    edges = sorted(
        (t, step)
        for stream_spans in by_stream.values()
        for start, end in _merged(stream_spans)
        for t, step in ((start, 1), (end, -1))
    )
    times: dict[int, float] = defaultdict(float)
    active, last = 0, 0.0
    for t, step in edges:
        if active:
            times[active] += t - last
        active, last = active + step, t
    return {k: v for k, v in sorted(times.items()) if v > 0}


def summarize(
    spans: list[DeviceSpan], labels: dict[int, str], wall_us: float, iterations: int, top: int = 4
) -> StreamReport:
    """Per stream (labelled, else by its id) its busy time and costliest ops; then the
    device's busy time over all streams and the part of it with two or more busy."""
    by_stream: dict[int, list[DeviceSpan]] = defaultdict(list)
    for span in spans:
        by_stream[span.stream].append(span)
    streams = []
    for stream, own in by_stream.items():
        totals: dict[str, float] = defaultdict(float)
        for span in own:
            totals[span.name] += span.end_us - span.start_us
        costliest = sorted(totals.items(), key=lambda item: -item[1])[:top]
        label = labels.get(stream, f"stream {stream}")
        streams.append(StreamTime(label, busy_us(own), len(own), costliest))
    streams.sort(key=lambda s: -s.busy_us)
    concurrency = concurrency_us(spans)
    return StreamReport(
        wall_us, iterations, streams, sum(concurrency.values()),
        sum(v for k, v in concurrency.items() if k >= 2),
    )  # fmt: skip


# --- showing ----------------------------------------------------------------------------
def render(report: StreamReport) -> str:
    n, wall = report.iterations, report.wall_us

    def row(label: str, us: float, extra: str = "") -> str:
        line = f"  {label:<32} {us / 1e3:9.3f} {us / n / 1e3:11.3f} {us / wall:8.0%}  {extra}"
        return line.rstrip()

    lines = [
        f"device time by stream over {n} iterations, wall {wall / 1e3:.3f} ms "
        f"({wall / n / 1e3:.3f} ms an iteration)",
        f"  {'stream':<32} {'busy ms':>9} {'ms a iter':>11} {'of wall':>8}  events",
    ]
    for stream in report.streams:
        lines.append(row(stream.label, stream.busy_us, str(stream.events)))
    lines.append(row("any stream (the GPU busy)", report.busy_us))
    lines.append(row("two or more streams at once", report.concurrent_us))
    lines.append(row("no stream (the GPU idle)", max(0.0, wall - report.busy_us)))
    for stream in report.streams:
        ops = ", ".join(f"{name[:60]} {us / 1e3:.2f} ms" for name, us in stream.top)
        lines.append(f"  {stream.label}: {ops}")
    return "\n".join(lines)

"""The load generator: closed loop (exactly C requests in flight; each completion sends the
next) or open loop (each request sent at its arrival time, arrivals.py, at most C in flight).

C lanes (coroutines, lanes.py) share one request sequence (request_sequence.py): a lane takes
the next index, sends it, reads its stream to the end, then takes the next. The generator
records raw client facts (`RequestRecord`, stamped with the slot it ran in) and the
steady-state window, and computes no metric. Times are seconds on `time.perf_counter()` from
the load's start (`LoadResult.t0_perf`; CLOCK_MONOTONIC on Linux, so other processes' clocks
compare; `t0_unix` anchors it to wall time).

Steady window, closed loop: from the later of (all C lanes busy, the last warmup request
completed) to the first moment fewer than C requests are in flight (the first completion that
finds the sequence exhausted: the drain begins) or the interruption, whichever comes first.
Throughout it exactly C requests are in flight and none of them is a warmup request.
Open loop: from the later of (the first measured request's arrival, the last warmup request
completed) to the last request's arrival or the interruption: the arrivals keep their rate
throughout it, and no warmup request is in flight.

With `shards=N`, N processes each run an event loop over their share of the lanes, all taking
indices from one shared counter (shards.py); their records and windows are merged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.analysis.schema import RequestRecord, Slot
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.lanes import Job, Lanes, LaneSummary, Progress, until
from harness.measure.request_sequence import PromptList, RequestSequence, RequestSpec
from harness.measure.shards import run_sharded

UNNAMED = Slot(arm="A", letter="A", server="A0", block=0, slot=0)
ENDPOINTS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "speech": "/v1/audio/speech",
}


@dataclass
class LoadResult:
    records: list[RequestRecord]  # in sequence order
    concurrency: int  # lanes: requests in flight, or the open loop's cap
    shards: int
    t0_perf: float  # perf_counter() at time zero
    t0_unix: float  # wall time at time zero
    steady_start_s: float | None  # both None when the run never held C in flight after warmup
    steady_end_s: float | None
    interrupted: bool
    client_cpu_s: float  # CPU time of the client's process(es) during the load


async def run_load(
    url: str,
    requests: Sequence[RequestSpec],
    concurrency: int,
    warmup: int = 0,
    slot: Slot = UNNAMED,
    on_progress: Callable[[Progress], None] | None = None,
    stop_event: asyncio.Event | None = None,
    *,
    model: str | None = None,
    shards: int = 1,
    ramp_s: float = 0.0,
    send_for_s: float | None = None,
    request_timeout_s: float = 600.0,
    progress_interval_s: float = 0.25,
    arrivals: ArrivalSchedule | None = None,
    headers: dict[str, str] | None = None,
    api: str = "completions",
    clients=None,
) -> LoadResult:
    """Drive `url` (a base URL or the endpoint itself) with `requests`, C in flight (closed
    loop), or each at its time in `arrivals` with at most C in flight (open loop); every record
    carries `slot`'s columns. `api`: "completions" (/v1/completions, SSE tokens), "chat"
    (/v1/chat/completions, each prompt as one user message) or "speech" (/v1/audio/speech, raw
    PCM: records carry the audio's arrival and bytes). `headers` go with every request (e.g.
    an Authorization header).

    The first `warmup` requests of the sequence are marked warmup. `on_progress` runs every
    `progress_interval_s`, never inside the per-token loop. Setting `stop_event` stops the load:
    requests in flight are cut and recorded with the error "interrupted". Failed requests
    (non-200, connection errors, timeouts, broken streams) become records with an error; nothing
    is raised for them. `ramp_s` spreads the lanes' first sends evenly over that many seconds
    (lane i starts at i * ramp_s / C), so requests of one length do not move in lockstep.
    `send_for_s` ends the sequence after that many seconds: no new request is sent, the ones in
    flight finish (the drain), as when the sequence runs out. `clients` (a ClientPool,
    harness/cluster/clients.py) drives the load from several hosts in place of `shards`.
    """
    if concurrency < 1 or shards < 1:
        raise ValueError("concurrency and shards must be >= 1")
    url = url.rstrip("/")
    path = ENDPOINTS[api]
    endpoint = url if url.endswith(path[path.rindex("/") :]) else url + path
    requests = requests if isinstance(requests, RequestSequence | PromptList) else list(requests)
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items()).encode()
    job = Job(
        endpoint=endpoint,
        model=model,
        requests=requests,
        concurrency=concurrency,
        warmup=warmup,
        slot=slot,
        ramp_s=ramp_s,
        timeout_s=request_timeout_s,
        send_for_s=send_for_s,
        arrivals=arrivals,
        headers=extra,
        api=api,
    )
    stop_event = stop_event or asyncio.Event()
    shards = min(shards, concurrency)
    if clients is not None:
        parts, t0_perf, t0_unix = await clients.run(
            job, on_progress, stop_event, progress_interval_s
        )
        return _merge(job, parts, t0_perf, t0_unix, len(parts))
    if shards > 1:
        parts, t0_perf, t0_unix = await run_sharded(
            job, shards, on_progress, stop_event, progress_interval_s
        )
        return _merge(job, parts, t0_perf, t0_unix, shards)
    sequence = iter(range(len(requests)))
    t0 = time.perf_counter()
    lanes = Lanes(job, range(concurrency), t0, until(job, t0, lambda: next(sequence, None)))
    t0_unix, cpu = time.time(), time.process_time()

    def tick() -> None:
        if on_progress is not None:
            on_progress(lanes.progress())

    await lanes.run(stop_event, tick, progress_interval_s)
    return _merge(job, [lanes.summary(time.process_time() - cpu)], lanes.t0, t0_unix, 1)


def _merge(
    job: Job, parts: list[LaneSummary], t0_perf: float, t0_unix: float, shards: int
) -> LoadResult:
    """One result from the lane groups' summaries: the window opens when every group is busy
    (open loop: at the first measured arrival) and the last warmup request is done, and closes
    at the first drain (open loop: the last arrival) or the stop."""
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.index)
    if job.arrivals is None:
        busy = [p.busy_s for p in parts]
        start = None if None in busy else max(busy)
        drained = [p.drain_s for p in parts]
    else:
        sent = [r.intended_send_s for r in records if not r.warmup]
        start = min(sent) if sent else None
        drained = [max(sent)] if sent else []
    if job.warmup > 0 and start is not None:
        done = [p.warmup_done_s for p in parts if p.warmup_done_s is not None]
        start = max(start, *done) if done else None
    ends = [s for s in (*drained, *(p.stopped_s for p in parts)) if s is not None]
    end = min(ends) if ends else None
    if start is None or end is None or start >= end:
        start = end = None
    interrupted = any(p.stopped_s is not None for p in parts)
    cpu = sum(p.cpu_s for p in parts)
    return LoadResult(
        records, job.concurrency, shards, t0_perf, t0_unix, start, end, interrupted, cpu
    )

"""Closed-loop load generator: exactly C requests in flight; each completion sends the next.

C lanes (coroutines) share one request sequence: a lane sends a request, reads its stream to the
end, then takes the next index. The generator records raw client facts (`RequestRecord`) and the
steady-state window, and computes no metric. Times are seconds on `time.perf_counter()` from
the load's start (`LoadResult.t0_perf`; CLOCK_MONOTONIC on Linux, so other processes' clocks
compare; `t0_unix` anchors it to wall time).

Steady window: from the later of (all C lanes busy, the last warmup request completed) to the
first moment fewer than C requests are in flight (the first completion that finds the sequence
exhausted: the drain begins) or the interruption, whichever comes first. Throughout it exactly C
requests are in flight and none of them is a warmup request.

With `shards=N`, N processes each run an event loop over their share of the lanes, all taking
indices from one shared counter; their records and windows are merged.
"""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass

import msgspec
import numpy as np

from harness.http_stream import Endpoint, Lane
from harness.records import RequestRecord

FAILURES = (TimeoutError, OSError)  # ResponseError is a ConnectionError, an OSError


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in the sequence (the same for every arm)
    prompt: list[int]  # token ids
    max_tokens: int


class RequestSequence(msgspec.Struct, frozen=True):
    """The requests of a scenario, drawn on demand: request i comes from a generator seeded with
    (seed, i), so every arm and every shard sees the same requests, and a million of them cost
    no memory. Lengths are uniform over the inclusive ranges, token ids uniform in [0, vocab)."""

    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    vocab_size: int
    count: int
    seed: int

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> RequestSpec:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        index %= self.count
        rng = np.random.default_rng([self.seed, index])
        prompt_len = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
        max_tokens = int(rng.integers(self.output_tokens[0], self.output_tokens[1] + 1))
        return RequestSpec(index, rng.integers(0, self.vocab_size, prompt_len).tolist(), max_tokens)


def build_requests(load, vocab_size: int, count: int, seed: int | None = None) -> RequestSequence:
    """`count` requests drawn from `load` (its prompt_tokens and output_tokens ranges, its seed)."""
    seed = load.seed if seed is None else seed
    return RequestSequence(
        tuple(load.prompt_tokens), tuple(load.output_tokens), vocab_size, count, seed
    )


@dataclass(frozen=True)
class Labels:
    arm: str = "A"
    block: int = 0
    slot: int = 0


@dataclass(frozen=True)
class Progress:
    sent: int
    done: int
    failed: int
    tokens: int
    elapsed_s: float

    @property
    def in_flight(self) -> int:
        return self.sent - self.done


@dataclass
class LoadResult:
    records: list[RequestRecord]  # in sequence order
    concurrency: int
    shards: int
    t0_perf: float  # perf_counter() at time zero
    t0_unix: float  # wall time at time zero
    steady_start_s: float | None  # both None when the run never held C in flight after warmup
    steady_end_s: float | None
    interrupted: bool
    client_cpu_s: float  # CPU time of the client's process(es) during the load


def run_loop(coro: Coroutine):
    """Run a coroutine on uvloop where available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


async def run_closed_loop(
    url: str,
    requests: Sequence[RequestSpec],
    concurrency: int,
    warmup: int = 0,
    labels: Labels = Labels(),
    on_progress: Callable[[Progress], None] | None = None,
    stop_event: asyncio.Event | None = None,
    *,
    model: str | None = None,
    shards: int = 1,
    ramp_s: float = 0.0,
    send_for_s: float | None = None,
    request_timeout_s: float = 600.0,
    progress_interval_s: float = 0.25,
) -> LoadResult:
    """Drive `url` (a base URL or a /v1/completions endpoint) with `requests`, C in flight.

    The first `warmup` requests of the sequence are marked warmup. `on_progress` runs every
    `progress_interval_s`, never inside the per-token loop. Setting `stop_event` stops the load:
    requests in flight are cut and recorded with the error "interrupted". Failed requests
    (non-200, connection errors, timeouts, broken streams) become records with an error; nothing
    is raised for them. `ramp_s` spreads the lanes' first sends evenly over that many seconds
    (lane i starts at i * ramp_s / C), so requests of one length do not move in lockstep.
    `send_for_s` ends the sequence after that many seconds: no new request is sent, the ones in
    flight finish (the drain), as when the sequence runs out.
    """
    if concurrency < 1 or shards < 1:
        raise ValueError("concurrency and shards must be >= 1")
    url = url.rstrip("/")
    endpoint = url if url.endswith("/completions") else url + "/v1/completions"
    requests = requests if isinstance(requests, RequestSequence) else list(requests)
    job = _Job(endpoint, model, requests, concurrency, warmup, labels.arm, labels.block,
               labels.slot, ramp_s, request_timeout_s, send_for_s)  # fmt: skip
    stop_event = stop_event or asyncio.Event()
    shards = min(shards, concurrency)
    if shards > 1:
        return await _run_sharded(job, shards, on_progress, stop_event, progress_interval_s)
    sequence = iter(range(len(requests)))
    t0 = time.perf_counter()
    shard = _Shard(job, range(concurrency), t0, _until(job, t0, lambda: next(sequence, None)))
    t0_unix, cpu = time.time(), time.process_time()

    def tick() -> None:
        if on_progress is not None:
            on_progress(shard.progress())

    await shard.run(stop_event, tick, progress_interval_s)
    return _merge(job, [shard.summary(time.process_time() - cpu)], shard.t0, t0_unix, 1)


def _until(job: _Job, t0: float, take: Callable[[], int | None]) -> Callable[[], int | None]:
    """`take`, ending the sequence once `job.send_for_s` seconds have passed since t0."""
    if job.send_for_s is None:
        return take
    deadline = t0 + job.send_for_s
    return lambda: take() if time.perf_counter() < deadline else None


class _Job(msgspec.Struct, array_like=True):
    """Everything a shard needs; crosses to shard processes as msgpack."""

    endpoint: str
    model: str | None
    requests: RequestSequence | list[RequestSpec]
    concurrency: int
    warmup: int
    arm: str
    block: int
    slot: int
    ramp_s: float
    timeout_s: float
    send_for_s: float | None = None


class _Summary(msgspec.Struct, array_like=True):
    """One shard's records and the moments that bound the steady window."""

    records: list[RequestRecord]
    busy_s: float | None  # when all of the shard's lanes were first busy
    warmup_done_s: float | None  # the last warmup completion the shard saw
    drain_s: float | None  # the first completion that found the sequence exhausted
    stopped_s: float | None
    cpu_s: float


class _Shard:
    """One event loop's lanes (their numbers among all C); `take()` gives the next index of the
    sequence, or None once it is exhausted."""

    def __init__(self, job: _Job, lanes: range, t0: float, take: Callable[[], int | None]):
        self.job, self.lanes, self.t0, self.take = job, lanes, t0, take
        self.records: list[RequestRecord] = []
        self.sent = self.done = self.failed = self.tokens = 0
        self.busy_s = self.warmup_done_s = self.drain_s = self.stopped_s = None

    def progress(self) -> Progress:
        elapsed = time.perf_counter() - self.t0
        return Progress(self.sent, self.done, self.failed, self.tokens, elapsed)

    def summary(self, cpu_s: float) -> _Summary:
        return _Summary(self.records, self.busy_s, self.warmup_done_s, self.drain_s,
                        self.stopped_s, cpu_s)  # fmt: skip

    async def run(self, stop: asyncio.Event, tick: Callable[[], None], interval_s: float) -> None:
        """Run the lanes until the sequence is done or `stop` is set. A lane that raises (a bug,
        not a failed request) stops the others and is raised."""
        endpoint = Endpoint(self.job.endpoint)
        await asyncio.sleep(self.t0 - time.perf_counter())  # shards start together
        lanes = [asyncio.create_task(self._lane(endpoint, lane)) for lane in self.lanes]
        helpers = [
            asyncio.create_task(_every(interval_s, tick)),
            asyncio.create_task(stop.wait()),
        ]
        everything = asyncio.gather(*lanes)
        try:
            await asyncio.wait([everything, helpers[1]], return_when=asyncio.FIRST_COMPLETED)
            if not everything.done():
                self.stopped_s = time.perf_counter() - self.t0
        finally:
            for task in lanes + helpers:
                task.cancel()
            ended = await asyncio.gather(*lanes, return_exceptions=True)
            if everything.done() and not everything.cancelled():
                everything.exception()  # seen: it is raised below, from `ended`
            gc.unfreeze()
        raised = [e for e in ended if isinstance(e, Exception)]
        if raised:
            raise raised[0]
        tick()

    async def _lane(self, endpoint: Endpoint, lane: int) -> None:
        intended = lane * self.job.ramp_s / self.job.concurrency  # when the lane is first free
        await asyncio.sleep(self.t0 + intended - time.perf_counter())
        conn = Lane(endpoint)
        try:
            while (index := self.take()) is not None:
                intended = await self._request(conn, index, intended)
        finally:
            conn.close()
        if self.drain_s is None:
            self.drain_s = intended

    async def _request(self, conn: Lane, index: int, intended: float) -> float:
        job, t0 = self.job, self.t0
        spec = job.requests[index]
        body = {"prompt": spec.prompt, "max_tokens": spec.max_tokens, "ignore_eos": True,
                "temperature": 0.0, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        if job.model is not None:
            body["model"] = job.model
        data = msgspec.json.encode(body)
        headers = b"Content-Type: application/json\r\nX-Request-Id: %d\r\n" % index
        rec = RequestRecord(job.arm, job.block, job.slot, index, index < job.warmup,
                            len(spec.prompt), spec.max_tokens, intended, 0.0)  # fmt: skip
        self.sent += 1
        if self.busy_s is None and self.sent - self.done == len(self.lanes):
            self.busy_s = time.perf_counter() - t0
        rec.send_s = time.perf_counter() - t0
        stream = _Stream(rec, t0)
        try:
            rec.status = await conn.post(data, headers, stream.feed, job.timeout_s)
            stream.finish()
        except asyncio.CancelledError:
            rec.status, rec.error = conn.last_status, "interrupted"
            raise
        except FAILURES as e:
            rec.status = conn.last_status
            rec.error = f"{type(e).__name__}: {e}".removesuffix(": ")
        finally:
            self.tokens += len(rec.token_times_s)
            if rec.end_s is None:  # a failure before the stream's end
                rec.end_s = time.perf_counter() - t0
            self.done += 1
            self.failed += not rec.ok
            self.records.append(rec)
            if rec.warmup:
                self.warmup_done_s = max(self.warmup_done_s or 0.0, rec.end_s)
        return rec.end_s


class _Stream:
    """One response, parsed as it arrives: SSE events counted into token times (every token of
    a piece gets the piece's arrival time); a non-200 body kept for the error text.

    A content event carries one token, or len(token_ids) where the server lists them; the
    final usage.completion_tokens, when sent, becomes output_tokens (token_times_s keeps what
    was streamed, so the two can be compared)."""

    def __init__(self, rec: RequestRecord, t0: float):
        self.rec, self.t0 = rec, t0
        self.tail, self.done, self.usage, self.other = b"", False, None, b""

    def feed(self, data: bytes, now: float, status: int) -> None:
        if status != 200:
            self.other = (self.other + data)[:300]
            return
        rec, t = self.rec, now - self.t0
        chunk = self.tail + data if self.tail else data
        if b"\r" in chunk:
            chunk = chunk.replace(b"\r\n", b"\n")
        *events, self.tail = chunk.split(b"\n\n")
        for raw in events:
            data = _sse_data(raw)
            if data is None:
                continue
            if data == b"[DONE]":
                self.done = True
                continue
            try:
                event = _decode_event(data)
            except msgspec.DecodeError as exc:
                rec.error = rec.error or f"malformed event: {exc}"[:300]
                continue
            if event.error is not None:
                rec.error = f"stream error: {event.error}"[:300]
            if event.usage is not None and event.usage.completion_tokens is not None:
                self.usage = event.usage.completion_tokens
            if event.choices:
                choice = event.choices[0]
                n = len(choice.token_ids) if choice.token_ids else int(bool(choice.text))
                rec.token_times_s.extend([t] * n)
                rec.finish_reason = choice.finish_reason or rec.finish_reason

    def finish(self) -> None:
        rec = self.rec
        rec.end_s = time.perf_counter() - self.t0
        if rec.status != 200:
            rec.error = f"HTTP {rec.status}: {self.other.decode(errors='replace')}"[:300]
            return
        times = rec.token_times_s
        rec.first_token_s = times[0] if times else None
        rec.output_tokens = len(times) if self.usage is None else self.usage
        if not self.done and rec.error is None:
            rec.error = "stream ended before [DONE]"


class _Choice(msgspec.Struct):
    text: str = ""
    token_ids: list[int] | None = None
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None


class _Event(msgspec.Struct):
    """The few fields of a completion event the client reads; the decoder skips the rest
    (a typed decode costs about 0.3 us per event, less than two byte searches)."""

    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: object = None


_decode_event = msgspec.json.Decoder(_Event).decode


def _sse_data(raw: bytes) -> bytes | None:
    """The data of one SSE event (None for comments and events without data)."""
    if raw.startswith(b"data:") and b"\n" not in raw:
        return raw[5:].strip()
    lines = [line[5:].strip() for line in raw.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


async def _every(interval_s: float, tick: Callable[[], None]) -> None:
    """Call `tick` every interval. Each call also freezes the live objects (gc.freeze): a full
    collection over the records gathered so far would pause the loop for tens of milliseconds,
    a pause that would land in the latencies. `_Shard.run` unfreezes at the end."""
    while True:
        await asyncio.sleep(interval_s)
        gc.freeze()
        tick()


def _merge(
    job: _Job, parts: list[_Summary], t0_perf: float, t0_unix: float, shards: int
) -> LoadResult:
    """One result from the shards' summaries: the window opens when every shard is busy and the
    last warmup request is done, and closes at the first drain or the stop."""
    busy = [p.busy_s for p in parts]
    start = None if None in busy else max(busy)
    if job.warmup > 0 and start is not None:
        done = [p.warmup_done_s for p in parts if p.warmup_done_s is not None]
        start = max(start, *done) if done else None
    ends = [s for p in parts for s in (p.drain_s, p.stopped_s) if s is not None]
    end = min(ends) if ends else None
    if start is None or end is None or start >= end:
        start = end = None
    records = sorted((r for p in parts for r in p.records), key=lambda r: r.index)
    interrupted = any(p.stopped_s is not None for p in parts)
    cpu = sum(p.cpu_s for p in parts)
    return LoadResult(
        records, job.concurrency, shards, t0_perf, t0_unix, start, end, interrupted, cpu
    )


async def _run_sharded(
    job: _Job, shards: int, on_progress, stop_event: asyncio.Event, interval_s: float
) -> LoadResult:
    ctx = mp.get_context("spawn")
    counter, t0 = ctx.Value("q", 0), ctx.Value("d", 0.0, lock=False)
    go, stop = ctx.Event(), ctx.Event()
    counts = ctx.Array("q", 4 * shards, lock=False)  # sent, done, failed, tokens of each shard
    blob, pipes, procs = msgspec.msgpack.encode(job), [], []
    for k in range(shards):
        receiver, sender = ctx.Pipe(duplex=False)
        args = (blob, k, shards, sender, counter, t0, go, stop, counts, interval_s)
        procs.append(ctx.Process(target=_shard_main, args=args, daemon=True))
        procs[-1].start()
        pipes.append(receiver)
    loop = asyncio.get_running_loop()

    def tick() -> None:
        if stop_event.is_set():
            stop.set()
        if on_progress is not None:
            c = counts[:]
            on_progress(Progress(*(sum(c[i::4]) for i in range(4)), time.perf_counter() - t0.value))

    try:
        for pipe in pipes:  # each shard says it is ready
            await loop.run_in_executor(None, pipe.recv_bytes)
        t0.value = time.perf_counter() + 0.05
        t0_unix = time.time() + (t0.value - time.perf_counter())
        go.set()
        ticker = asyncio.create_task(_every(interval_s, tick))
        blobs = await asyncio.gather(*(loop.run_in_executor(None, p.recv_bytes) for p in pipes))
        ticker.cancel()
        gc.unfreeze()
        tick()
    except EOFError:
        raise RuntimeError("a load-generator shard process died; its traceback is above") from None
    finally:
        stop.set()
        go.set()
        for p in procs:
            p.join(timeout=5)
    parts = [msgspec.msgpack.decode(b, type=_Summary) for b in blobs]
    return _merge(job, parts, t0.value, t0_unix, shards)


def _shard_main(blob, k, shards, sender, counter, t0, go, stop, counts, interval_s) -> None:
    """Shard process k: lanes k, k + shards, ... on its own event loop; its summary goes back as
    msgpack. SIGINT is ignored: the parent decides when to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = msgspec.msgpack.decode(blob, type=_Job)
    total = len(job.requests)

    def take() -> int | None:
        with counter.get_lock():
            index = counter.value
            if index >= total:
                return None
            counter.value = index + 1
        return index

    sender.send_bytes(b"ready")
    go.wait()
    if stop.is_set():  # the parent gave up before the start
        return
    cpu = time.process_time()

    async def main() -> _Summary:
        shard, local_stop = (
            _Shard(job, range(k, job.concurrency, shards), t0.value, _until(job, t0.value, take)),
            asyncio.Event(),
        )

        def tick() -> None:
            counts[4 * k : 4 * k + 4] = [shard.sent, shard.done, shard.failed, shard.tokens]
            if stop.is_set():
                local_stop.set()

        await shard.run(local_stop, tick, interval_s)
        return shard.summary(time.process_time() - cpu)

    sender.send_bytes(msgspec.msgpack.encode(run_loop(main())))

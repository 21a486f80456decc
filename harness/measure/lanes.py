"""The load's lanes on one event loop: each lane takes the next index of the shared sequence,
sends it (at once in the closed loop; at its arrival time in the open loop), reads its stream
to the end, and takes the next. They record raw client facts (`RequestRecord`, stamped with
the slot they ran in) and the moments that bound the steady window, and compute nothing.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass

import msgspec

from harness.analysis.schema import RequestRecord, Slot
from harness.measure.arrivals import ArrivalSchedule
from harness.measure.http_client import Endpoint, Lane
from harness.measure.pcm import PcmReader
from harness.measure.request_sequence import Requests, RequestSpec
from harness.measure.sse import ResponseReader

FAILURES = (TimeoutError, OSError)  # ResponseError is a ConnectionError, an OSError


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


class Job(msgspec.Struct, array_like=True):
    """Everything a group of lanes needs; crosses to shard processes as msgpack."""

    endpoint: str
    model: str | None
    requests: Requests | list[RequestSpec]
    concurrency: int  # lanes: the requests in flight (closed loop) or their cap (open loop)
    warmup: int
    slot: Slot
    ramp_s: float
    timeout_s: float
    send_for_s: float | None = None
    arrivals: ArrivalSchedule | None = None  # the open loop's; None: closed loop
    headers: bytes = b""  # extra header lines, each ending in CRLF
    # "completions"; "chat": /v1/chat/completions (a text prompt as one user message);
    # "speech": /v1/audio/speech, raw PCM back
    api: str = "completions"


class LaneSummary(msgspec.Struct, array_like=True):
    """One group's records and the moments that bound the steady window."""

    records: list[RequestRecord]
    busy_s: float | None  # when all of the group's lanes were first busy
    warmup_done_s: float | None  # the last warmup completion the group saw
    drain_s: float | None  # the first completion that found the sequence exhausted
    stopped_s: float | None
    cpu_s: float


def until(job: Job, t0: float, take: Callable[[], int | None]) -> Callable[[], int | None]:
    """`take`, ending the sequence once `job.send_for_s` seconds have passed since t0 (in the
    open loop: at the first request due after them)."""
    if job.send_for_s is None:
        return take
    if job.arrivals is not None:
        arrivals, end = job.arrivals, job.send_for_s

        def scheduled() -> int | None:
            index = take()
            return index if index is not None and arrivals[index] < end else None

        return scheduled
    deadline = t0 + job.send_for_s
    return lambda: take() if time.perf_counter() < deadline else None


def request_body(job: Job, spec: RequestSpec) -> bytes:
    """The JSON body of one request: exact lengths (ignore_eos), greedy; a completion (or a
    chat completion: the prompt as one user message) streamed with usage, a speech request
    (`job.api` "speech") its input as token ids and PCM back."""
    body = {"max_tokens": spec.max_tokens, "ignore_eos": True, "temperature": 0.0}
    if job.api == "speech":
        body |= {"input": spec.prompt, "response_format": "pcm"}
    else:
        prompt = {"prompt": spec.prompt}
        if job.api == "chat":
            prompt = {"messages": [{"role": "user", "content": spec.prompt}]}
        body |= prompt | {"stream": True, "stream_options": {"include_usage": True}}
    if job.model is not None:
        body["model"] = job.model
    return msgspec.json.encode(body)


class Lanes:
    """One event loop's lanes (their numbers among all C); `take()` gives the next index of the
    sequence, or None once it is exhausted."""

    def __init__(self, job: Job, lanes: range, t0: float, take: Callable[[], int | None]):
        self.job, self.lanes, self.t0, self.take = job, lanes, t0, take
        self.slot = astuple(job.slot)  # the columns every record starts with
        self.records: list[RequestRecord] = []
        self.sent = self.done = self.failed = self.tokens = 0
        self.busy_s = self.warmup_done_s = self.drain_s = self.stopped_s = None

    def progress(self) -> Progress:
        elapsed = time.perf_counter() - self.t0
        return Progress(self.sent, self.done, self.failed, self.tokens, elapsed)

    def summary(self, cpu_s: float) -> LaneSummary:
        moments = (self.busy_s, self.warmup_done_s, self.drain_s, self.stopped_s)
        return LaneSummary(self.records, *moments, cpu_s)

    async def run(self, stop: asyncio.Event, tick: Callable[[], None], interval_s: float) -> None:
        """Run the lanes until the sequence is done or `stop` is set. A lane that raises (a bug,
        not a failed request) stops the others and is raised."""
        endpoint = Endpoint(self.job.endpoint)
        await asyncio.sleep(self.t0 - time.perf_counter())  # shards start together
        lanes = [asyncio.create_task(self._lane(endpoint, lane)) for lane in self.lanes]
        helpers = [
            asyncio.create_task(every(interval_s, tick)),
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
        arrivals = self.job.arrivals
        intended = lane * self.job.ramp_s / self.job.concurrency  # when the lane is first free
        await asyncio.sleep(self.t0 + intended - time.perf_counter())
        conn = Lane(endpoint)
        try:
            while (index := self.take()) is not None:
                if arrivals is not None:  # open loop: the request's own time, not the lane's
                    intended = arrivals[index]
                    await until_time(self.t0 + intended)
                intended = await self._request(conn, index, intended)
        finally:
            conn.close()
        if self.drain_s is None:
            self.drain_s = intended

    async def _request(self, conn: Lane, index: int, intended: float) -> float:
        job, t0 = self.job, self.t0
        spec = job.requests[index]
        data = request_body(job, spec)
        headers = b"Content-Type: application/json\r\nX-Request-Id: %d\r\n" % index
        warmup = index < job.warmup
        rec = RequestRecord(
            *self.slot, index, warmup, spec.prompt_tokens, spec.max_tokens, intended, 0.0
        )
        self.sent += 1
        if self.busy_s is None and self.sent - self.done == len(self.lanes):
            self.busy_s = time.perf_counter() - t0
        rec.send_s = time.perf_counter() - t0
        reader = PcmReader(rec, t0) if job.api == "speech" else ResponseReader(rec, t0)
        try:
            rec.status = await conn.post(data, headers + job.headers, reader.feed, job.timeout_s)
            reader.finish()
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


TIMER_SLACK_S = 0.0015  # event-loop timers fire up to a millisecond early (ms resolution)


async def until_time(due: float) -> None:
    """Return at perf_counter() `due`, neither early nor a timer tick late: a timer wakes the
    lane shortly before, then it yields to the loop until the moment comes."""
    if due - time.perf_counter() > TIMER_SLACK_S:
        await asyncio.sleep(due - time.perf_counter() - TIMER_SLACK_S)
    while time.perf_counter() < due:
        await asyncio.sleep(0)


async def every(interval_s: float, tick: Callable[[], None]) -> None:
    """Call `tick` every interval. Each call also freezes the live objects (gc.freeze): a full
    collection over the records gathered so far would pause the loop for tens of milliseconds,
    a pause that would land in the latencies. `Lanes.run` unfreezes at the end."""
    while True:
        await asyncio.sleep(interval_s)
        gc.freeze()
        tick()

"""The API server's end of the ZMQ link: submits requests, routes frames to their streams.

One reader task routes everything the worker sends. It survives what one message can do
(a stats caller that gave up, a frame it cannot decode); if it dies anyway, or the worker
exits, `fail` ends every open stream with an error frame and `lost` says why, so the server
stops instead of hanging (docs/RELIABILITY.md).

A watchdog task does the same for a worker that is there but stalled: from Ready on the worker
sends a Heartbeat at least every HEARTBEAT_S (engine/worker/heartbeat.py), so one silent for
`stall_timeout_s` past its longest step so far is stuck (stopped, a hung device, a deadlock);
`stalled` says so, and the server kills it rather than asking it to stop.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Callable

import zmq
import zmq.asyncio

from engine.messages import (
    Abort,
    AddRequest,
    GetStats,
    Heartbeat,
    Ready,
    Shutdown,
    StepFrames,
    TokenFrame,
    WorkerStats,
    decode_from_worker,
    encode,
)
from engine.worker.heartbeat import HEARTBEAT_S

log = logging.getLogger("engine.api")

STATS_TIMEOUT_S = 10.0


def _nothing(_tokens: int) -> None:
    pass


class WorkerUnavailable(RuntimeError):
    """The worker is gone or the server is stopping: nothing new is accepted."""


class WorkerClient:
    def __init__(
        self,
        ipc_dir: str,
        stall_timeout_s: float = 10.0,
        on_step: Callable[[int], None] | None = None,
    ):
        # on_step(open streams): called per message of frames, one a worker step (metrics.py)
        self._on_step = on_step or (lambda _open: None)
        self.ctx = zmq.asyncio.Context()
        # Sends never wait: a plain socket with no high-water mark, so submit() stays sync.
        self._sync_ctx = zmq.Context()
        self.to_worker = self._sync_ctx.socket(zmq.PUSH)
        self.to_worker.setsockopt(zmq.SNDHWM, 0)
        self.to_worker.connect(f"ipc://{ipc_dir}/to_worker")
        self.from_worker = self.ctx.socket(zmq.PULL)
        self.from_worker.bind(f"ipc://{ipc_dir}/from_worker")
        self.ready: asyncio.Future[Ready] | None = None
        self.lost: asyncio.Future[str] | None = None  # why the worker is gone, once it is
        self.unavailable: str | None = None  # why new requests are refused, once they are
        # rid -> (the queue its frames go to, called with a frame's token count as it comes)
        self._streams: dict[int, tuple[asyncio.Queue[TokenFrame], Callable[[int], None]]] = {}
        # The worker answers GetStats in order: the oldest caller gets the next answer, and
        # one that gave up (cancelled) still takes its own answer out of the line.
        self._stats: deque[asyncio.Future[WorkerStats]] = deque()
        self._rids = itertools.count(1)
        self._reader: asyncio.Task | None = None
        self._watchdog: asyncio.Task | None = None
        self._closing = False
        self.stall_timeout_s = stall_timeout_s
        self.stalled = False  # the watchdog found the worker silent: it is to be killed
        self._heard = 0.0  # when the worker last sent anything (the loop's clock)
        self._longest_step_s = 0.0  # the longest step it reports

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.ready = loop.create_future()
        self.lost = loop.create_future()
        self._reader = asyncio.create_task(self._read())
        self._reader.add_done_callback(self._reader_ended)
        self._watchdog = asyncio.create_task(self._watch())

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            data = await self.from_worker.recv()
            self._heard = loop.time()
            try:
                self._route(decode_from_worker(data))
            except Exception:  # one bad message must not silence every stream
                log.exception("dropped a message from the worker")

    def _route(self, msg: object) -> None:
        if isinstance(msg, StepFrames):
            for frame in msg.frames:
                stream = self._streams.get(frame.rid)
                if stream is not None:
                    queue, on_tokens = stream
                    if frame.tokens:  # its clock read now: a handler may drain frames late
                        on_tokens(len(frame.tokens))
                    queue.put_nowait(frame)
            self._on_step(len(self._streams))
        elif isinstance(msg, WorkerStats):
            if self._stats:
                future = self._stats.popleft()
                if not future.done():
                    future.set_result(msg)
        elif isinstance(msg, Heartbeat):
            self._longest_step_s = msg.longest_step_s
        elif isinstance(msg, Ready) and not self.ready.done():
            self.ready.set_result(msg)

    async def _watch(self) -> None:
        """From Ready on: `fail` once the worker has been silent for `stall_timeout_s` past
        its next heartbeat's due time and its longest step, unless what it sent is still
        waiting to be read (a busy loop here)."""
        loop = asyncio.get_running_loop()
        await self.ready
        while not self.lost.done():
            limit = HEARTBEAT_S + self._longest_step_s + self.stall_timeout_s
            silent = loop.time() - self._heard
            if silent < limit or self.from_worker.get(zmq.EVENTS) & zmq.POLLIN:
                await asyncio.sleep(max(0.05, limit - silent))
                continue
            self.stalled = True
            self.fail(
                f"the worker stalled: nothing from it for {silent:.1f} s (its longest step took"
                f" {self._longest_step_s:.2f} s; engine.stall_timeout_s={self.stall_timeout_s:g})"
            )

    def _reader_ended(self, task: asyncio.Task) -> None:
        if self._closing:
            return
        # Anything else that ends the reader (an error, or its socket closed under it, which
        # cancels it) leaves nobody routing frames: that must not pass unnoticed.
        exc = None if task.cancelled() else task.exception()
        reason = (
            f"the link to the worker failed: {exc!r}" if exc else "the link to the worker closed"
        )
        log.error("the reader of worker messages stopped", exc_info=exc)
        self.fail(reason)

    def fail(self, reason: str) -> None:
        """The worker is gone: end every open stream with an error, refuse what comes next."""
        if self.lost.done():
            return
        self.lost.set_result(reason)
        self._refuse(reason, "error", error=reason)

    def stop(self) -> None:
        """The server is stopping: end every open stream (abort), refuse what comes next."""
        self._refuse("the server is stopping", "abort")

    def _refuse(self, reason: str, finish_reason: str, error: str | None = None) -> None:
        self.unavailable = self.unavailable or reason
        for rid, (queue, _) in self._streams.items():
            queue.put_nowait(TokenFrame(rid, [], finish_reason=finish_reason, error=error))
        while self._stats:
            future = self._stats.popleft()
            if not future.done():
                future.set_exception(WorkerUnavailable(reason))

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def submit(
        self, make: Callable[[int], AddRequest], on_tokens: Callable[[int], None] | None = None
    ) -> tuple[int, asyncio.Queue[TokenFrame]]:
        """Send `make(rid)` (an AddRequest) and return the queue its frames arrive on;
        `on_tokens(n)` is called for each frame of n tokens as it is read from the worker,
        before the queue has it (metrics.RequestTally.frame: when the API server got the
        tokens, whenever the reply's handler drains them)."""
        if self.unavailable:
            raise WorkerUnavailable(self.unavailable)
        rid = next(self._rids)
        queue: asyncio.Queue[TokenFrame] = asyncio.Queue()
        self._streams[rid] = queue, on_tokens or _nothing
        self.to_worker.send(encode(make(rid)))
        return rid, queue

    def release(self, rid: int, abort: bool) -> None:
        """Forget a request's stream; tell the worker to drop it if it is still running."""
        if self._streams.pop(rid, None) is not None and abort and not self.lost.done():
            self.to_worker.send(encode(Abort(rid)))

    async def stats(self) -> WorkerStats:
        """The worker's pool; TimeoutError when it does not answer within STATS_TIMEOUT_S."""
        if self.unavailable:
            raise WorkerUnavailable(self.unavailable)
        future = asyncio.get_running_loop().create_future()
        self._stats.append(future)
        self.to_worker.send(encode(GetStats()))
        return await asyncio.wait_for(future, timeout=STATS_TIMEOUT_S)

    def shutdown_worker(self) -> None:
        """Ask the worker to exit; keep reading, so what it sends on the way out is drained."""
        try:
            self.to_worker.send(encode(Shutdown()), zmq.NOBLOCK)
        except zmq.Again:  # no worker to tell
            pass

    def close(self) -> None:
        """Close the link; call it once the worker has exited (or been given up on): what is
        still queued for the worker is dropped, not waited on."""
        self._closing = True
        for task in (self._reader, self._watchdog):
            if task is not None:
                task.cancel()
        self.to_worker.close(0)
        self.from_worker.close(0)
        self._sync_ctx.term()
        self.ctx.term()

"""The API server's end of the ZMQ link: submits requests, routes frames to their streams."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import zmq
import zmq.asyncio

from engine.messages import (
    Abort,
    AddRequest,
    GetStats,
    Ready,
    Shutdown,
    StepFrames,
    TokenFrame,
    WorkerStats,
    decode_from_worker,
    encode,
)


class WorkerClient:
    def __init__(self, ipc_dir: str):
        self.ctx = zmq.asyncio.Context()
        # Sends never wait: a plain socket with no high-water mark, so submit() stays sync.
        self._sync_ctx = zmq.Context()
        self.to_worker = self._sync_ctx.socket(zmq.PUSH)
        self.to_worker.setsockopt(zmq.SNDHWM, 0)
        self.to_worker.setsockopt(zmq.LINGER, 1000)
        self.to_worker.connect(f"ipc://{ipc_dir}/to_worker")
        self.from_worker = self.ctx.socket(zmq.PULL)
        self.from_worker.bind(f"ipc://{ipc_dir}/from_worker")
        self.ready: asyncio.Future[Ready] | None = None
        self._streams: dict[int, asyncio.Queue[TokenFrame]] = {}
        self._stats: list[asyncio.Future[WorkerStats]] = []
        self._rids = itertools.count(1)
        self._reader: asyncio.Task | None = None

    def start(self) -> None:
        self.ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while True:
            msg = decode_from_worker(await self.from_worker.recv())
            if isinstance(msg, StepFrames):
                for frame in msg.frames:
                    queue = self._streams.get(frame.rid)
                    if queue is not None:
                        queue.put_nowait(frame)
            elif isinstance(msg, WorkerStats):
                if self._stats:
                    self._stats.pop(0).set_result(msg)
            elif isinstance(msg, Ready) and not self.ready.done():
                self.ready.set_result(msg)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def submit(self, make: Callable[[int], AddRequest]) -> tuple[int, asyncio.Queue[TokenFrame]]:
        """Send `make(rid)` (an AddRequest) and return the queue its frames arrive on."""
        rid = next(self._rids)
        queue: asyncio.Queue[TokenFrame] = asyncio.Queue()
        self._streams[rid] = queue
        self.to_worker.send(encode(make(rid)))
        return rid, queue

    def release(self, rid: int, abort: bool) -> None:
        """Forget a request's stream; tell the worker to drop it if it is still running."""
        if self._streams.pop(rid, None) is not None and abort:
            self.to_worker.send(encode(Abort(rid)))

    async def stats(self) -> WorkerStats:
        future = asyncio.get_running_loop().create_future()
        self._stats.append(future)
        self.to_worker.send(encode(GetStats()))
        return await asyncio.wait_for(future, timeout=10)

    def close(self) -> None:
        self.to_worker.send(encode(Shutdown()))
        if self._reader is not None:
            self._reader.cancel()
        self.to_worker.close()
        self.from_worker.close(0)
        self._sync_ctx.term()
        self.ctx.term()

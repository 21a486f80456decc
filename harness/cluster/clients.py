"""Load from several client hosts for one target (`bench measure URL --clients N`): N Ray
actors, spread over the cluster's nodes, each driving lanes k, k + N, ... of the C in flight and
requests k, k + N, ... of the sequence, against the one server.

Before the load the driver measures each client's clock against its own (clock.py) and names
one start time on its own clock; each client starts at that moment read on its clock (the
driver's time plus the client's offset), so time zero of every client's records is the same
instant, within the offset's error (at most half the kept round trip), and the clients' parts
merge into one load as the shards of one machine do (loadgen.run_load): the steady window
is the time every client holds its whole share in flight. Each client's node, offset and
round trip are in the manifest's `clients`.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable

import msgspec
import ray

from harness.cluster import clock
from harness.measure.event_loop import run_loop
from harness.measure.lanes import Job, Lanes, LaneSummary, Progress, every, until

START_AHEAD_S = 1.0  # time between naming the start and the start: every client is ready


@ray.remote(num_cpus=1, max_concurrency=3)  # `run` in one thread; `now`, `progress`, `stop`
class Client:
    """One client host's share of the load."""

    def __init__(self):
        self.lanes: Lanes | None = None
        self.stopping = threading.Event()

    def now(self) -> float:
        return time.time()

    def where(self) -> dict:
        return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname()}

    def progress(self) -> list[int]:
        lanes = self.lanes
        return (
            [0, 0, 0, 0] if lanes is None else [lanes.sent, lanes.done, lanes.failed, lanes.tokens]
        )

    def stop(self) -> None:
        self.stopping.set()

    def run(self, blob: bytes, k: int, n: int, start_unix: float, interval_s: float) -> bytes:
        """Lanes and requests k, k + n, ... from `start_unix` (this host's wall clock); the
        summary as msgpack (times from that start, on this host's monotonic clock)."""
        job = msgspec.msgpack.decode(blob, type=Job)
        t0 = time.perf_counter() + (start_unix - time.time())
        indices = iter(range(k, len(job.requests), n))
        cpu = time.process_time()

        async def main() -> LaneSummary:
            lanes = Lanes(
                job, range(k, job.concurrency, n), t0, until(job, t0, lambda: next(indices, None))
            )
            self.lanes = lanes
            stop = asyncio.Event()

            def tick() -> None:
                if self.stopping.is_set():
                    stop.set()

            await lanes.run(stop, tick, interval_s)
            return lanes.summary(time.process_time() - cpu)

        return msgspec.msgpack.encode(run_loop(main()))


class ClientPool:
    """N client actors spread over the cluster's nodes, each with its clock offset."""

    def __init__(self, clients: int):
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.group = placement_group([{"CPU": 1}] * clients, strategy="SPREAD")
        ray.get(self.group.ready())
        self.actors = [
            Client.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.group, k)
            ).remote()
            for k in range(clients)
        ]
        self.where = ray.get([a.where.remote() for a in self.actors])
        self.offsets = [
            clock.measure(lambda a=a: ray.get(a.now.remote()), time.time) for a in self.actors
        ]

    def manifest(self) -> list[dict]:
        """Each client's node and clock offset, as the manifest's `clients` records them."""
        pairs = zip(self.where, self.offsets, strict=True)
        return [w | {"client": k} | o.manifest() for k, (w, o) in enumerate(pairs)]

    async def run(
        self,
        job: Job,
        on_progress: Callable[[Progress], None] | None,
        stop_event: asyncio.Event,
        interval_s: float,
    ) -> tuple[list[LaneSummary], float, float]:
        """The clients' summaries, and the driver's perf_counter() and wall time at their
        common start (time zero of every record)."""
        start_unix = time.time() + START_AHEAD_S
        t0_perf = time.perf_counter() + START_AHEAD_S
        blob, n = msgspec.msgpack.encode(job), len(self.actors)
        runs = [
            a.run.remote(blob, k, n, start_unix + o.offset_s, interval_s)
            for k, (a, o) in enumerate(zip(self.actors, self.offsets, strict=True))
        ]
        loop = asyncio.get_running_loop()
        tick = lambda: _tick(self.actors, on_progress, t0_perf, stop_event, loop)  # noqa: E731
        ticker = asyncio.create_task(every(interval_s, tick))
        try:
            blobs = await asyncio.gather(*runs)
        finally:
            ticker.cancel()
        parts = [msgspec.msgpack.decode(b, type=LaneSummary) for b in blobs]
        return parts, t0_perf, start_unix

    def close(self) -> None:
        for actor in self.actors:
            ray.kill(actor)
        ray.util.remove_placement_group(self.group)


def _tick(actors, on_progress, t0_perf, stop_event, loop) -> None:
    """The progress summed over the clients (a stop passed on to them), off the event loop."""
    if stop_event.is_set():
        for actor in actors:
            actor.stop.remote()
    if on_progress is None:
        return

    def counts() -> None:
        c = [sum(x) for x in zip(*ray.get([a.progress.remote() for a in actors]), strict=True)]
        elapsed = time.perf_counter() - t0_perf
        loop.call_soon_threadsafe(on_progress, Progress(*c, elapsed))

    threading.Thread(target=counts, daemon=True).start()

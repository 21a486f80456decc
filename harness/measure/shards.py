"""The closed loop over N client processes: each runs an event loop over its share of the
lanes (lanes k, k + N, ...), all taking indices from one shared counter. Their summaries come
back as msgpack; loadgen.py merges them."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing as mp
import signal
import time
from collections.abc import Callable

import msgspec

from harness.measure.event_loop import run_loop
from harness.measure.lanes import Job, Lanes, LaneSummary, Progress, every, until


async def run_sharded(
    job: Job,
    shards: int,
    on_progress: Callable[[Progress], None] | None,
    stop_event: asyncio.Event,
    interval_s: float,
) -> tuple[list[LaneSummary], float, float]:
    """The shards' summaries, the perf_counter() all of them started at, and its wall time."""
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
        ticker = asyncio.create_task(every(interval_s, tick))
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
    return [msgspec.msgpack.decode(b, type=LaneSummary) for b in blobs], t0.value, t0_unix


def _shard_main(blob, k, shards, sender, counter, t0, go, stop, counts, interval_s) -> None:
    """Shard process k: lanes k, k + shards, ... on its own event loop; its summary goes back as
    msgpack. SIGINT is ignored: the parent decides when to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job = msgspec.msgpack.decode(blob, type=Job)
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

    async def main() -> LaneSummary:
        lanes = Lanes(job, range(k, job.concurrency, shards), t0.value, until(job, t0.value, take))
        local_stop = asyncio.Event()

        def tick() -> None:
            counts[4 * k : 4 * k + 4] = [lanes.sent, lanes.done, lanes.failed, lanes.tokens]
            if stop.is_set():
                local_stop.set()

        await lanes.run(local_stop, tick, interval_s)
        return lanes.summary(time.process_time() - cpu)

    sender.send_bytes(msgspec.msgpack.encode(run_loop(main())))

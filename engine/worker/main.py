"""The worker process: builds the worker (`build_worker`), warms it up (engine/worker/warmup.py,
unless `engine.warmup` is off), says Ready, then runs its loop over ZMQ.

Started by the API server as `python -m engine.worker.main --spec JSON --ipc-dir DIR
--server-id ID` (a fresh interpreter: nothing is pickled across the boundary). It exits on a
Shutdown message, on SIGTERM, or when its parent dies (SIGHUP from the kernel); its last span
window goes out first, then the end-of-spans message (engine/spans.py); a worker that
outlives its API server removes the IPC directory the server could not.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable

import msgspec
import torch
import zmq

from engine import env, ipc_dirs
from engine.config import ConfigError, EngineConfig, ModelSpec
from engine.env import EnvError
from engine.messages import Ready, Shutdown, decode_to_worker, encode
from engine.models import architecture, build_model, build_node, build_streams
from engine.runtime.graph import NodeSubmodule
from engine.worker.engine import Engine
from engine.worker.heartbeat import Pulse
from engine.worker.stream_stage import StreamStage
from engine.worker.timing import PhaseTimer, SpanPublisher, jsonl_sink
from engine.worker.warmup import warm_up
from engine.worker.worker import Worker

log = logging.getLogger("engine.worker")


def _die_with_parent() -> None:
    """Linux: SIGHUP this process when the API server dies, so no worker is orphaned. Not
    SIGTERM, which stops it too: SIGHUP says the server is gone, which getppid() cannot say
    yet when the server's main thread has died and its other threads have not."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGHUP)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def build_engine(model_spec: ModelSpec, config: EngineConfig) -> tuple[Engine, NodeSubmodule]:
    """The first node's engine (its model, cache, scheduler) under the logit mask its node
    declares, and the node: the worker's, and the step benchmark's (bench_gpu_step)."""
    spec, device = model_spec, config.parts.device
    model = build_model(
        spec.arch, spec.preset, spec.seed, device.dtype, device.device, path=spec.path
    )
    node = build_node(spec.arch, model, spec.eos_token_ids)
    engine = Engine(model, config, logit_mask=node.sampling_window, logit_span=node.sampling_span)
    return engine, node


def build_worker(
    model_spec: ModelSpec,
    config: EngineConfig,
    timer: PhaseTimer,
    send: Callable[[msgspec.Struct], None],
) -> Worker:
    """A worker over the scenario's model and engine settings, as this process runs it; the
    benchmarks build theirs here too, so they measure the production assembly (the start-up
    warmup is `run`'s: the benchmarks run warm-up steps of their own)."""
    spec, parts = model_spec, config.parts
    engine, node = build_engine(spec, config)
    codec, device = parts.codec, parts.device
    streams = build_streams(
        spec.arch,
        spec.preset,
        spec.seed,
        device.dtype,
        device.device,
        codec.codec_kernels,
        codec.codec_sine,
    )
    stages = [
        StreamStage(
            network,
            stream_node,
            timer,
            engine.cache.slots.size * 2,
            parts.loop.runtime_stops,
            graphs=codec.codec_graphs,
            max_windows=parts.scheduler.max_rows,
            overlap=codec.codec_overlap,
        )
        for network, stream_node in streams
    ]
    return Worker(engine, node, timer, send, loop=parts.loop, stages=stages)


def run(
    model_spec: ModelSpec, config: EngineConfig, ipc_dir: str, server: str, size: str, period: int
) -> None:
    """Serve the API server at `ipc_dir` until stopped; `period`: the phase-timing period in
    iterations (0: off), as the server read it from the environment."""
    if (cores := env.worker_cpus()) is not None:  # the harness's layout on a CPU run
        try:
            os.sched_setaffinity(0, cores)
        except OSError as exc:
            raise EnvError(
                f"{env.WORKER_CPUS.name}: cannot pin to {sorted(cores)}: {exc}"
            ) from None
    if config.parts.device.device == "cpu":
        torch.set_num_threads(max(1, config.parts.device.cpu_threads))
    ctx = zmq.Context()
    ended: list[str] = []
    try:
        inbox = ctx.socket(zmq.PULL)
        inbox.bind(f"ipc://{ipc_dir}/to_worker")
        outbox = ctx.socket(zmq.PUSH)
        outbox.setsockopt(zmq.LINGER, 1000)
        outbox.connect(f"ipc://{ipc_dir}/from_worker")
        publisher = SpanPublisher(ctx, addr, server) if (addr := env.SPAN_ADDR.raw()) else None
        sinks = [publisher.publish] if publisher else []
        if path := env.SPAN_FILE.raw():
            sinks.append(jsonl_sink(path))
        timer = PhaseTimer(period, server, sinks)

        def send(msg: msgspec.Struct) -> None:
            outbox.send(encode(msg))

        worker = build_worker(model_spec, config, timer, send)
        if config.parts.loop.warmup:  # the kernels compile here, not under the first requests
            warm_up(worker)
        else:
            log.info("warmup: off (engine.warmup: false)")
        # From Ready on, SIGTERM (a stop) and SIGHUP (the API server died) end the loop, so
        # the exit below runs: installed before Ready, since a server may be killed as soon
        # as it is.
        signal.signal(signal.SIGTERM, lambda *_: ended.append("stop"))
        signal.signal(signal.SIGHUP, lambda *_: ended.append("orphaned"))
        send(
            Ready(
                model=model_spec.arch,
                size=size,
                device=str(worker.engine.device),
                parameters=worker.engine.model.num_parameters(),
                vocab_size=worker.engine.model.config.vocab_size,
                max_model_len=config.parts.cache.max_model_len,
                eos_token_ids=list(worker.node.eos_token_ids),
                speech=architecture(model_spec.arch).speech,
            )
        )
        _serve(worker, inbox, ended)
        timer.flush()  # the last, partial window
        if publisher is not None:
            publisher.end()  # after the last window: the harness need not wait for more
        inbox.close(0)
    finally:
        ctx.destroy(linger=2000)  # closes the outbox and the span socket, sending what is queued
    if "orphaned" in ended:  # the API server died without removing it
        ipc_dirs.remove(ipc_dir)


def _serve(worker: Worker, inbox: zmq.Socket, ended: list[str]) -> None:
    """Messages and iterations until Shutdown, SIGTERM, or the parent's death (`ended`);
    heartbeats to the API server throughout (heartbeat.py)."""
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    parent = os.getppid()
    pulse = Pulse(worker.send)
    while not ended:
        if not worker.has_work() and not poller.poll(timeout=200):
            if os.getppid() != parent:
                ended.append("orphaned")
                return
            pulse.idle()
            continue
        started = time.monotonic()
        while True:
            try:
                data = inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            msg = decode_to_worker(data)
            if isinstance(msg, Shutdown):
                return
            worker.handle(msg)
        worker.iteration()
        pulse.stepped(started)


def main(argv: list[str] | None = None) -> int:
    """The worker's exit code: 0 after a stop, 2 for a configuration error, 1 for a failure."""
    parser = argparse.ArgumentParser(prog="engine.worker.main")
    parser.add_argument("--spec", required=True, help="JSON: {model, engine, size, period}")
    parser.add_argument("--ipc-dir", required=True)
    parser.add_argument("--server-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    _die_with_parent()
    spec = json.loads(args.spec)
    try:
        model, engine = ModelSpec(**spec["model"]), EngineConfig(**spec["engine"])
        run(model, engine, args.ipc_dir, args.server_id, spec["size"], spec["period"])
    except (ConfigError, EnvError) as exc:  # the user's to fix: one line, not a traceback
        log.error("cannot start the worker: %s", exc)
        return 2
    except Exception:  # the server ends every open stream with an error when it sees us exit
        log.exception("the worker failed")
        return 1
    return 0


def _exit_now(code: int) -> None:
    """Exit without the interpreter's teardown: tearing torch down takes up to a second, half
    a graceful stop's budget (or a delay before a failure reaches the open streams), and the
    sockets and span sinks are closed or unbuffered by now."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit_now(main())

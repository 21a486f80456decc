"""The worker process: builds the worker (`build_worker`), then runs its loop over ZMQ.

Started by the API server as `python -m engine.worker.main --spec JSON --ipc-dir DIR
--server-id ID` (a fresh interpreter: nothing is pickled across the boundary). It exits on a
Shutdown message, on SIGTERM, or when its parent dies; its last span window goes out first,
then the end-of-spans message (engine/spans.py).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

import msgspec
import torch
import zmq

from engine import env
from engine.config import ConfigError, EngineConfig, ModelSpec
from engine.env import EnvError
from engine.messages import Ready, Shutdown, decode_to_worker, encode
from engine.models import build_model, build_node
from engine.worker.engine import Engine
from engine.worker.timing import PhaseTimer, SpanPublisher, jsonl_sink
from engine.worker.worker import Worker

log = logging.getLogger("engine.worker")


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when the API server dies, so no worker is orphaned."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def build_worker(
    model_spec: ModelSpec,
    config: EngineConfig,
    timer: PhaseTimer,
    send: Callable[[msgspec.Struct], None],
) -> Worker:
    """A worker over the scenario's model and engine settings, as this process runs it; the
    benchmarks build theirs here too, so they measure the production assembly."""
    model = build_model(
        model_spec.arch,
        model_spec.preset,
        model_spec.seed,
        config.dtype,
        config.device,
        path=model_spec.path,
    )
    return Worker(
        Engine(model, config),
        build_node(model_spec.arch, model, model_spec.eos_token_ids),
        timer,
        send,
        runtime_stops=config.runtime_stops,
        planted_delay_us=config.planted_delay_us,
        overlap=config.overlap,
    )


def run(model_spec: ModelSpec, config: EngineConfig, ipc_dir: str, server: str, size: str) -> None:
    period = env.phase_timing_period()
    if config.device == "cpu":
        torch.set_num_threads(max(1, config.cpu_threads))
    ctx = zmq.Context()
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
        send(
            Ready(
                model=model_spec.arch,
                size=size,
                device=str(worker.engine.device),
                parameters=worker.engine.model.num_parameters(),
                vocab_size=worker.engine.model.config.vocab_size,
                max_model_len=config.max_model_len,
                eos_token_ids=list(worker.node.eos_token_ids),
            )
        )
        _serve(worker, inbox)
        timer.flush()  # the last, partial window
        if publisher is not None:
            publisher.end()  # after the last window: the harness need not wait for more
        inbox.close(0)
    finally:
        ctx.destroy(linger=2000)  # closes the outbox and the span socket, sending what is queued


def _serve(worker: Worker, inbox: zmq.Socket) -> None:
    """Messages and iterations until Shutdown, SIGTERM, or the parent's death."""
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    parent = os.getppid()
    terminated = []
    signal.signal(signal.SIGTERM, lambda *_: terminated.append(True))
    while not terminated:
        busy = worker.has_work()
        if not busy and not poller.poll(timeout=200):
            if os.getppid() != parent:
                return
            continue
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engine.worker.main")
    parser.add_argument("--spec", required=True, help="JSON: {model, engine, size}")
    parser.add_argument("--ipc-dir", required=True)
    parser.add_argument("--server-id", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(levelname)s %(message)s")
    _die_with_parent()
    spec = json.loads(args.spec)
    model, engine = ModelSpec(**spec["model"]), EngineConfig(**spec["engine"])
    try:
        run(model, engine, args.ipc_dir, args.server_id, spec["size"])
    except (ConfigError, EnvError) as exc:  # the user's to fix: one line, not a traceback
        log.error("cannot start the worker: %s", exc)
        sys.exit(2)


if __name__ == "__main__":
    main()

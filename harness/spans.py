"""Live collection of the workers' span records over ZMQ, labelled by schedule slot.

The harness binds one SUB socket; every server it starts gets BENCH_SPAN_ADDR pointing at it
and a server id, and PUBlishes a list of records every `period` worker iterations.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import msgspec
import zmq

from engine.worker.timing import SpanWindowRecord
from harness.records import SpanRecord

_decode = msgspec.json.Decoder(list[SpanWindowRecord]).decode


class SpanCollector:
    def __init__(self, host: str = "127.0.0.1"):
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, b"spans")
        self._sub.setsockopt(zmq.RCVHWM, 0)
        port = self._sub.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._lock = threading.Lock()
        self._by_server: dict[str, list[SpanWindowRecord]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="span-collector", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            _, payload = self._sub.recv_multipart()
            records = _decode(payload)
            with self._lock:
                for record in records:
                    self._by_server[record.server].append(record)

    def windows(self, server: str) -> int:
        with self._lock:
            return len({r.first_iter for r in self._by_server.get(server, [])})

    def take(self, server: str, arm: str, block: int, slot: int) -> list[SpanRecord]:
        with self._lock:
            records = self._by_server.pop(server, [])
        return [
            SpanRecord(arm=arm, block=block, slot=slot, **msgspec.structs.asdict(r))
            for r in records
        ]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sub.close(0)
        self._ctx.term()

"""Live collection of the workers' span windows over ZMQ (the span wire: engine/spans.py).

The harness binds one SUB socket; every server it starts gets its address and a server id,
and its worker PUBlishes a window of raw samples every `period` iterations (an engine older
than windows: a list of records), then, as it exits, one end-of-spans message. The reading
thread only decodes and files them, so it takes little from the load generator in the same
process; `take` turns a server's windows into records once its load is over. It waits for the
end-of-spans message, so a server's last window is never left behind.
"""

from __future__ import annotations

import threading
from collections import defaultdict

import msgspec
import zmq

from engine.spans import (
    END_TOPIC,
    SUBSCRIBE,
    WINDOW_TOPIC,
    SpanWindow,
    SpanWindowRecord,
    decode_end,
    decode_records,
    decode_window,
    window_records,
)
from harness.analysis.schema import Slot, SpanRecord


class SpanCollector:
    def __init__(self, host: str = "127.0.0.1"):
        self._ctx = zmq.Context()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.SUBSCRIBE, SUBSCRIBE)
        self._sub.setsockopt(zmq.RCVHWM, 0)
        port = self._sub.bind_to_random_port(f"tcp://{host}")
        self.address = f"tcp://{host}:{port}"
        self._lock = threading.Lock()
        self._by_server: dict[str, list[SpanWindow | SpanWindowRecord]] = defaultdict(list)
        self._ended: dict[str, threading.Event] = defaultdict(threading.Event)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="span-collector", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            topic, payload = self._sub.recv_multipart()
            with self._lock:
                if topic == END_TOPIC:
                    self._ended[decode_end(payload).server].set()
                elif topic == WINDOW_TOPIC:
                    window = decode_window(payload)
                    self._by_server[window.server].append(window)
                else:  # an engine older than windows publishes records
                    for record in decode_records(payload):
                        self._by_server[record.server].append(record)

    def take(self, slot: Slot, wait_s: float = 0.0) -> list[SpanRecord]:
        """Every window the slot's server sent, with the slot's columns, once its end-of-spans
        message is in or `wait_s` has passed (a worker that crashed, or an engine older than
        the message, sends none)."""
        with self._lock:
            ended = self._ended[slot.server]
        ended.wait(wait_s)
        with self._lock:
            self._ended.pop(slot.server, None)
            windows = self._by_server.pop(slot.server, [])
        where = {"arm": slot.arm, "letter": slot.letter, "block": slot.block, "slot": slot.slot}
        records = [
            record
            for w in windows
            for record in (window_records(w) if isinstance(w, SpanWindow) else [w])
        ]
        return [SpanRecord(**where, **msgspec.structs.asdict(r)) for r in records]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._sub.close(0)
        self._ctx.term()

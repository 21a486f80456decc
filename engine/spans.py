"""The span wire: what a worker's phase timing emits and the harness collects.

One place for the span window, the span record, the names of the spans and counts, and the
messages on the span socket. The worker sends each window's raw samples (`SpanWindow`) and
computes nothing from them: percentiles, encoding and publishing would otherwise run on its
critical path every `period` iterations. The harness turns a window into one record per name
(`window_records`), and still reads the records older engines publish. The worker emits them
(engine/worker/timing.py, engine/worker/worker.py); the harness collects and analyses them
and imports nothing under engine/worker. The variables that turn timing on are declared in
engine/env.py. Table: docs/SPANS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np


class SpanWindowRecord(msgspec.Struct):
    """One span (or count) name over one window of `period` worker iterations."""

    server: str
    name: str
    kind: str  # SPAN (values in ns) or COUNT
    first_iter: int
    last_iter: int
    iterations: int
    mean_batch: float
    n: int
    sum: float
    p50: float
    p95: float
    max: float
    start_unix: float  # wall time the window opened
    end_unix: float  # wall time it was emitted


class SpanWindow(msgspec.Struct):
    """One window of `period` worker iterations as the worker sends it: every sample of every
    span and count name, raw (little-endian int64 arrays; ns for spans)."""

    server: str
    first_iter: int
    last_iter: int
    rows: int  # rows stepped over the window's iterations
    start_unix: float  # wall time the window opened
    end_unix: float  # wall time it was sent
    spans: dict[str, bytes]
    counts: dict[str, bytes]


SAMPLE = np.dtype("<i8")


def samples(values: list[int]) -> bytes:
    """A name's samples as they cross the wire."""
    return np.asarray(values, dtype=SAMPLE).tobytes()


def window_records(window: SpanWindow) -> list[SpanWindowRecord]:
    """One record per name of a window: n, sum, p50, p95 and max of its samples."""
    iterations = window.last_iter - window.first_iter + 1
    mean_batch = window.rows / iterations if iterations > 0 else 0.0
    out = []
    for kind, table in ((SPAN, window.spans), (COUNT, window.counts)):
        for name, raw in sorted(table.items()):
            values = np.frombuffer(raw, dtype=SAMPLE).astype(np.float64)
            if not values.size:
                continue
            p50, p95 = np.percentile(values, [50, 95])
            out.append(
                SpanWindowRecord(
                    window.server,
                    name,
                    kind,
                    window.first_iter,
                    window.last_iter,
                    iterations,
                    mean_batch,
                    int(values.size),
                    float(values.sum()),
                    float(p50),
                    float(p95),
                    float(values.max()),
                    window.start_unix,
                    window.end_unix,
                )
            )
    return out


class SpanStreamEnd(msgspec.Struct):
    """The last message a worker sends on the span socket: its last window went before it."""

    server: str


SPAN, COUNT = "span", "count"  # the record kinds

# On the ZMQ socket a message is two frames: its topic and a body.
WINDOW_TOPIC = b"spans.window"  # body: a msgpack SpanWindow
RECORDS_TOPIC = b"spans"  # body: a JSON array of SpanWindowRecord (engines before windows)
END_TOPIC = b"spans.end"  # body: a JSON SpanStreamEnd
SUBSCRIBE = b"spans"  # a prefix of every topic

# Spans of one worker iteration: schedule + forward + postprocess_batch = iter_total.
ITERATION = "worker.iter_total"
STEP = "worker.step."  # the step's own phases
SCHEDULE = STEP + "schedule"
FORWARD = STEP + "forward"
POSTPROCESS_BATCH = "worker.postprocess_batch"
# Inside postprocess_batch: the waits, then the postprocess stages (POSTPROCESS + stage).
COMPLETION_WAIT = STEP + "completion_wait"
POSTPROCESS = "worker.postprocess."
PREMATERIALIZE = POSTPROCESS + "prematerialize"
# Handling one message (MESSAGE + its tag), and the stage laps inside one (+ "." + stage).
MESSAGE = "worker.msg."
ADD_REQUEST = MESSAGE + "add_request"
# Removing a finished or aborted request. No message: it runs inside the postprocess's tail
# and inside the abort message's own span, so a total over the messages leaves it out
# (NOT_MESSAGES). The name keeps its prefix so that every engine revision's spans compare.
REMOVE_REQUEST = MESSAGE + "remove_request"
NOT_MESSAGES = (REMOVE_REQUEST,)
# The worker's own bookkeeping: packing and sending the last window (outside iter_total,
# between two iterations; recorded in the window that follows).
SPAN_FLUSH = "worker.timing.flush"
# Counts, one sample per iteration.
ROWS_PER_STEP = "worker.rows_per_step"
TOKENS_PER_STEP = "worker.tokens_per_step"
RUNNING_REQUESTS = "worker.running_requests"
REQUESTS = "worker.requests"
# Whether the iteration's step ran any prefill rows (1 or 0: the mean is the share of steps
# with prompt work, which with mixing off hold every decoding row up), and how many.
PREFILL_STEPS = "worker.prefill_steps"
PREFILL_ROWS_PER_STEP = "worker.prefill_rows_per_step"
# Steps staged into a host buffer whose previous copy had not run (engine.double_buffer off
# with the overlapped loop): each is a step that read another step's inputs.
STAGING_HAZARDS = "worker.staging_hazards"


def lap(parent: str, stage: str) -> str:
    """The name of a stage lap inside a span: lap(ADD_REQUEST, "engine")."""
    return f"{parent}.{stage}"


def node_span(node: str | None, name: str) -> str:
    """The name a downstream node's step records `name` under: worker.step.forward ->
    worker.snac.step.forward. The first node's (node None) are the names above."""
    return name if node is None else name.replace("worker.", f"worker.{node}.", 1)


@dataclass(frozen=True)
class NodeSpans:
    """The step and postprocess spans of one node of the worker's graph."""

    forward: str
    postprocess_batch: str
    completion_wait: str
    check_stop: str
    runtime: str
    store_tensors: str
    send_prep: str
    tail: str
    rows_per_step: str

    @classmethod
    def of(cls, node: str | None) -> NodeSpans:
        names = (FORWARD, POSTPROCESS_BATCH, COMPLETION_WAIT) + tuple(
            POSTPROCESS + stage
            for stage in ("check_stop", "runtime", "store_tensors", "send_prep", "tail")
        )
        return cls(*(node_span(node, name) for name in (*names, ROWS_PER_STEP)))


encode = msgspec.json.Encoder().encode
encode_window = msgspec.msgpack.Encoder().encode
decode_window = msgspec.msgpack.Decoder(SpanWindow).decode
decode_records = msgspec.json.Decoder(list[SpanWindowRecord]).decode
decode_end = msgspec.json.Decoder(SpanStreamEnd).decode

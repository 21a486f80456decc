"""The span wire: what a worker's phase timing emits and the harness collects.

One place for the span record, the names of the spans and counts, and the two messages on
the span socket. The worker emits them (engine/worker/timing.py, engine/worker/worker.py);
the harness collects and analyses them and imports nothing under engine/worker. The
variables that turn timing on are declared in engine/env.py. Table: docs/SPANS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec


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


class SpanStreamEnd(msgspec.Struct):
    """The last message a worker sends on the span socket: its last window went before it."""

    server: str


SPAN, COUNT = "span", "count"  # the record kinds

# On the ZMQ socket a message is two frames: its topic and a JSON body.
RECORDS_TOPIC = b"spans"  # body: a JSON array of SpanWindowRecord
END_TOPIC = b"spans.end"  # body: a JSON SpanStreamEnd
SUBSCRIBE = b"spans"  # a prefix of both topics

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
REMOVE_REQUEST = MESSAGE + "remove_request"
# Counts, one sample per iteration.
ROWS_PER_STEP = "worker.rows_per_step"
TOKENS_PER_STEP = "worker.tokens_per_step"
RUNNING_REQUESTS = "worker.running_requests"
REQUESTS = "worker.requests"


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
    check_stop: str
    runtime: str
    store_tensors: str
    send_prep: str
    tail: str
    rows_per_step: str

    @classmethod
    def of(cls, node: str | None) -> NodeSpans:
        names = (FORWARD, POSTPROCESS_BATCH) + tuple(
            POSTPROCESS + stage
            for stage in ("check_stop", "runtime", "store_tensors", "send_prep", "tail")
        )
        return cls(*(node_span(node, name) for name in (*names, ROWS_PER_STEP)))


encode = msgspec.json.Encoder().encode
decode_records = msgspec.json.Decoder(list[SpanWindowRecord]).decode
decode_end = msgspec.json.Decoder(SpanStreamEnd).decode

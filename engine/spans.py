"""The span wire: what a worker's phase timing emits and the harness collects.

One place for the span record, the names of the spans and counts, and the two messages on
the span socket. The worker emits them (engine/worker/timing.py, engine/worker/worker.py);
the harness collects and analyses them and imports nothing under engine/worker. The
variables that turn timing on are declared in engine/env.py. Table: docs/SPANS.md.
"""

from __future__ import annotations

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
# Removing a finished or aborted request. No message: it runs inside the postprocess's tail
# and inside the abort message's own span, so a total over the messages leaves it out
# (NOT_MESSAGES). The name keeps its prefix so that every engine revision's spans compare.
REMOVE_REQUEST = MESSAGE + "remove_request"
NOT_MESSAGES = (REMOVE_REQUEST,)
# Counts, one sample per iteration.
ROWS_PER_STEP = "worker.rows_per_step"
TOKENS_PER_STEP = "worker.tokens_per_step"
RUNNING_REQUESTS = "worker.running_requests"
REQUESTS = "worker.requests"


def lap(parent: str, stage: str) -> str:
    """The name of a stage lap inside a span: lap(ADD_REQUEST, "engine")."""
    return f"{parent}.{stage}"


encode = msgspec.json.Encoder().encode
decode_records = msgspec.json.Decoder(list[SpanWindowRecord]).decode
decode_end = msgspec.json.Decoder(SpanStreamEnd).decode

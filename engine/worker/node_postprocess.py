"""One node's step through its phased postprocess: the begin/resume loop with a handler per
break, shared by the worker's first node and its stream stages (each with its own runtime).

The node's executor answers the breaks that need its code (`NodeHandlers`): its model's
`check_stop` (STOPS, and every row of a step the runtime cannot check) and each finished
row's prompt length (SEND). Log-probs (STORE) come from the step's own output.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.runtime.graph import StopCheck, StopRows
from engine.runtime.postprocess import (
    Break,
    PhasedPostprocess,
    PostprocessNeed,
    PostprocessRequest,
    PostprocessResult,
    SendInput,
    StepOutput,
)
from engine.spans import NodeSpans
from engine.worker.timing import PhaseTimer, now_ns


class NodeHandlers(Protocol):
    def check_stop(self, out: StepOutput, rows: np.ndarray) -> StopCheck: ...

    def prompt_tokens(self, rid: int) -> int: ...


def stop_rows(out: StepOutput, rows: np.ndarray, counts, max_tokens, ignore_eos) -> StopRows:
    """`rows` of a step as its model's check_stop reads them, with each row's output count
    (this step's included), budget and ignore_eos."""
    return StopRows.of(
        out.rids[rows], [out.row_walks[i] for i in rows], out.tokens[rows], counts, max_tokens,
        ignore_eos,
    )  # fmt: skip


def postprocess_step(
    postprocess: PhasedPostprocess,
    out: StepOutput,
    node: NodeHandlers,
    runtime_stops: bool,
    timer: PhaseTimer,
    spans: NodeSpans,
) -> PostprocessResult:
    """Check stops, route and send `out` (rows that sampled or decoded on this step). With
    `runtime_stops` the runtime checks a step it can (one walk, a declared policy, its stop
    buffer); any other step the model's check_stop decides before the runtime begins."""
    timing = timer.enabled
    runtime_stops = (
        runtime_stops
        and postprocess.runtime.token_column(out.walk, out.check_stop_buffers) is not None
    )
    stops = None
    if not runtime_stops:  # the model decides before the runtime begins; final
        t = now_ns() if timing else 0
        stops = node.check_stop(out, np.arange(len(out.rids)))
        if timing:
            timer.span(spans.check_stop, now_ns() - t)
    t = now_ns() if timing else 0
    brk = postprocess.begin(PostprocessRequest(out, runtime_stops, stops))
    while brk.need is not PostprocessNeed.DONE:
        if timing:
            timer.span(spans.runtime, now_ns() - t)
        answer = _answer(brk, node, timer, spans)
        t = now_ns() if timing else 0
        brk = postprocess.resume(answer)
    if timing:
        timer.span(spans.runtime, now_ns() - t)
    return brk.result


def _answer(brk: Break, node: NodeHandlers, timer: PhaseTimer, spans: NodeSpans) -> object:
    timing = timer.enabled
    t = now_ns() if timing else 0
    if brk.need is PostprocessNeed.STOPS:
        answer, name = node.check_stop(brk.output, brk.rows), spans.check_stop
    elif brk.need is PostprocessNeed.STORE:
        answer, name = brk.output.logprobs[brk.rows], spans.store_tensors
    else:
        rids = brk.plan.finished + brk.plan.failed
        answer, name = SendInput({rid: node.prompt_tokens(rid) for rid in rids}), spans.send_prep
    if timing:
        timer.span(name, now_ns() - t)
    return answer

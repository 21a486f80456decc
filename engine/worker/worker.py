"""The worker loop: messages in, schedule, step the model, phased postprocess, frames out.

One iteration: handle the messages that arrived, schedule, launch the step, wait for it,
then postprocess it as one begin/resume loop with a handler per break (node_postprocess.py).
A model whose graph has nodes after the first (Orpheus: an audio codec fed the LLM's tokens)
runs them as stream stages (stream_stage.py) in the same iteration: the first node's frames
go to the next node's input instead of the API server, and each stage then steps its ready
rows (strict, or overlapped: a step begun in one iteration finishes in the next;
stream_stage.py). A request's partition ends when its last node's loop ends; then every
node's state of it is freed. Phase timing (timing.py) wraps each stage when on; when off
each site costs one boolean check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from engine.config.loop import LoopConfig
from engine.messages import Abort, AddRequest, GetStats, StepFrames, TokenFrame, WorkerStats
from engine.runtime.graph import NodeSubmodule, StopCheck
from engine.runtime.postprocess import PhasedPostprocess, StepOutput
from engine.runtime.runtime import GraphRuntime
from engine.spans import (
    ADD_REQUEST,
    COMPLETION_WAIT,
    FORWARD,
    ITERATION,
    MESSAGE,
    POSTPROCESS_BATCH,
    PREFILL_ROWS_PER_STEP,
    PREFILL_STEPS,
    PREMATERIALIZE,
    REMOVE_REQUEST,
    REQUESTS,
    ROWS_PER_STEP,
    RUNNING_REQUESTS,
    SCHEDULE,
    STAGING_HAZARDS,
    TOKENS_PER_STEP,
    NodeSpans,
    lap,
)
from engine.worker.engine import Engine
from engine.worker.node_postprocess import postprocess_step, stop_rows
from engine.worker.pending_step import PendingStep
from engine.worker.planted import spin
from engine.worker.stream_stage import StreamStage
from engine.worker.timing import PhaseTimer, now_ns

log = logging.getLogger("engine.worker")


class Worker:
    def __init__(
        self,
        engine: Engine,
        node: NodeSubmodule,
        timer: PhaseTimer,
        send: Callable[[object], None],
        loop: LoopConfig = LoopConfig(),
        stages: list[StreamStage] | None = None,
    ):
        """`loop`: the loop's part of the configuration (engine/config/loop.py); `stages`: the
        nodes after the first, in stream order (none for most models)."""
        self.engine = engine
        self.node = node
        self.timer = timer
        self.send = send
        self.runtime_stops = loop.runtime_stops
        self.planted_delay_s = loop.planted_delay_us / 1e6
        self.runtime = GraphRuntime(node.graph, capacity=engine.cache.slots.size * 2)
        for walk in node.graph.walks:  # declared once, at startup
            self.runtime.declare_stop_policies(walk, node.get_stop_policies(walk))
        self.postprocess = PhasedPostprocess(self.runtime)
        self._launch_ns = (0, 0, 0)  # the last launch's start, scheduled, launched (timing on)
        self.overlap = loop.overlap  # launch step N+1 before postprocessing step N
        self._in_flight: PendingStep | None = None  # launched, not yet postprocessed
        # engine.prefill_stream: the prefill step on the prefill stream, not yet postprocessed
        self._prefill: PendingStep | None = None
        self._hazards_seen = 0
        self.stages = stages or []
        self.spans = NodeSpans.of(None)

    # --- messages ------------------------------------------------------------------------
    def handle(self, msg: object) -> None:
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        if isinstance(msg, AddRequest):
            self._add_request(msg)
        elif isinstance(msg, Abort):
            if self.runtime.has_request(msg.rid) or any(s.holds(msg.rid) for s in self.stages):
                self._end_partition(msg.rid)
                self.send(StepFrames([TokenFrame(msg.rid, [], finish_reason="abort")]))
        elif isinstance(msg, GetStats):
            streaming = sum(len(stage.streams) for stage in self.stages)
            self.send(WorkerStats(**self.engine.pool_stats(), streaming=streaming))
        if timing:
            self.timer.span(MESSAGE + type(msg).__struct_config__.tag, now_ns() - t0)

    def _add_request(self, msg: AddRequest) -> None:
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        prompt = list(msg.prompt)  # the engine's own copy of the prompt
        t1 = now_ns() if timing else 0
        request = self.engine.add_request(msg, prompt)
        t2 = now_ns() if timing else 0
        handle = request.handle = self.runtime.add_request(msg.rid)
        for walk, limits in self.node.stop_limits(msg.max_tokens, msg.ignore_eos).items():
            self.runtime.register_limits(handle, walk, limits)
        t3 = now_ns() if timing else 0
        for stage in self.stages:
            stage.add_request(msg)
        if timing:
            self.timer.span(lap(ADD_REQUEST, "read_prompt"), t1 - t0)
            self.timer.span(lap(ADD_REQUEST, "engine"), t2 - t1)
            self.timer.span(lap(ADD_REQUEST, "runtime"), t3 - t2)
            if self.stages:
                self.timer.span(lap(ADD_REQUEST, "streams"), now_ns() - t3)

    def _end_partition(self, rid: int) -> None:
        """Free every node's state of a request: its partition ended (or was aborted)."""
        if self.runtime.has_request(rid):
            self._remove_request(rid)
        for stage in self.stages:
            stage.remove(rid)

    def _emit(self, frames: list[TokenFrame], after: int) -> None:
        """Frames of node `after` (0: the first) go to the next node's input; what the last
        node emits goes to the API server, and a last frame there ends its partition."""
        if not self.stages:
            self.send(StepFrames(frames))
            return
        for stage in self.stages[after:]:
            frames = stage.feed(frames)
        if frames:
            self.send(StepFrames(frames))
        for frame in frames:
            if frame.finish_reason is not None:
                self._end_partition(frame.rid)

    def _remove_request(self, rid: int) -> None:
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        self.engine.remove_request(rid)
        self.runtime.remove_request(rid)
        t1 = now_ns() if timing else 0
        log.debug("request %d removed", rid)
        if timing:
            t2 = now_ns()
            self.timer.span(REMOVE_REQUEST, t2 - t0)
            self.timer.span(lap(REMOVE_REQUEST, "engine"), t1 - t0)
            self.timer.span(lap(REMOVE_REQUEST, "log"), t2 - t1)

    # --- one iteration -------------------------------------------------------------------
    def has_work(self) -> bool:
        return (
            self._in_flight is not None
            or self._prefill is not None
            or self.engine.scheduler.has_work()
            or any(stage.has_work() for stage in self.stages)
        )

    def iteration(self) -> bool:
        """One step's worth of work; False when idle. Strict: launch a step, postprocess it.
        Overlapped: launch step N+1 (its decode rows fed step N's tokens on the device), then
        postprocess step N while N+1 runs; rows N's postprocess stops are dropped from N+1.
        Then each stream stage steps the rows the frames just routed to it made ready (with
        `engine.codec_overlap` a stage begins its next step, then finishes the one it began an
        iteration ago, and leaves the new one in flight: not idle while one is). With
        `engine.prefill_stream` the iteration first postprocesses the prefill step in flight
        if it has completed (its rows decode from this iteration's launch on), and `launch`
        launches prompt rows apart, on their own stream; with nothing else to do the
        iteration waits for that prefill."""
        start = now_ns() if self.timer.enabled else 0
        prefilled = self._finish_prefill(wait=False)
        if not self.overlap:
            done = self.launch()
            if done is not None:
                self.postprocess_batch(done)
        else:
            done, self._in_flight = self._in_flight, self.launch(feed=self._in_flight)
            if done is not None:
                self.postprocess_batch(done)
            elif self._in_flight is not None:  # the first step of a busy spell: nothing to
                return True  # postprocess yet
        t3 = now_ns() if self.timer.enabled else 0
        streamed = sum(stage.step(self._emitter(i + 1)) for i, stage in enumerate(self.stages))
        if done is None and not streamed:
            if self._prefill is not None and self._in_flight is None:
                self._finish_prefill(wait=True)  # nothing else runs: wait for it
                return True
            return prefilled is not None
        if self.timer.enabled:  # the bookkeeping after the last timestamp, out of the spans
            t4 = now_ns()
            t0, t1, t2 = self._launch_ns
            rows = done.rows if done is not None else []
            if done is not None:
                self.timer.span(SCHEDULE, t1 - t0)
                self.timer.span(FORWARD, t2 - t1)
                self.timer.span(POSTPROCESS_BATCH, t3 - t2)
            self.timer.span(ITERATION, t4 - (start if prefilled is not None else t0))
            self.timer.count(ROWS_PER_STEP, len(rows))
            self.timer.count(TOKENS_PER_STEP, sum(r.num_new for r in rows))
            prefill = sum(r.walk == "prefill" for r in rows)
            if prefilled is not None:  # engine.prefill_stream: the one postprocessed here
                prefill = sum(r.walk == "prefill" for r in prefilled.rows)
            self.timer.count(PREFILL_STEPS, int(prefill > 0))
            self.timer.count(PREFILL_ROWS_PER_STEP, prefill)
            self.timer.count(RUNNING_REQUESTS, len(self.engine.scheduler.running))
            self.timer.count(REQUESTS, len(self.engine.requests))
            hazards = self.engine.inputs.fences.hazards
            self.timer.count(STAGING_HAZARDS, hazards - self._hazards_seen)
            self._hazards_seen = hazards
            self.timer.end_iteration(len(rows))
        return True

    def _emitter(self, after: int):
        return lambda frames: self._emit(frames, after)

    def launch(self, feed: PendingStep | None = None) -> PendingStep | None:
        """Schedule the next step and launch it; None when there is nothing to run. `feed`:
        the step in flight (overlapped loop). With timing on, keeps its start, scheduled and
        launched times for the iteration's spans. With `engine.prefill_stream`, the prompt rows
        scheduled apart launch after the decode step, on the prefill stream, waiting there
        only for what was queued before this decode step (`Engine.mark`): they run beside it."""
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        scheduler, prompts = self.engine.scheduler, []
        if not scheduler.has_work():
            rows = []
        elif scheduler.config.prefill_stream:
            rows, prompts = scheduler.schedule_apart(prefill_busy=self._prefill is not None)
        else:
            rows = scheduler.schedule()
        t1 = now_ns() if timing else 0
        before = self.engine.mark() if prompts else None
        pending = self.engine.launch(rows, feed) if rows else None
        if prompts:
            self._prefill = self.engine.launch_prefill(prompts, after=before)
        if timing:
            self._launch_ns = (t0, t1, now_ns())
        return pending

    def _finish_prefill(self, wait: bool) -> PendingStep | None:
        """Postprocess the prefill step in flight (engine.prefill_stream) if it completed, or
        (`wait`) once it has; that step, or None."""
        pending = self._prefill
        if pending is None or not (wait or pending.finished()):
            return None
        self._prefill = None
        self.engine.prefill_finished(pending)
        self.postprocess_batch(pending)
        return pending

    def postprocess_batch(self, pending: PendingStep) -> None:
        """Wait for a launched step, then postprocess it: frames out, finished requests out."""
        timing = self.timer.enabled
        t0 = now_ns() if timing else 0
        pending.wait()  # the step's completion
        t1 = now_ns() if timing else 0
        out = pending.to_host()  # prematerialize: the stop check's host copy
        if timing:
            self.timer.span(COMPLETION_WAIT, t1 - t0)
            self.timer.span(PREMATERIALIZE, now_ns() - t1)
        if len(out.rids) == 0:
            return
        self.engine.step_finished(out)
        result = postprocess_step(
            self.postprocess, out, self, self.runtime_stops, self.timer, self.spans
        )
        t_tail = now_ns() if timing else 0
        if self.planted_delay_s:  # bench power's known slowdown, inside the postprocess work
            spin(self.planted_delay_s)
        for rid in result.finished + result.failed:  # this node's part of them ends
            self._remove_request(rid)
        self._emit(result.frames, after=0)
        if timing:
            self.timer.span(self.spans.tail, now_ns() - t_tail)

    # --- what the postprocess asks of the node (node_postprocess.NodeHandlers) ----------
    def check_stop(self, out: StepOutput, rows: np.ndarray) -> StopCheck:
        reqs = [self.engine.requests[int(out.rids[i])] for i in rows]
        counts = [r.num_output for r in reqs]
        budgets, ignore = [r.max_tokens for r in reqs], [r.ignore_eos for r in reqs]
        return self.node.check_stop(stop_rows(out, rows, counts, budgets, ignore))

    def prompt_tokens(self, rid: int) -> int:
        return len(self.engine.requests[rid].prompt)

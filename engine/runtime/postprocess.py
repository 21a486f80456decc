"""The phased postprocess: check stops, route, send, returning to the worker only at breaks.

`begin(request)` runs until a phase needs the worker's code and returns a `Break` naming it
(`PostprocessNeed`); the worker handles it and calls `resume(...)` with what it asked for,
until `DONE`. A decode step with no stops and no log-probs runs begin -> DONE with no break.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from engine.messages import TokenFrame
from engine.runtime.graph import StopCheck
from engine.runtime.runtime import GraphRuntime


class PostprocessNeed(enum.Enum):
    STOPS = "stops"  # the model's check_stop decides `rows` (the runtime missed their limits)
    STORE = "store"  # store the step's outputs (log-probs) as tensors before routing
    SEND = "send"  # the send needs the worker: final publish of stopped rows, finished walks
    DONE = "done"


@dataclass
class StepOutput:
    """A step's outputs on the host, row-aligned: only rows that sampled a token."""

    rids: np.ndarray  # int64 [R]
    handles: np.ndarray  # int64 [R], each row's runtime handle when the step was launched
    row_walks: list[str]
    tokens: np.ndarray  # int64 [R]
    logprobs: np.ndarray | None = None  # float32 [R] when any row asked for log-probs
    check_stop_buffers: dict[str, np.ndarray] = field(default_factory=dict)
    audio: list[bytes] | None = None  # per row, the PCM a codec node decoded (frames carry it)
    walk: str | None = field(init=False)  # the step's walk; None when it mixes walks

    def __post_init__(self) -> None:
        walks = set(self.row_walks)
        self.walk = walks.pop() if len(walks) == 1 else None

    def subset(self, idx: np.ndarray) -> StepOutput:
        return StepOutput(
            rids=self.rids[idx],
            handles=self.handles[idx],
            row_walks=[self.row_walks[i] for i in idx],
            tokens=self.tokens[idx],
            logprobs=None if self.logprobs is None else self.logprobs[idx],
            check_stop_buffers={k: v[idx] for k, v in self.check_stop_buffers.items()},
            audio=None if self.audio is None else [self.audio[i] for i in idx],
        )


@dataclass
class PostprocessRequest:
    output: StepOutput
    runtime_stops: bool  # False: `stops` is the model's decision, taken as final
    stops: StopCheck | None = None


@dataclass
class SendPlan:
    finished: list[int]  # rids whose reply ends on this step
    failed: list[int]  # rids whose stop check failed
    completed_walks: list[tuple[int, str]]  # (rid, walk) for walks that ended and go on


@dataclass
class SendInput:
    prompt_tokens: dict[int, int]  # rid -> prompt length, for the final frame's usage


@dataclass
class PostprocessResult:
    frames: list[TokenFrame]
    finished: list[int]
    failed: list[int]
    stops: np.ndarray  # bool [R], for tests and counters
    runtime_checked: bool  # the runtime decided every row's stop itself


@dataclass
class Break:
    need: PostprocessNeed
    output: StepOutput | None = None  # the rows the runtime works on (removed rows dropped)
    rows: np.ndarray | None = None  # STOPS, STORE: indices into `output` to handle
    plan: SendPlan | None = None  # SEND
    result: PostprocessResult | None = None  # DONE


class PhasedPostprocess:
    def __init__(self, runtime: GraphRuntime):
        self.runtime = runtime
        self._run: Generator[Break, object, None] | None = None

    def begin(self, request: PostprocessRequest) -> Break:
        self._run = self._phases(request)
        return next(self._run)

    def resume(self, answer: object) -> Break:
        """Answer the last break: a StopCheck for STOPS (aligned with its rows), a list of
        per-row log-probs for STORE, a SendInput for SEND."""
        assert self._run is not None, "resume without begin"
        return self._run.send(answer)

    def _phases(self, request: PostprocessRequest) -> Generator[Break, object, None]:
        rt = self.runtime
        request = _drop_removed(request, rt)
        out = request.output
        handles = out.handles
        # in_loop: whether each row's walk is a loop's; one bool for a one-walk step (the
        # common decode step), so its routing below is skipped, not computed row by row
        in_loop: bool | np.ndarray
        if out.walk is not None:  # one walk: whole-array updates
            loop = rt.graph.loop_of(out.walk)
            if loop is not None:  # this step is one more iteration of the loop
                rt.iters[loop][handles] += 1
            in_loop = loop is not None
        else:
            walks = np.array(out.row_walks)
            for loop, walk in rt.graph.loops.items():
                rt.iters[loop][handles[walks == walk]] += 1
            in_loop = np.isin(walks, list(rt.graph.loops.values()))

        check = yield from self._check_stops(request, handles)
        failed = np.zeros(len(handles), dtype=bool)
        if check.failed:
            failed[check.failed] = True
        failed |= check.end_partition & in_loop  # a loop cannot end its partition mid-way
        stopped = (check.stopped | check.end_partition) & ~failed

        logprobs = None
        if out.logprobs is not None:
            logprobs = yield Break(PostprocessNeed.STORE, out, rows=np.arange(len(handles)))

        completed = []  # route: rows whose walk ended without ending the reply
        if in_loop is not True:
            for row in np.flatnonzero(~(stopped | failed | in_loop)).tolist():
                handle, walk = int(handles[row]), out.row_walks[row]
                rt.walk_of[handle] = rt.graph.next_walk(walk)
                completed.append((int(out.rids[row]), walk))

        finished: list[int] = []
        failed_rids: list[int] = []
        if stopped.any() or failed.any():
            finished, failed_rids = out.rids[stopped].tolist(), out.rids[failed].tolist()
        prompt_tokens: dict[int, int] = {}
        if finished or failed_rids or completed:
            plan = SendPlan(finished, failed_rids, completed)
            send = yield Break(PostprocessNeed.SEND, out, plan=plan)
            prompt_tokens = send.prompt_tokens
        frames = _frames(out, stopped, check.by_token, failed, logprobs, prompt_tokens)
        result = PostprocessResult(frames, finished, failed_rids, stopped, request.runtime_stops)
        yield Break(PostprocessNeed.DONE, out, result=result)

    def _check_stops(self, request: PostprocessRequest, handles: np.ndarray):
        out, rows = request.output, len(handles)
        if not request.runtime_stops:
            return request.stops
        decided = None
        tokens = self.runtime.token_column(out.walk, out.check_stop_buffers)
        if tokens is not None:
            decided = self.runtime.check_stops(out.walk, handles, tokens)
        if decided is None:  # nothing declared for this step: the model decides every row
            missed = np.ones(rows, dtype=bool)
            check = StopCheck.none(rows)
        else:
            stopped, by_token, missed = decided
            check = StopCheck(stopped, by_token, np.zeros(rows, dtype=bool))
        if missed is not None and missed.any():
            idx = np.flatnonzero(missed)
            answer: StopCheck = yield Break(PostprocessNeed.STOPS, out, rows=idx)
            check.stopped[idx] = answer.stopped
            check.by_token[idx] = answer.by_token
            check.end_partition[idx] = answer.end_partition
            check.failed.extend(int(idx[i]) for i in answer.failed)
        return check


def _drop_removed(request: PostprocessRequest, rt: GraphRuntime) -> PostprocessRequest:
    """A step launched before an earlier step's stops were known (speculated) carries rows
    that have since been removed: they are dropped, with no frame."""
    out = request.output
    keep = rt.rid_of[out.handles] == out.rids  # a removed handle is free or someone else's
    if keep.all():
        return request
    idx = np.flatnonzero(keep)
    kept = out.subset(idx)
    stops = request.stops
    if stops is not None:
        stops = StopCheck(
            stops.stopped[idx],
            stops.by_token[idx],
            stops.end_partition[idx],
            [int(np.searchsorted(idx, f)) for f in stops.failed if keep[f]],
        )
    return PostprocessRequest(kept, request.runtime_stops, stops)


def _frames(out, stopped, by_token, failed, logprobs, prompt_tokens) -> list[TokenFrame]:
    """One frame a row. Built plain (positional fields, one list comprehension) and then
    marked where a row ended: at c=64 most steps end no row, and the per-row keyword build
    with its branches was ~0.7 us a row, a third of the runtime's postprocess span."""
    rids = out.rids.tolist()
    if out.audio is None:
        tokens = out.tokens.tolist()
        frames = [TokenFrame(rid, [token]) for rid, token in zip(rids, tokens, strict=True)]
    else:
        frames = [TokenFrame(rid, [], audio=pcm) for rid, pcm in zip(rids, out.audio, strict=True)]
    if logprobs is not None:
        values = np.asarray(logprobs, dtype=np.float64).tolist()
        for frame, logprob in zip(frames, values, strict=True):
            frame.logprobs = [logprob]
    for row in np.flatnonzero(stopped | failed).tolist():  # the rows whose reply ends
        frame = frames[row]
        if failed[row]:
            frame.finish_reason, frame.error = "error", "stop check failed"
        else:
            frame.finish_reason = "stop" if by_token[row] else "length"
        frame.prompt_tokens = prompt_tokens.get(frame.rid, 0)  # the SEND break's: theirs
    return frames

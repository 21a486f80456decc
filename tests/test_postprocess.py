"""The runtime's stop check and the phased postprocess.

INVARIANTS 2 (runtime stops == policy), 4 (a recycled handle has no limits until its own are
registered) and 5 (the phased postprocess equals a straightforward reference postprocess)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.messages import TokenFrame
from engine.models.qwen35_node import DECODE_LOOP, Qwen35Node
from engine.runtime.graph import StopCheck, StopRows
from engine.runtime.postprocess import (
    PhasedPostprocess,
    PostprocessNeed,
    PostprocessRequest,
    SendInput,
    StepOutput,
)
from engine.runtime.runtime import GraphRuntime
from engine.runtime.stops import StopKind

EOS = [5]


def _runtime(node, requests, register=True):
    rt = GraphRuntime(node.graph, capacity=8)
    for walk in node.graph.walks:
        rt.declare_stop_policies(walk, node.get_stop_policies(walk))
    for rid, (max_tokens, ignore) in requests.items():
        handle = rt.add_request(rid)
        if register:
            for walk, limits in node.stop_limits(max_tokens, ignore).items():
                rt.register_limits(handle, walk, limits)
    return rt


def _output(handles, rids, walks, tokens, logprobs=None):
    tokens = np.asarray(tokens, dtype=np.int64)
    return StepOutput(
        np.asarray(rids, dtype=np.int64),
        np.asarray(handles, dtype=np.int64).reshape(-1),
        list(walks),
        tokens,
        None if logprobs is None else np.asarray(logprobs, dtype=np.float32),
        {"new_token": tokens},
    )


class Driver:
    """Plays the worker: answers each break from a model node and the request table, and
    records which breaks were taken."""

    def __init__(self, node, requests, outputs_so_far):
        self.node, self.requests, self.counts = node, requests, outputs_so_far
        self.breaks = []
        self.plans = []  # each SEND break's plan

    def run(self, pp: PhasedPostprocess, request: PostprocessRequest):
        brk = pp.begin(request)
        while brk.need is not PostprocessNeed.DONE:
            self.breaks.append(brk.need)
            out = brk.output
            if brk.need is PostprocessNeed.STOPS:
                answer = self.check(out, brk.rows)
            elif brk.need is PostprocessNeed.STORE:
                answer = out.logprobs[brk.rows]
            else:
                self.plans.append(brk.plan)
                rids = brk.plan.finished + brk.plan.failed
                answer = SendInput({rid: 100 + rid for rid in rids})
            brk = pp.resume(answer)
        return brk.result

    def check(self, out, rows) -> StopCheck:
        rids = out.rids[rows]
        return self.node.check_stop(
            StopRows.of(
                rids,
                [out.row_walks[i] for i in rows],
                out.tokens[rows],
                [self.counts[int(r)] for r in rids],
                [self.requests[int(r)][0] for r in rids],
                [self.requests[int(r)][1] for r in rids],
            )
        )


def reference_postprocess(node, requests, counts, out) -> tuple[list[TokenFrame], list[int]]:
    """What a postprocess must produce, written the obvious way: one row at a time."""
    frames, finished = [], []
    for i, rid in enumerate(out.rids.tolist()):
        max_tokens, ignore = requests[rid]
        token = int(out.tokens[i])
        by_token = not ignore and token in node.eos_token_ids
        stopped = by_token or counts[rid] >= max_tokens
        reason = ("stop" if by_token else "length") if stopped else None
        lp = None if out.logprobs is None else [float(out.logprobs[i])]
        frames.append(TokenFrame(rid, [token], lp, reason, 100 + rid if stopped else 0))
        if stopped:
            finished.append(rid)
    return frames, finished


@pytest.mark.parametrize("kind", [StopKind.EOS, StopKind.AR])
@pytest.mark.parametrize("seed", range(6))
def test_phased_equals_reference_through_a_speculated_decode_loop(kind, seed):
    """Step N+1 is launched (its rows chosen) before step N is postprocessed, so N+1 carries
    rows that N stops; the runtime must stop exactly what the reference stops, and drop the
    rows that were already removed."""
    rng = np.random.default_rng(seed)
    node = Qwen35Node(EOS, policy_kind=kind)
    requests = {rid: (int(rng.integers(1, 8)), bool(rng.integers(0, 2))) for rid in range(12)}
    rt = _runtime(node, requests)
    pp = PhasedPostprocess(rt)
    counts = dict.fromkeys(requests, 0)
    live = set(requests)
    walks = dict.fromkeys(requests, "prefill")
    launched = sorted(live)  # step 0's rows
    launched_handles = [rt.handle(r) for r in launched]  # captured at launch, as the worker does
    want_logprobs = bool(seed % 2)
    for _ in range(12):
        if not launched:
            break
        tokens = rng.choice([5, 1, 2, 3], size=len(launched), p=[0.15, 0.3, 0.3, 0.25])
        step_walks = [walks[r] for r in launched]
        lps = rng.normal(size=len(launched)) if want_logprobs else None
        next_launch = sorted(live)  # speculated: stops of this step not yet known
        next_handles = [rt.handle(r) for r in next_launch]
        # what the worker knows: rows removed earlier are gone; the rest get this token
        kept = [i for i, r in enumerate(launched) if r in live]
        for i in kept:
            counts[launched[i]] += 1
        out = _output(launched_handles, launched, step_walks, tokens, lps)
        kept_out = _output(
            [launched_handles[i] for i in kept],
            [launched[i] for i in kept],
            [step_walks[i] for i in kept],
            tokens[kept],
            None if lps is None else lps[kept],
        )
        want_frames, want_finished = reference_postprocess(node, requests, counts, kept_out)

        mixed = len(set(step_walks)) > 1 or step_walks[0] == "prefill"
        driver = Driver(node, requests, counts)
        if mixed:  # the runtime cannot check a prefill step: the model decides first
            stops = driver.check(kept_out, np.arange(len(kept)))
            full = StopCheck.none(len(launched))
            for j, i in enumerate(kept):
                full.stopped[i] = stops.stopped[j]
                full.by_token[i] = stops.by_token[j]
                full.end_partition[i] = stops.end_partition[j]
            result = driver.run(pp, PostprocessRequest(out, False, full))
        else:
            result = driver.run(pp, PostprocessRequest(out, True))
        assert result.frames == want_frames
        assert result.finished == want_finished
        for rid in set(live) - set(result.finished):
            loop_iters = rt.iters[DECODE_LOOP][rt.handle(rid)]
            assert loop_iters == counts[rid] - 1  # prefill's token is not a loop iteration
        if want_logprobs:
            assert PostprocessNeed.STORE in driver.breaks
        for rid in result.finished:
            rt.remove_request(rid)
            live.discard(rid)
        for rid in live:
            walks[rid] = "decode"
        launched, launched_handles = next_launch, next_handles
    assert rt.num_requests == len(live)


def test_decode_step_without_stops_takes_no_break():
    node = Qwen35Node(EOS)
    requests = {0: (10, False), 1: (10, True)}
    rt = _runtime(node, requests)
    for rid in requests:
        rt.walk_of[rt.handle(rid)] = "decode"
    driver = Driver(node, requests, {0: 2, 1: 2})
    result = driver.run(
        PhasedPostprocess(rt),
        PostprocessRequest(_output(rt.handles([0, 1]), [0, 1], ["decode"] * 2, [1, 5]), True),
    )
    assert driver.breaks == []
    assert [f.finish_reason for f in result.frames] == [None, None]  # 1 ignores EOS
    assert result.runtime_checked


def test_recycled_handle_has_no_limits_until_registered():
    node = Qwen35Node(EOS)
    rt = _runtime(node, {0: (2, False)})
    handle = rt.handle(0)
    rt.remove_request(0)
    new = rt.add_request(1)
    assert new == handle  # the handle was recycled
    rt.iters[DECODE_LOOP][new] = 5
    stopped, _, missed = rt.check_stops("decode", np.array([new]), np.array([1]))
    assert missed.tolist() == [True] and stopped.tolist() == [False]

    # through the postprocess: the model decides the missed row at a STOPS break
    requests = {1: (3, False)}
    driver = Driver(node, requests, {1: 3})
    result = driver.run(
        PhasedPostprocess(rt), PostprocessRequest(_output([new], [1], ["decode"], [1]), True)
    )
    assert driver.breaks == [PostprocessNeed.STOPS, PostprocessNeed.SEND]
    assert result.finished == [1] and result.frames[0].finish_reason == "length"

    rt2 = _runtime(node, {0: (2, False)})
    rt2.remove_request(0)
    h = rt2.add_request(1)
    for walk, limits in node.stop_limits(9, False).items():
        rt2.register_limits(h, walk, limits)
    _, _, missed = rt2.check_stops("decode", np.array([h]), np.array([1]))
    assert missed is None  # every row's limits are registered


@pytest.mark.parametrize("walks", [["prefill", "decode"], ["decode", "decode"]])
def test_end_partition_inside_a_loop_fails_the_row(walks):
    """A row that asks to end its partition inside a loop fails (error frame); a prefill row
    (no loop) ends its reply. Both a mixed step and a one-walk decode step (whose rows the
    postprocess handles as one: the fast path)."""

    class Rogue(Qwen35Node):
        def check_stop(self, rows):
            check = super().check_stop(rows)
            check.end_partition[:] = True
            return check

    node = Rogue(EOS)
    rt = _runtime(node, {0: (9, False), 1: (9, False)})
    for rid, walk in enumerate(walks):
        rt.walk_of[rt.handle(rid)] = walk
    out = _output(rt.handles([0, 1]), [0, 1], walks, [1, 1])
    stops = Driver(node, {0: (9, False), 1: (9, False)}, {0: 1, 1: 2}).check(out, np.arange(2))
    result = Driver(node, {}, {}).run(PhasedPostprocess(rt), PostprocessRequest(out, False, stops))
    assert result.finished == [r for r, w in enumerate(walks) if w == "prefill"]
    assert result.failed == [r for r, w in enumerate(walks) if w == "decode"]
    for rid in result.failed:
        frame = result.frames[rid]
        assert (frame.finish_reason, frame.error) == ("error", "stop check failed")
        assert frame.prompt_tokens == 100 + rid  # the final frame's usage


def test_a_prefill_row_that_goes_on_is_routed_to_its_next_walk():
    """A prefill step's rows that did not stop complete their walk: the SEND break names
    them, the runtime moves each to the walk that follows (decode), and their frames carry
    no finish; a row that stopped on the same step ends instead."""
    node = Qwen35Node(EOS)
    requests = {0: (9, False), 1: (9, False), 2: (1, False)}
    rt = _runtime(node, requests)
    out = _output(rt.handles([0, 1, 2]), [0, 1, 2], ["prefill"] * 3, [1, 5, 2])
    driver = Driver(node, requests, {0: 1, 1: 1, 2: 1})  # prefill: the model decides stops
    result = driver.run(PhasedPostprocess(rt), PostprocessRequest(out, True))
    assert [p.completed_walks for p in driver.plans] == [[(0, "prefill")]]
    assert driver.plans[0].finished == [1, 2]  # rid 1 on EOS, rid 2 at its one-token budget
    assert [rt.walk_of[rt.handle(r)] for r in (0, 1, 2)] == ["decode", "prefill", "prefill"]
    reasons = [(f.finish_reason, f.prompt_tokens) for f in result.frames]
    assert reasons == [(None, 0), ("stop", 101), ("length", 102)]

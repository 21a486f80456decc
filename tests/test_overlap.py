"""The overlapped worker loop (step N+1 launched before step N is postprocessed, its decode
rows fed N's tokens on the device) emits exactly the strict loop's frames: stops at different
steps (EOS and max_tokens), ignore_eos, chunked prompts, an abort mid-run; nothing after a
request's last frame (INVARIANTS 5). On a CPU the step runs at launch, so this holds the
loop's logic; the GPU run of the same loop is tests/test_gpu.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.config import ConfigError
from engine.messages import Abort, AddRequest, StepFrames
from engine.worker.engine import Engine
from engine.worker.main import build_worker
from engine.worker.pending_step import PendingStep
from engine.worker.scheduler import Scheduler
from engine.worker.timing import PhaseTimer
from harness.scenario import load_scenario


def _run(overlap: bool, requests: list[AddRequest], eos: list[int], abort_after: int, **engine):
    """Frames per rid; request 0 is aborted once `abort_after` frames carried its tokens.
    `engine`: more engine settings."""
    scenario = load_scenario("qwen35", "tiny")
    config = replace(scenario.engine, overlap=overlap, max_tokens_per_step=48, max_rows=8, **engine)
    spec = replace(scenario.model, eos_token_ids=eos)
    frames: list[StepFrames] = []
    worker = build_worker(spec, config, PhaseTimer(0, "o", []), frames.append)
    for msg in requests:
        worker.handle(msg)
    aborted = False
    while worker.iteration():
        seen = sum(1 for f in frames for t in f.frames if t.rid == 0 and t.tokens)
        if not aborted and seen >= abort_after:
            worker.handle(Abort(0))
            aborted = True
    out: dict[int, list] = {}
    for step in frames:
        for frame in step.frames:
            out.setdefault(frame.rid, []).append(frame)
    return out, worker


def _requests(ignore_eos: bool) -> list[AddRequest]:
    shapes = [(5, 30), (3, 1), (60, 7), (9, 12), (1, 2), (33, 17), (12, 25), (2, 9), (20, 4)]
    return [
        AddRequest(rid, [(7 * rid + j) % 4000 + 1 for j in range(n)], m,
                   ignore_eos=ignore_eos or rid % 2 == 0, temperature=0)
        for rid, (n, m) in enumerate(shapes)
    ]  # fmt: skip


def _tokens(frames) -> list[int]:
    return [t for f in frames for t in f.tokens]


def test_overlapped_loop_emits_the_strict_loops_frames():
    # EOS ids the model really produces, at different steps of different requests.
    probe, _ = _run(False, _requests(ignore_eos=True), [4095], abort_after=10**9)
    eos = sorted({_tokens(probe[3])[3], _tokens(probe[5])[8], _tokens(probe[7])[1]})
    strict, _ = _run(False, _requests(ignore_eos=False), eos, abort_after=4)
    overlapped, worker = _run(True, _requests(ignore_eos=False), eos, abort_after=4)
    reasons = {frames[-1].finish_reason for frames in strict.values()}
    assert {"stop", "length", "abort"} <= reasons  # the workload hit every way to end
    _assert_the_strict_loops_frames(strict, overlapped, worker)


def _assert_the_strict_loops_frames(strict: dict, got: dict, worker) -> None:
    """`got` (frames per rid of another loop) is `strict`'s: every request's last frame ends
    it and none follows (no frame after a stop), the same tokens and finish reason, request 0
    (aborted: where the abort lands depends on the loop) a prefix of its strict tokens; and
    the worker gave everything back (its pools full again, no work left)."""
    assert set(got) == set(strict)
    for rid, frames in strict.items():
        mine = got[rid]
        assert mine[-1].finish_reason is not None
        assert all(f.finish_reason is None for f in mine[:-1]), rid
        if rid == 0:
            assert mine[-1].finish_reason == "abort"
            assert _tokens(mine) == _tokens(frames)[: len(_tokens(mine))]
            continue
        assert _tokens(mine) == _tokens(frames), rid
        assert mine[-1].finish_reason == frames[-1].finish_reason, rid
    assert worker.engine.cache.pages.num_free == worker.engine.cache.pages.size
    assert worker.engine.cache.slots.num_free == worker.engine.cache.slots.size
    assert not worker.has_work()


def _staggered(overlap: bool, hold: int, **engine):
    """Requests arriving every other iteration as others decode: frames per rid and the
    rows of each step the worker ran. `engine`: more engine settings."""
    scenario = load_scenario("qwen35", "tiny")
    config = replace(
        scenario.engine, overlap=overlap, max_tokens_per_step=48, max_rows=8,
        prefill_hold_steps=hold, **engine,
    )  # fmt: skip
    frames: list[StepFrames] = []
    worker = build_worker(scenario.model, config, PhaseTimer(0, "o", []), frames.append)
    arrivals = _requests(ignore_eos=True)
    steps = []
    scheduler = worker.engine.scheduler
    schedule = scheduler.schedule

    def recording_schedule():
        rows = schedule()
        steps.append([r.walk for r in rows])
        return rows

    scheduler.schedule = recording_schedule
    i = 0
    while arrivals or worker.has_work():
        if arrivals and i % 2 == 0:
            worker.handle(arrivals.pop(0))
        worker.iteration()
        i += 1
    out: dict[int, list[int]] = {}
    for step in frames:
        for frame in step.frames:
            out.setdefault(frame.rid, []).extend(frame.tokens)
    return out, steps


def test_the_prefill_hold_changes_when_prompts_run_not_what_they_emit():
    for overlap in (False, True):
        now, steps_now = _staggered(overlap, hold=0)
        held, steps_held = _staggered(overlap, hold=4)
        assert held == now  # every request's tokens, each one's own
        prefills = [s for s in steps_held if "prefill" in s]
        # fewer prefill steps, some of several prompts at once
        assert len(prefills) < len([s for s in steps_now if "prefill" in s])
        assert max(s.count("prefill") for s in prefills) > 1


def test_split_mixed_steps_emit_the_joint_mixed_steps_frames(monkeypatch):
    """engine.split_mixed (a mixed step's decode rows, then its prompt rows, in two launches)
    emits exactly what mixing's joint steps emit, strict and overlapped: stops at different
    steps, max_tokens, ignore_eos, a chunked prompt, an abort mid-run; and it did split."""
    splits: list[int] = []  # each two-launch step's decode rows
    forward_split = Engine._forward_split

    def counted(self, rows, decode, *args):
        splits.append(decode)
        return forward_split(self, rows, decode, *args)

    monkeypatch.setattr(Engine, "_forward_split", counted)
    probe, _ = _run(False, _requests(ignore_eos=True), [4095], abort_after=10**9)
    eos = sorted({_tokens(probe[3])[3], _tokens(probe[5])[8], _tokens(probe[7])[1]})
    for overlap in (False, True):
        joint, _ = _run(overlap, _requests(ignore_eos=False), eos, 4, mixing=True)
        assert not splits  # mixing alone never splits
        split, worker = _run(overlap, _requests(ignore_eos=False), eos, 4, split_mixed=True)
        assert split == joint, overlap
        assert not worker.has_work()
        assert worker.engine.cache.slots.num_free == worker.engine.cache.slots.size
        now, _ = _staggered(overlap, hold=0, mixing=True)
        staggered, steps = _staggered(overlap, hold=0, split_mixed=True)
        assert staggered == now, overlap
        mixed = [s for s in steps if "decode" in s and "prefill" in s]
        assert mixed and len(splits) >= len(mixed), overlap  # every mixed step split
        splits.clear()


def test_take_rows_is_indexing_by_the_rows():
    """`take_rows` (the engine's row choices without a blocking copy) is values[rows]: a run
    of rows, a scattered choice, none."""
    import torch

    from engine.layers.sampler import take_rows

    values = torch.arange(24).view(12, 2)
    for rows in ([3, 4, 5], [0], [1, 7, 2], [], [11, 10]):
        assert torch.equal(take_rows(values, rows), values[rows]), rows


def _delayed_prefills(monkeypatch, polls: int) -> list[tuple[int, int]]:
    """engine.prefill_stream on a CPU, with each prefill step's completion delayed: it reads
    as running for its first `polls` polls (as on a GPU, where the decode steps beside it go
    on). Returns a log of (decode rows, prompt rows) per schedule_apart while one ran, and
    one entry (-1, rows) each time rows began decoding beside rows already decoding."""
    seen: dict[int, int] = {}
    last: set[int] = set()
    finished = PendingStep.finished

    def slow(self) -> bool:
        if any(r.walk == "prefill" for r in self.rows):
            seen[id(self)] = seen.get(id(self), 0) + 1
            if seen[id(self)] <= polls:
                return False
        return finished(self)

    monkeypatch.setattr(PendingStep, "finished", slow)
    beside: list[tuple[int, int]] = []
    apart = Scheduler.schedule_apart

    def recorded(self, prefill_busy):
        decode, prompts = apart(self, prefill_busy)
        if prefill_busy:
            assert not prompts  # one prefill step in flight at a time
            assert not any(r.request.prefilling for r in decode)  # no row before its token
            beside.append((len(decode), sum(r.prefilling for r in self.running)))
        rids = {r.request.rid for r in decode}
        if rids - last and rids & last:
            beside.append((-1, len(rids - last)))
        last.clear()
        last.update(rids)
        return decode, prompts

    monkeypatch.setattr(Scheduler, "schedule_apart", recorded)
    return beside


def test_prefill_stream_emits_the_strict_loops_frames(monkeypatch):
    """engine.prefill_stream (prompt rows launched apart, on a stream of their own, joining
    the decode steps once postprocessed) emits exactly the strict loop's frames, strict and
    overlapped: stops at different steps, max_tokens, ignore_eos, chunked prompts, an abort
    mid-run, staggered arrivals with and without the hold; and decode steps did run while a
    prefill step was in flight (INVARIANTS 65)."""
    probe, _ = _run(False, _requests(ignore_eos=True), [4095], abort_after=10**9)
    eos = sorted({_tokens(probe[3])[3], _tokens(probe[5])[8], _tokens(probe[7])[1]})
    strict, _ = _run(False, _requests(ignore_eos=False), eos, abort_after=4)
    plain = {hold: _staggered(False, hold=hold)[0] for hold in (0, 4)}
    beside = _delayed_prefills(monkeypatch, polls=3)
    for overlap in (False, True):
        got, worker = _run(overlap, _requests(ignore_eos=False), eos, 4, prefill_stream=True)
        _assert_the_strict_loops_frames(strict, got, worker)
        for hold in (0, 4):
            staggered, _ = _staggered(overlap, hold=hold, prefill_stream=True)
            assert staggered == plain[hold], (overlap, hold)
    # rows decoded while a prefill step of other rows ran, and prefilled rows joined them
    assert any(decode > 0 and prefilling for decode, prefilling in beside)
    assert any(decode == -1 for decode, _ in beside)


def test_prefill_stream_refuses_mixing():
    scenario = load_scenario("qwen35", "tiny")
    for key in ("mixing", "split_mixed"):
        with pytest.raises(ConfigError, match="prefill_stream"):
            replace(scenario.engine, prefill_stream=True, **{key: True})

"""Continuous batching: admission (INVARIANTS 9), chunked prefill, mixing, the prefill hold
(INVARIANTS 53), pool accounting."""

from __future__ import annotations

from dataclasses import replace

import torch

from engine.cache import CacheShapes, KVCache
from engine.config import EngineConfig
from engine.layers.sampler import SamplingParams
from engine.worker.request import Request
from engine.worker.scheduler import Scheduler

SHAPES = CacheShapes(1, 1, 1, 4, 8, 4, 1, 4, 4)


def make(config: EngineConfig, pages: int = 64, slots: int = 8):
    cache = KVCache(SHAPES, pages, config.page_size, slots, torch.float32, "cpu")
    return Scheduler(config.parts.scheduler, cache), cache


def req(rid: int, prompt: int, max_tokens: int) -> Request:
    return Request(rid, list(range(1, prompt + 1)), max_tokens, True, SamplingParams(), rid)


def run_step(rows) -> None:
    """What the engine does after a step: advance the cache, append a token where sampled."""
    for row in rows:
        sampled = row.samples
        row.request.num_cached += row.num_new
        if sampled:
            row.request.tokens.append(7)


def test_oldest_waiting_request_is_never_overtaken():
    config = EngineConfig(page_size=4, max_rows=8, max_tokens_per_step=64)
    sched, cache = make(config, pages=10)
    big, small = req(0, 20, 20), req(1, 2, 2)  # big needs 10 pages, small 1
    blocker = req(2, 4, 4)  # 2 pages
    sched.add(blocker)
    sched.schedule()
    sched.add(big)
    sched.add(small)
    rows = sched.schedule()
    assert [r.request.rid for r in rows] == [2]  # big waits for pages; small must wait too
    assert list(sched.waiting) == [big, small]
    sched.remove(2)
    rows = sched.schedule()
    assert [r.request.rid for r in rows] == [0]  # big first; small does not fit beside it
    assert cache.pages.num_free == 0


def test_long_prompt_is_chunked_and_samples_only_at_its_end():
    config = EngineConfig(page_size=4, max_rows=4, max_tokens_per_step=8)
    sched, _ = make(config)
    r = req(0, 20, 3)
    sched.add(r)
    chunks = []
    while not r.prefill_done:
        rows = sched.schedule()
        chunks.append((rows[0].num_new, rows[0].samples))
        run_step(rows)
    assert chunks == [(8, False), (8, False), (4, True)]
    rows = sched.schedule()
    assert [(x.walk, x.num_new) for x in rows] == [("decode", 1)]


def test_mixing_off_separates_prefill_and_decode_and_on_or_split_mixes_them():
    for mixing, split, expect in (
        (False, False, [["prefill"], ["decode", "decode"]]),
        (True, False, [["decode", "prefill"], ["decode", "decode"]]),
        (False, True, [["decode", "prefill"], ["decode", "decode"]]),  # split_mixed mixes
    ):
        config = EngineConfig(
            page_size=4, max_rows=4, max_tokens_per_step=16, mixing=mixing, split_mixed=split
        )
        sched, _ = make(config)
        sched.add(req(0, 3, 5))
        run_step(sched.schedule())  # request 0 is now decoding
        sched.add(req(1, 3, 5))
        walks = []
        for _ in range(len(expect)):
            rows = sched.schedule()
            walks.append([r.walk for r in rows])
            run_step(rows)
        assert walks == expect


def test_rows_and_slots_cap_admission_and_the_pool_returns_full():
    config = EngineConfig(page_size=4, max_rows=3, max_tokens_per_step=64)
    sched, cache = make(config, pages=64, slots=2)
    for rid in range(5):
        sched.add(req(rid, 4, 4))
    sched.schedule()
    assert len(sched.running) == 2 and len(sched.waiting) == 3  # slots bind before rows
    for rid in range(5):
        sched.remove(rid)
    assert cache.pages.num_free == 64 and cache.slots.num_free == 2
    assert not sched.has_work()


def test_decode_rows_respect_max_rows():
    config = replace(EngineConfig(), page_size=4, max_rows=2, max_tokens_per_step=16)
    sched, _ = make(config)
    for rid in range(3):
        sched.add(req(rid, 2, 4))
    rows = sched.schedule()
    assert len(rows) == 2 and len(sched.waiting) == 1


def _walks(sched, steps: int, arrivals: dict[int, list[Request]] | None = None):
    """Each step's rows as (walk, rid) pairs; `arrivals[i]` join before step i."""
    out = []
    for i in range(steps):
        for r in (arrivals or {}).get(i, []):
            sched.add(r)
        rows = sched.schedule()
        out.append([(r.walk, r.request.rid) for r in rows])
        run_step(rows)
    return out


def test_prefill_hold_batches_arrivals_and_holds_no_longer_than_its_steps():
    for mixing in (False, True):
        config = EngineConfig(
            page_size=4, max_rows=8, max_tokens_per_step=64, mixing=mixing, prefill_hold_steps=3
        )
        sched, _ = make(config)
        # Request 0 arrives with nothing decoding: prefilled at once, never held.
        walks = _walks(sched, 1, {0: [req(0, 4, 40)]})
        assert walks == [[("prefill", 0)]]
        # 1 arrives, 2 one step later: both wait while 0 decodes, 3 steps after 1 came.
        walks = _walks(sched, 5, {0: [req(1, 4, 40)], 1: [req(2, 4, 40)]})
        d0, d012 = [("decode", 0)], [("decode", r) for r in range(3)]
        both = [("prefill", 1), ("prefill", 2)]
        assert walks == [d0, d0, d0, (d0 + both) if mixing else both, d012]
        # The count restarts once none waits: 3 arriving now waits its own 3 steps.
        walks = _walks(sched, 4, {0: [req(3, 4, 40)]})
        d = [("decode", r) for r in range(3)]
        assert walks == [d, d, d, (d + [("prefill", 3)]) if mixing else [("prefill", 3)]]


def test_prefill_hold_releases_at_once_for_a_full_step_or_a_begun_prompt():
    config = EngineConfig(page_size=4, max_rows=8, max_tokens_per_step=8, prefill_hold_steps=5)
    sched, _ = make(config)
    _walks(sched, 1, {0: [req(0, 2, 40)]})  # 0 decodes from here on
    # A step's worth of prompt tokens waiting: nothing to gain by holding.
    assert _walks(sched, 1, {0: [req(1, 8, 4)]}) == [[("prefill", 1)]]
    # A prompt begun before any row decoded goes on, though rows decode now.
    sched, _ = make(config)
    walks = _walks(sched, 3, {0: [req(0, 4, 40), req(1, 10, 40)]})
    assert walks == [[("prefill", 0), ("prefill", 1)], [("prefill", 1)],
                     [("decode", 0), ("decode", 1)]]  # fmt: skip


def test_prefill_hold_zero_prefills_each_arrival_at_once():
    config = EngineConfig(page_size=4, max_rows=8, max_tokens_per_step=64)
    assert config.prefill_hold_steps == 0  # the default: no prefill waits
    sched, _ = make(config)
    walks = _walks(sched, 3, {0: [req(0, 4, 40)], 1: [req(1, 4, 40)]})
    assert walks == [[("prefill", 0)], [("prefill", 1)], [("decode", 0), ("decode", 1)]]

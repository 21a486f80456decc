"""What an engine holds at once, said before a run (harness/measure/preflight.check_capacity):
the harness's count is the engine scheduler's own admission, and a -c the pool cannot hold is
named with the setting that would (INVARIANTS 83)."""

from __future__ import annotations

import torch

from engine.cache import CacheShapes, KVCache
from engine.config import EngineConfig
from engine.layers.sampler import SamplingParams
from engine.worker.request import Request
from engine.worker.scheduler import Scheduler
from harness.measure.preflight import check_capacity, pool
from harness.measure.request_sequence import RequestSequence
from harness.scenario import load_scenario

SHAPES = CacheShapes(1, 1, 1, 4, 8, 4, 1, 4, 4)


def test_the_count_is_what_the_engines_scheduler_admits():
    config = EngineConfig(page_size=16, max_rows=256, kv_pages=2048, state_slots=512)
    requests = RequestSequence((128, 512), (256, 512), 1000, 400, 7)
    cache = KVCache(SHAPES, config.kv_pages, config.page_size, config.state_slots,
                    torch.float32, "cpu")  # fmt: skip
    scheduler = Scheduler(config.parts.scheduler, cache)
    for i in range(256):  # a closed loop's first 256 requests, all arrived
        r = requests[i]
        scheduler.add(Request(i, r.prompt, r.max_tokens, True, SamplingParams(), i))
    scheduler.schedule()
    admitted = len(scheduler.running)
    note = check_capacity(requests, 256, pool_of(config), "the engine")
    assert note is not None and "KV pool of 2048 pages" in note
    holds = int(note.split("holds ~")[1].split()[0])
    assert abs(holds - admitted) <= 0.1 * admitted, (holds, admitted)
    assert check_capacity(requests, admitted - 5, pool_of(config), "the engine") is None


def test_the_fix_it_names_holds_the_load():
    requests = RequestSequence((128, 512), (256, 512), 1000, 1024, 1234)
    small = EngineConfig(kv_pages=8192)
    note = check_capacity(requests, 256, pool_of(small), "the engine of arm a")
    need = int(note.split("engine.kv_pages ")[1].split()[0])
    assert check_capacity(requests, 256, pool_of(EngineConfig(kv_pages=need)), "x") is None
    rows = check_capacity(requests, 300, pool_of(EngineConfig(kv_pages=65536)), "x")
    assert "engine.max_rows 256" in rows and "engine.max_rows 300 or more" in rows


def test_the_scenarios_hold_their_documented_loads():
    """qwen35 at 0.8b holds -c 256 (its max_rows), the tiny CPU size the README's -c 64."""
    big = load_scenario("qwen35", "0.8b")
    load = big.load
    requests = RequestSequence(load.prompt_tokens, load.output_tokens, 1000, 1024, load.seed)
    assert check_capacity(requests, 256, pool(big), "x") is None
    tiny = load_scenario("qwen35", "tiny")
    load = tiny.load
    requests = RequestSequence(load.prompt_tokens, load.output_tokens, 1000, 256, load.seed)
    assert check_capacity(requests, 64, pool(tiny), "x") is None


def pool_of(config: EngineConfig) -> dict[str, int]:
    names = ("max_rows", "state_slots", "kv_pages", "page_size")
    return {name: getattr(config, name) for name in names}

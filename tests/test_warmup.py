"""The start-up warmup (engine/worker/warmup.py): INVARIANTS 54, it leaves the engine as it
found it (pools, scheduler, request table, arrival counter; nothing sent, no span recorded,
torch's process-wide generator untouched) and changes no request's output; `engine.warmup`
reaches the worker, which logs what it ran before Ready."""

from __future__ import annotations

import json
import urllib.request
from dataclasses import replace

import pytest
import torch

from engine.config import ConfigError, parse_overrides
from engine.messages import AddRequest, StepFrames
from engine.serve import _worker_command
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer
from engine.worker.warmup import warm_up
from harness.measure.server import ServerProcess
from harness.scenario import load_scenario


@pytest.fixture(autouse=True)
def _one_thread():
    """One intra-op thread, as a CPU worker runs (engine.cpu_threads): two on a busy 2-core
    machine fight, and a tiny step takes 20 times as long."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _worker(arch: str = "qwen35", **engine):
    scenario = load_scenario(arch, "tiny")
    config = replace(scenario.engine, **{"max_rows": 8, **engine})
    sent, windows = [], []
    timer = PhaseTimer(1, "w", [windows.append])  # timing on: any span would show
    return build_worker(scenario.model, config, timer, sent.append), sent, windows


@pytest.mark.parametrize("arch", ["qwen35", "orpheus"])
def test_the_warmup_leaves_the_engine_as_a_fresh_one_and_sends_nothing(arch):
    """INVARIANTS 54: after the warmup the engine's pools, scheduler and request table equal
    a fresh engine's; nothing went out on the outbox and no span was recorded."""
    fresh, _, _ = _worker(arch, mixing=True)
    worker, sent, windows = _worker(arch, mixing=True)
    rng = torch.get_rng_state()
    summary = warm_up(worker)
    assert summary.startswith(
        "6 steps (prefill 1x128, 1x384, 3x64-256, decode x2, mixed x1, sampled)"
    )
    engine = worker.engine
    assert engine.pool_stats() == fresh.engine.pool_stats()
    assert engine.cache.pages.num_free == engine.cache.pages.size
    assert engine.cache.slots.num_free == engine.cache.slots.size
    assert not engine.scheduler.running and not engine.scheduler.waiting
    assert engine.requests == {} and engine.arrivals == 0
    assert not worker.has_work() and not worker.runtime.has_request(-1)
    assert sent == [] and windows == []
    assert worker.timer.iteration == 0 and not worker.timer.window().spans
    assert torch.equal(torch.get_rng_state(), rng)  # its sampled rows are seeded


def test_the_warmup_fits_small_steps_and_contexts():
    """Prompts clipped to a step of 48 tokens and a context of 64, the pool holding two
    requests at a time: the three-row prompts run a step each and the third waits for pages;
    the engine is left as it was all the same (INVARIANTS 54)."""
    small = dict(max_tokens_per_step=48, max_model_len=64, kv_pages=8)
    fresh, _, _ = _worker(**small)
    worker, sent, _ = _worker(**small)
    summary = warm_up(worker)
    assert summary.startswith("11 steps (prefill 1x48, 1x48, 1x48, 1x48, 1x48, decode x6, sampled)")
    assert worker.engine.pool_stats() == fresh.engine.pool_stats() and sent == []


def _requests() -> list[AddRequest]:
    """Greedy, seeded sampled (top-k, top-p, log-probs) and unseeded sampled requests."""
    shapes = [(5, 30), (3, 1), (60, 7), (9, 12), (1, 2), (33, 17), (12, 25), (2, 9), (20, 4)]
    sampling = [
        dict(temperature=0),
        dict(temperature=0.9, top_k=40, top_p=0.8, seed=11, logprobs=True),
        dict(temperature=1.2, seed=12),
        dict(temperature=1.0),  # torch's process-wide generator
    ]
    return [
        AddRequest(rid, [(7 * rid + j) % 4000 + 1 for j in range(n)], m, ignore_eos=True,
                   **sampling[rid % len(sampling)])
        for rid, (n, m) in enumerate(shapes)
    ]  # fmt: skip


def _emitted(warmup: bool, overlap: bool) -> dict[int, tuple[list, list]]:
    """Tokens and log-probs per rid of the workload on a fresh worker, warmed up or not."""
    torch.manual_seed(0)  # the unseeded requests' draws, alike on both workers
    worker, _, _ = _worker(mixing=True, overlap=overlap)
    frames: list[StepFrames] = []
    if warmup:
        warm_up(worker)
    worker.send = frames.append
    for msg in _requests():
        worker.handle(msg)
    while worker.iteration():
        pass
    out: dict[int, tuple[list, list]] = {}
    for step in frames:
        for frame in step.frames:
            tokens, logprobs = out.setdefault(frame.rid, ([], []))
            tokens += frame.tokens
            logprobs += frame.logprobs or []
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_the_warmup_changes_no_requests_output(overlap):
    """INVARIANTS 54: every request's tokens (and log-probs) are the same with and without
    the warmup: greedy, seeded and unseeded sampling."""
    cold, warm = _emitted(False, overlap), _emitted(True, overlap)
    assert set(warm) == set(range(9))
    assert warm == cold
    assert any(logprobs for _, logprobs in warm.values())


def test_the_setting_parses_and_reaches_the_worker():
    assert load_scenario("qwen35", "tiny").engine.warmup is True
    off = load_scenario("qwen35", "tiny", parse_overrides("engine.warmup=false"))
    assert off.engine.warmup is False
    with pytest.raises(ConfigError, match="engine.warmup must be true or false"):
        load_scenario("qwen35", "tiny", parse_overrides("engine.warmup=3"))
    argv = _worker_command(off, "/tmp/x", "s")
    spec = json.loads(argv[argv.index("--spec") + 1])
    assert spec["engine"]["warmup"] is False


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_server_warms_up_before_ready_unless_told_not_to(tmp_path):
    """The worker logs what it warmed before the server listens (INVARIANTS 54), or that the
    warmup is off; a warmed server then answers as usual."""
    for setting, expect in (("true", "warmup: 6 steps (prefill 1x128, 1x384, 3x64-256, "),
                            ("false", "warmup: off (engine.warmup: false)")):  # fmt: skip
        log = tmp_path / f"{setting}.log"
        overrides = f"engine.max_rows=8,engine.kv_pages=512,engine.warmup={setting}"
        with ServerProcess("qwen35", size="tiny", overrides=overrides, log_path=log) as server:
            body = json.dumps(dict(prompt=[1, 2, 3], max_tokens=4, ignore_eos=True)).encode()
            request = urllib.request.Request(f"{server.url}/v1/completions", data=body)
            request.add_header("Content-Type", "application/json")
            with urllib.request.urlopen(request, timeout=30) as resp:
                assert len(json.loads(resp.read())["choices"][0]["token_ids"]) == 4
        lines = log.read_text().splitlines()
        warmed = next(i for i, line in enumerate(lines) if expect in line)
        assert warmed < next(i for i, line in enumerate(lines) if "listening on" in line)


def test_the_warmup_leaves_no_prefill_hold_behind():
    """INVARIANTS 54 with the prefill hold (INVARIANTS 53) on: the warmup's last prompt waits
    beside its decoding rows, yet the first real prompts find the hold's count where a fresh
    engine's is."""
    fresh, _, _ = _worker(mixing=True, prefill_hold_steps=12)
    worker, _, _ = _worker(mixing=True, prefill_hold_steps=12)
    warm_up(worker)
    assert vars(worker.engine.scheduler)["_held"] == vars(fresh.engine.scheduler)["_held"] == 0

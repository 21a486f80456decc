"""One short engine session per commit, its figures tracked by asv; one scheduler step timed.

`setup_cache` runs the session the way `bench run` runs its schedule
(harness.measure.runner.run_schedule: a fresh server with phase timing, a closed loop, the
span collector, then the run summarised once), keeps it as a run directory
(BENCH_ASV_SESSIONS/<commit>/, default results/asv/sessions/) and takes the figures from its
summary, so they are the numbers `bench run` reports for that session.

asv counts a larger value as worse and cannot be told otherwise (asv issue #1617), so every
figure is tracked as a cost: throughput as ms per 1,000 output tokens.
"""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks import COMMIT, REPO, TREE

SCENARIO, SIZE = "qwen35", "tiny"
CONCURRENCY, REQUESTS, WARMUP, PERIOD = 4, 16, 2, 100


def sessions_dir() -> Path:
    return Path(os.environ.get("BENCH_ASV_SESSIONS") or REPO / "results" / "asv" / "sessions")


def run_session(path: Path):
    """The session: one server of this tree's engine, the closed loop at CONCURRENCY; its
    summary (a `Comparison`), or RuntimeError when it did not finish."""
    from engine.config import load_scenario
    from engine.models import vocab_size
    from harness.measure.arms import Arm
    from harness.measure.request_sequence import build_requests
    from harness.measure.runner import RunPlan, run_schedule
    from harness.results import RunDir

    scenario = load_scenario(SCENARIO, SIZE)
    kind, spec = ("ref", COMMIT) if COMMIT else ("worktree", "worktree")
    arm = Arm("A", "session", kind, spec, COMMIT, tree=str(TREE))
    requests = build_requests(scenario.load, vocab_size(scenario.model), WARMUP + REQUESTS)
    plan = RunPlan(scenario, {"A": arm}, ["A"], 1, CONCURRENCY, requests, WARMUP, PERIOD)
    rundir = RunDir(path)
    manifest = plan.manifest(f"asv-{path.name}", "asv bench_session", REQUESTS, [arm.manifest()])
    rundir.write_manifest(manifest)
    complete, summary = run_schedule(plan, rundir, lambda status: None)
    if not complete:
        raise RuntimeError(f"the session did not finish; see {path}/logs")
    return summary


def figures(summary: dict) -> dict[str, float | None]:
    """The tracked costs from a run's summary (summary.json of `bench run`), arm A's values."""
    from harness.analysis.phases import ALL_MESSAGES, POSTPROCESS_WORK

    by_name = {f["figure"]: f["a"] for f in summary["figures"]}
    phases = {p["name"]: p["a_ms"] for p in summary["phases"]}
    messages = {m["name"]: m["a_ms"] for m in summary["messages"]}
    tok_s = by_name.get("output_tok_per_s")
    return {
        "ms_per_1k_tokens": 1e6 / tok_s if tok_s else None,
        "postprocess_ms_per_iter": phases.get(POSTPROCESS_WORK),
        "message_ms_per_request": messages.get(ALL_MESSAGES),
        "ttft_p50_ms": by_name.get("ttft_p50_ms"),
    }


class Session:
    """The session's figures, as costs (larger is worse)."""

    def setup_cache(self) -> dict[str, float | None]:
        summary = run_session(sessions_dir() / (COMMIT or "worktree"))
        if summary.doubts:
            print("doubts:", *summary.doubts, sep="\n  ")
        return figures(summary.to_json())

    setup_cache.timeout = 600

    def track_ms_per_1k_tokens(self, cache):
        """Steady output throughput as a cost: 1e6 / (output tok/s)."""
        return cache["ms_per_1k_tokens"]

    track_ms_per_1k_tokens.unit = "ms/1k tokens"

    def track_postprocess_ms_per_iter(self, cache):
        """The postprocess's own work per worker iteration (waits subtracted)."""
        return cache["postprocess_ms_per_iter"]

    track_postprocess_ms_per_iter.unit = "ms/iteration"

    def track_message_ms_per_request(self, cache):
        """Worker message handling (worker.msg.*) per request."""
        return cache["message_ms_per_request"]

    track_message_ms_per_request.unit = "ms/request"

    def track_ttft_p50_ms(self, cache):
        return cache["ttft_p50_ms"]

    track_ttft_p50_ms.unit = "ms"


class SchedulerStep:
    """One Scheduler.schedule() on a populated scheduler: `running` decode rows, a quarter as
    many requests waiting for a row (the admission check runs and admits nobody)."""

    params = [16, 256]
    param_names = ["running"]

    def setup(self, running):
        import torch

        from engine.cache import CacheShapes, KVCache
        from engine.config import EngineConfig
        from engine.layers.sampler import SamplingParams
        from engine.worker.request import Request
        from engine.worker.scheduler import Scheduler

        config = EngineConfig(max_rows=running, kv_pages=64 * running, state_slots=running)
        shapes = CacheShapes(1, 1, 1, 8, 8, 2, 1, 8, 8)
        cache = KVCache(shapes, config.kv_pages, config.page_size, running, torch.float32, "cpu")
        self.scheduler = Scheduler(config, cache)
        for rid in range(running + running // 4):
            prompt = list(range(32 + rid % 64))
            self.scheduler.add(Request(rid, prompt, 256, True, SamplingParams(), rid))
        self.scheduler.schedule()  # admits `running`; make them decode rows
        for request in self.scheduler.running:
            request.num_cached = len(request.prompt)
            request.tokens.append(0)

    def time_schedule(self, running):
        self.scheduler.schedule()

"""One short engine session per commit, its figures tracked by asv with a spread; one scheduler
step timed.

`setup_cache` runs the session (harness.measure.session: SERVERS fresh servers of the
commit's engine, a closed loop each, phase timing, summarised like `bench run`'s) in a
process of its own that imports this checkout's harness, never the commit's: every commit is
measured by one harness version, and only the engine is the commit's. It keeps the run
directory (BENCH_ASV_SESSIONS/<commit>/, default results/asv/sessions/).

Each tracked figure returns its per-server samples the way asv's timing benchmarks do
({"samples": [...], "number": 1}): asv records their median as the value, with the spread
(quartiles, a 99% interval of the median) that `asv compare` and the HTML show.

asv counts a larger value as worse and cannot be told otherwise (asv issue #1617), so every
figure is tracked as a cost: throughput as ms per 1,000 output tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import COMMIT, REPO, TREE


def sessions_dir() -> Path:
    return Path(os.environ.get("BENCH_ASV_SESSIONS") or REPO / "results" / "asv" / "sessions")


def run_session(path: Path) -> dict[str, list[float | None]]:
    """The session's per-server samples, measured by this checkout's harness (REPO) on the
    commit's engine (TREE); RuntimeError when it did not finish."""
    env = {k: v for k, v in os.environ.items() if k not in ("BENCH_TREE", "BENCH_COMMIT")}
    env["PYTHONPATH"] = str(REPO)  # this checkout's harness, whatever asv's path holds
    cmd = [sys.executable, "-m", "harness.measure.session", "--tree", str(TREE)]
    cmd += ["--out", str(path)] + (["--commit", COMMIT] if COMMIT else [])
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the session failed:\n{proc.stderr[-2000:]}")
    return json.loads((path / "samples.json").read_text())


def tracked(values: list[float | None]) -> dict | None:
    """Per-server values as asv's samples (None: no server measured the figure)."""
    found = [v for v in values if v is not None]
    return {"samples": found, "number": 1} if found else None


class Session:
    """The session's figures, as costs (larger is worse), one sample per server."""

    def setup_cache(self) -> dict[str, list[float | None]]:
        return run_session(sessions_dir() / (COMMIT or "worktree"))

    setup_cache.timeout = 900

    def track_ms_per_1k_tokens(self, cache):
        """Steady output throughput as a cost: 1e6 / (output tok/s)."""
        return tracked(cache["ms_per_1k_tokens"])

    track_ms_per_1k_tokens.unit = "ms/1k tokens"

    def track_postprocess_ms_per_iter(self, cache):
        """The postprocess's own work per worker iteration (waits subtracted)."""
        return tracked(cache["postprocess_ms_per_iter"])

    track_postprocess_ms_per_iter.unit = "ms/iteration"

    def track_message_ms_per_request(self, cache):
        """Worker message handling (worker.msg.*, the messages received) per request."""
        return tracked(cache["message_ms_per_request"])

    track_message_ms_per_request.unit = "ms/request"

    def track_ttft_p50_ms(self, cache):
        """TTFT p50 over each server's steady window."""
        return tracked(cache["ttft_p50_ms"])

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
        self.scheduler = Scheduler(config.parts.scheduler, cache)
        for rid in range(running + running // 4):
            prompt = list(range(32 + rid % 64))
            self.scheduler.add(Request(rid, prompt, 256, True, SamplingParams(), rid))
        self.scheduler.schedule()  # admits `running`; make them decode rows
        for request in self.scheduler.running:
            request.num_cached = len(request.prompt)
            request.tokens.append(0)

    def time_schedule(self, running):
        self.scheduler.schedule()

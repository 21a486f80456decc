"""Hot-path microbenchmarks of the graph runtime (asv `time_*`), also runnable directly:

    python -m benchmarks.bench_runtime

prints the stop decision per step (runtime vs the model's per-row check_stop) at batch 64,
128 and 256, one begin/resume postprocess, one span window's bookkeeping, and the worker's
postprocess work per iteration at batch 64 on the tiny model with phase timing off and on.
"""

from __future__ import annotations

import time
import timeit

import numpy as np

from benchmarks import stats
from engine.models.qwen35_node import DECODE_LOOP, Qwen35Node
from engine.runtime.graph import StopRows
from engine.runtime.postprocess import PhasedPostprocess, PostprocessRequest, StepOutput
from engine.runtime.runtime import GraphRuntime

EOS = [4094, 4095]


def _decode_runtime(batch: int, seed: int = 0):
    """A runtime with `batch` decode rows mid-loop, their limits registered, and a step's
    tokens (a few EOS) and per-row facts for the model's own check."""
    rng = np.random.default_rng(seed)
    node = Qwen35Node(EOS)
    rt = GraphRuntime(node.graph, capacity=batch)
    for walk in node.graph.walks:
        rt.declare_stop_policies(walk, node.get_stop_policies(walk))
    max_tokens = rng.integers(256, 513, batch)
    counts = rng.integers(2, 256, batch)
    for rid in range(batch):
        handle = rt.add_request(rid)
        for walk, limits in node.stop_limits(int(max_tokens[rid]), False).items():
            rt.register_limits(handle, walk, limits)
        rt.walk_of[handle] = "decode"
        rt.iters[DECODE_LOOP][handle] = counts[rid] - 1
    tokens = rng.integers(0, 4000, batch)
    rids = np.arange(batch, dtype=np.int64)
    rows = StopRows.of(rids, ["decode"] * batch, tokens, counts, max_tokens, [False] * batch)
    return node, rt, rids, tokens, rows


class StopDecision:
    params = [64, 128, 256]
    param_names = ["batch"]

    def setup(self, batch):
        self.node, self.rt, rids, self.tokens, self.rows = _decode_runtime(batch)
        self.handles = self.rt.handles(rids)

    def time_runtime_check(self, batch):
        self.rt.check_stops("decode", self.handles, self.tokens)

    def time_model_check_stop(self, batch):
        self.node.check_stop(self.rows)


class Postprocess:
    """One begin -> DONE of a decode step with no stops (the common step).

    `begin` counts one more iteration of every row, so repeated calls walk the rows towards
    their caps and, after a few hundred, time another path (rows stopping, a SEND break).
    Each sample therefore starts from the same state: `number = 1`, so asv runs `setup`
    (which resets it) before every timed call, and the direct run resets between calls."""

    params = [128]
    param_names = ["batch"]
    number = 1  # one call per sample, each after setup's reset
    repeat = (20, 200, 10.0)

    def setup(self, batch):
        _, rt, self.rids, tokens, _ = _decode_runtime(batch)
        self.tokens = np.where(np.isin(tokens, EOS), 0, tokens)
        self.pp = PhasedPostprocess(rt)
        self.rt = rt
        self.reset()

    def reset(self) -> None:
        """Every row one iteration into its loop, far from every cap: nothing stops."""
        self.rt.iters[DECODE_LOOP][:] = 1

    def time_begin_resume(self, batch):
        out = StepOutput(
            self.rids,
            self.rt.handles(self.rids),
            ["decode"] * batch,
            self.tokens,
            check_stop_buffers={"new_token": self.tokens},
        )
        return self.pp.begin(PostprocessRequest(out, True))


class SpanFlush:
    """The worker's span bookkeeping between two iterations: packing and sending one window of
    100 iterations, 18 span names and 4 counts (PhaseTimer.flush, to a sink that drops it).
    Setup fills the window again before every timed call."""

    number = 1
    repeat = (20, 200, 10.0)

    def setup(self):
        from engine.worker.timing import PhaseTimer

        # not `self.timer`: asv reads that attribute as its clock
        self.phases = PhaseTimer(100, "bench", [lambda window: None])
        for iteration in range(100):
            for k in range(18):
                self.phases.span(f"worker.span{k}", 10_000 + iteration)
            for k in range(4):
                self.phases.count(f"worker.count{k}", iteration)
            self.phases.iteration += 1

    def time_flush(self):
        self.phases.flush()


def postprocess_ms_per_iteration(period: int, batch: int = 64, steps: int = 200) -> float:
    """The worker's whole postprocess (wait, host copy, runtime, send, removals) per decode
    iteration at `batch` rows of the tiny model, timing flag at `period` (0: off). The worker
    is the one the worker process builds (`build_worker`); each step is launched and
    postprocessed by the methods its own iteration calls."""
    from engine.messages import AddRequest
    from engine.worker.main import build_worker
    from engine.worker.timing import PhaseTimer
    from harness.scenario import load_scenario

    scenario = load_scenario("qwen35", "tiny")
    timer = PhaseTimer(period, "bench", [lambda records: None])
    worker = build_worker(scenario.model, scenario.engine, timer, lambda msg: None)
    for rid in range(batch):
        worker.handle(AddRequest(rid, [rid + 1] * 8, steps + 10, ignore_eos=True, temperature=0))
    worker.iteration()  # the prefill step
    total = 0.0
    for _ in range(steps):
        pending = worker.launch()
        start = time.perf_counter()
        worker.postprocess_batch(pending)
        total += time.perf_counter() - start
    return total / steps * 1e3


def _best_us(fn, number: int = 2000, repeat: int = 7, reset=None) -> float:
    """Best of `repeat` samples, in us per call. With `reset`, it runs before every call and
    only the calls are timed (each call starts from the same state)."""
    if reset is None:
        return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6
    best = float("inf")
    for _ in range(repeat):
        total = 0.0
        for _ in range(number):
            reset()
            start = time.perf_counter()
            fn()
            total += time.perf_counter() - start
        best = min(best, total)
    return best / number * 1e6


def main() -> None:
    print("stop decision per step (us, best of 7)")
    print(f"{'batch':>6} {'runtime':>10} {'check_stop':>11} {'ratio':>7}")
    for batch in StopDecision.params:
        bench = StopDecision()
        bench.setup(batch)
        fast = _best_us(lambda b=bench, n=batch: b.time_runtime_check(n))
        slow = _best_us(lambda b=bench, n=batch: b.time_model_check_stop(n))
        print(f"{batch:>6} {fast:>10.1f} {slow:>11.1f} {fast / slow:>7.2f}")
    pp = Postprocess()
    pp.setup(128)
    begin = _best_us(lambda: pp.time_begin_resume(128), reset=pp.reset)
    print(f"begin -> DONE, decode step, batch 128: {begin:.1f} us")
    flush = SpanFlush()
    print(
        f"span window packed and sent: {_best_us(flush.time_flush, 200, reset=flush.setup):.1f} us"
    )
    print("postprocess per iteration, batch 64, tiny model (ms; 3 runs each, alternating)")
    runs = {0: [], 100: []}
    for _ in range(3):
        for period in runs:
            runs[period].append(postprocess_ms_per_iteration(period))
    for period, values in runs.items():
        label = "timing off" if period == 0 else f"timing on (period {period})"
        print(
            f"  {label:<26} "
            + "  ".join(f"{v:.4f}" for v in values)
            + f"   median {stats.summarise(values).median:.4f}"
        )


if __name__ == "__main__":
    main()

"""A recorded run built from synthetic rows whose figures are known, written as `bench run`
leaves a run directory (tables, manifest, summary.json), and the test's own expectations
computed from the rows alone."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from harness.analysis.schema import RequestRecord, ServerRecord, Slot, SpanRecord
from harness.results import RunDir, summarise

STREAMS, TOKENS, RUN_S, STEADY = 4, 10, 4.0, (1.0, 3.0)
WINDOWS, ITERS = 4, 100
PLOTS = ("throughput", "phases", "latency", "timeline")
PNG = b"\x89PNG\r\n\x1a\n"
# ms per iteration of each span, per arm; the worker's nesting holds (parts <= totals)
SPANS_MS = {
    "worker.iter_total": (3.0, 3.3),
    "worker.step.schedule": (0.1, 0.1),
    "worker.step.forward": (2.0, 2.1),
    "worker.postprocess_batch": (0.8, 1.0),
    "worker.step.completion_wait": (0.2, 0.2),
    "worker.postprocess.prematerialize": (0.05, 0.05),
    "worker.postprocess.runtime": (0.3, 0.45),
    "worker.postprocess.tail": (0.2, 0.25),
}
MESSAGES_MS = {"worker.msg.add_request": (0.4, 0.5), "worker.msg.add_request.engine": (0.1, 0.2)}
COMMIT = "9c05c56" * 5 + "ab"
ARMS = [
    {"letter": "A", "name": "main", "kind": "ref", "spec": "main", "commit": COMMIT,
     "dirty": False, "diff_hash": None, "overrides": {}, "url": None, "tree": "/wt"},
    {"letter": "B", "name": "pr", "kind": "worktree", "spec": "worktree", "commit": COMMIT,
     "dirty": True, "diff_hash": "c05ef4fd612d3e7b", "overrides": {"engine.mixing": True},
     "url": None, "tree": "/work"},
]  # fmt: skip


def write_run(
    path: Path,
    rates: list[float],
    letters: str = "ABBA",
    spans: bool = True,
    failed: int = 0,
    arms: list[dict] = ARMS,
    run_id: str = "run",
) -> dict:
    """A recorded run, summarised as `bench run` leaves it: server i (schedule order) streams
    STREAMS requests at a time whose tokens arrive every STREAMS / rates[i] seconds; arm B's
    spans take SPANS_MS[name][1] ms per iteration times (1 + slot / 100). The first `failed`
    measured requests of server 1 fail. Returns the rows, for the test to compute its own
    expectations."""
    run = RunDir(path)
    scenario = {"name": "qwen35", "size": "tiny", "headline": "output_tok_per_s"}
    load = {"concurrency": STREAMS, "requests": None, "duration_s": RUN_S, "warmup": STREAMS}
    run.write_manifest(
        {
            "run_id": run_id,
            "command": "bench run qwen35 -c 4 --abba",
            "aa_check": False,
            "scenario": scenario | {"engine": {}, "load": {}, "model": {}},
            "arms": arms,
            "schedule": list(letters * (len(rates) // len(letters))),
            **load,
            "period": ITERS,
            "complete": True,
            "machine": {"cpu": "x86_64", "cpus": 2, "gpu": None, "host": "ci"},
        }
    )
    rows = {"requests": [], "spans": [], "servers": []}
    for i, rate in enumerate(rates):
        block, slot = divmod(i, len(letters))
        letter = letters[slot]
        arm = next(a["name"] for a in arms if a["letter"] == letter)
        where = Slot(arm, letter, f"{letter}{slot}", block, slot)
        t0 = 1000.0 + 100 * i
        requests = _requests(where, STREAMS / rate, failed if i == 1 else 0)
        span_rows = _spans(where, t0) if spans else []
        process = {"port": 9000 + i, "log": f"logs/{i}.log", "t0_unix": t0, "start_unix": t0 - 1}
        window = {"steady_start_s": STEADY[0], "steady_end_s": STEADY[1]}
        facts = {"healthy": True, "requests": len(requests)}
        server = ServerRecord(**asdict(where), **process, **facts, **window)
        run.append_slot(requests, span_rows, server)
        rows["requests"] += requests
        rows["spans"] += span_rows
        rows["servers"].append(server)
    summarise(path)
    return rows


def _requests(where: Slot, itl: float, failed: int) -> list[RequestRecord]:
    out = []
    for stream in range(STREAMS):
        send, k = stream * itl / STREAMS, 0
        while send < RUN_S:
            times = [send + itl * (j + 1) for j in range(TOKENS)]
            warmup = k == 0
            bad = not warmup and failed > 0
            failed -= bad
            sent = {"index": k * STREAMS + stream, "warmup": warmup, "prompt_tokens": 16}
            sent |= {"max_tokens": TOKENS, "intended_send_s": send, "send_s": send}
            got = {"first_token_s": times[0], "end_s": times[-1], "output_tokens": TOKENS}
            got |= {"token_times_s": times, "status": 200}
            if bad:
                got = {"output_tokens": 0, "status": 500, "error": "HTTP 500"}
            out.append(RequestRecord(**asdict(where), **sent, **got))
            send, k = times[-1], k + 1
    return out


def _spans(where: Slot, t0: float) -> list[SpanRecord]:
    rows, scale = [], 1 + where.slot / 100
    for w in range(WINDOWS):
        first, start, end = w * ITERS + 1, t0 + w, t0 + w + 1
        window = {"first_iter": first, "last_iter": first + ITERS - 1, "iterations": ITERS}
        window |= {"mean_batch": 3.0, "start_unix": start, "end_unix": end}
        for name, ms in (SPANS_MS | MESSAGES_MS).items():
            n = 10 if name.startswith("worker.msg") else ITERS
            total = ms[where.letter == "B"] * scale * ITERS * 1e6
            values = {"n": n, "sum": total, "p50": 0, "p95": 0, "max": 0}
            rows.append(SpanRecord(**asdict(where), name=name, kind="span", **window, **values))
        values = {"n": ITERS, "sum": 3.5 * ITERS, "p50": 3, "p95": 4, "max": 4}
        name = "worker.rows_per_step"
        rows.append(SpanRecord(**asdict(where), name=name, kind="count", **window, **values))
    return rows


# --- what a test expects, computed from the rows alone -------------------------------------------


def steady_tok_per_s(requests: list[RequestRecord], server: ServerRecord) -> float:
    mine = [r for r in requests if (r.block, r.slot) == (server.block, server.slot)]
    times = np.concatenate([r.token_times_s for r in mine if r.ok and not r.warmup])
    a, b = server.steady_start_s, server.steady_end_s
    return ((times >= a) & (times <= b)).sum() / (b - a)


def pooled_ms_per_iter(spans: list[SpanRecord], servers, name: str, letter: str) -> float:
    keys = {(s.block, s.slot) for s in servers if s.letter == letter}
    mine = [s for s in spans if (s.block, s.slot) in keys]
    iterations = sum(s.iterations for s in mine if s.name == "worker.iter_total")
    return sum(s.sum for s in mine if s.name == name) / iterations / 1e6


def ms_per_request(spans, servers, name: str, letter: str) -> float:
    keys = {(s.block, s.slot) for s in servers if s.letter == letter}
    mine = [s for s in spans if (s.block, s.slot) in keys]
    requests = sum(s.n for s in mine if s.name == "worker.msg.add_request")
    return sum(s.sum for s in mine if s.name == name) / requests / 1e6


def row(markdown: str, first: str) -> list[str]:
    """The cells of the table row whose first cell is `first`."""
    for line in markdown.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if line.startswith("|") and cells[0] == first:
            return cells
    raise AssertionError(f"no table row {first!r} in:\n{markdown}")


def numbers(cell: str) -> list[float]:
    return [float(v) for v in cell.split(" / ")]


RATES = [1000.0, 900.0, 902.0, 1004.0, 990.0, 893.0, 895.0, 994.0]  # ABBA ABBA: B 10% slower

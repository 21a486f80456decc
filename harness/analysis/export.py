"""A run's requests in the forms other tools read (`bench export`): the result file of
`vllm bench serve --save-result`, and one flat row per request for a CSV. Pure: frames in,
a dict or a frame out; the command writes them."""

from __future__ import annotations

import json
import time

import numpy as np
import pandas as pd

from harness.analysis import metrics
from harness.analysis.goodput import goodput
from harness.analysis.schema import SERVER_KEY

VLLM_PERCENTILE = 99
VLLM_METRICS = {"ttft": metrics.ttft_s, "tpot": metrics.tpot_s, "e2el": metrics.e2e_s}


def vllm_result(
    manifest: dict, requests: pd.DataFrame, slos_ms: dict[str, float] | None = None
) -> dict:
    """The keys `vllm bench serve --save-result` writes, for one arm's measured requests:
    times in seconds in the lists, in ms in the statistics. `duration` is the seconds of load
    (`metrics.run_span_s`: each server's, summed) and the throughputs are the harness's own
    whole-load figures (metrics.py), so they agree with `bench measure`'s."""
    rows = metrics.measured(requests).sort_values(["block", "slot", "index"])
    done = metrics.completed(requests)
    duration = metrics.run_span_s(requests)
    succeeded = requests[metrics.ok(requests)]
    load = manifest.get("load") or {}
    rate = load.get("request_rate")
    out = {
        "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(manifest.get("unix_time", 0))),
        "backend": "openai",
        "model_id": manifest.get("model") or (manifest.get("scenario") or {}).get("name"),
        "tokenizer_id": manifest.get("tokenizer"),
        "num_prompts": len(rows),
        "request_rate": "inf" if rate is None else rate,
        "burstiness": load.get("burstiness", 1.0),
        "max_concurrency": manifest.get("concurrency"),
        "duration": duration,
        "completed": len(done),
        "total_input_tokens": int(done["prompt_tokens"].sum()),
        "total_output_tokens": int(done["output_tokens"].sum()),
        "request_throughput": metrics.run_request_per_s(requests),
        "request_goodput": goodput(requests, slos_ms).per_s if slos_ms else None,
        "output_throughput": metrics.run_tok_per_s(requests),
        "total_token_throughput": succeeded[["prompt_tokens", "output_tokens"]].sum().sum()
        / duration,
        "max_output_tokens_per_s": _per_server_max(done, _max_per_second),
        "max_concurrent_requests": _per_server_max(rows, _max_in_flight),
        "input_lens": rows["prompt_tokens"].astype(int).tolist(),
        "output_lens": [
            int(n) if ok else 0
            for n, ok in zip(rows["output_tokens"], metrics.ok(rows), strict=True)
        ],
        "ttfts": [_or_zero(v) for v in metrics.ttft_s(rows)],
        "itls": [np.diff(np.asarray(t, dtype=float)).tolist() for t in rows["token_times_s"]],
        "generated_texts": [""] * len(rows),  # the harness keeps counts and times, not text
        "errors": [e or "" for e in rows["error"]],
    }
    itl = metrics.itl_s(done)
    for name, values in {**{k: f(done) for k, f in VLLM_METRICS.items()}, "itl": itl}.items():
        out |= _statistics(name, np.asarray(values, dtype=float) * 1e3)
    return _json_safe(out)


def _statistics(name: str, ms: np.ndarray) -> dict:
    ms = ms[~np.isnan(ms)]
    if not ms.size:
        ms = np.zeros(1)  # vLLM reports 0 for a metric with no values
    return {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
        f"p{VLLM_PERCENTILE}_{name}_ms": float(np.percentile(ms, VLLM_PERCENTILE)),
    }


def _per_server_max(requests: pd.DataFrame, figure) -> float:
    """The largest of `figure` over the servers (each has its own clock); 0 without rows."""
    if requests.empty:
        return 0
    return max(figure(rows) for _, rows in requests.groupby(SERVER_KEY))


def _max_per_second(requests: pd.DataFrame) -> float:
    """The most tokens that arrived within one whole second of a server's load."""
    times = metrics.token_times(requests)
    if not times.size:
        return 0.0
    return float(np.bincount(np.floor(times - times.min()).astype(int)).max())


def _max_in_flight(rows: pd.DataFrame) -> int:
    """The most requests between send and end at once."""
    if rows.empty:
        return 0
    events = sorted(
        [(s, 1) for s in rows["send_s"]] + [(e, -1) for e in rows["end_s"].astype(float)]
    )
    return int(max(np.cumsum([d for _, d in events])))


def _or_zero(value: float) -> float:
    return 0.0 if value != value else float(value)


def _json_safe(value):
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value.item() if hasattr(value, "item") else value


def records_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per request with its raw facts and its latencies (ms); `token_times_s` as a
    JSON list, so the file stays one row per request."""
    out = requests.sort_values(["block", "slot", "index"]).reset_index(drop=True)
    out = out.assign(
        ttft_ms=metrics.ttft_s(out) * 1e3,
        tpot_ms=metrics.tpot_s(out) * 1e3,
        e2e_ms=metrics.e2e_s(out) * 1e3,
        token_times_s=[json.dumps([round(t, 6) for t in times]) for times in out["token_times_s"]],
    )
    return out

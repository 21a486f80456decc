"""Request metrics, defined once (docs/METRICS.md): pure functions over the requests frame.

The requests frame has one row per `RequestRecord` (times in client seconds relative to the
slot's load start); the servers frame one row per `ServerRecord` (schema.py). Arms are told
apart by their letter. Warmup requests never count; latencies come from successful requests
only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.schema import SERVER_KEY

QUANTILES = {"p50": 0.50, "p90": 0.90, "p99": 0.99}
STATS = [*QUANTILES, "mean"]
LATENCIES = ["ttft", "tpot", "itl", "e2e"]
AUDIO_LATENCIES = ["ttfa", "e2e"]
# OpenAI's response_format `pcm`, what /v1/audio/speech streams: 24 kHz, 16-bit, mono.
PCM_BYTES_PER_S = 24_000 * 2


@dataclass(frozen=True)
class Figure:
    """A per-server figure the comparison pairs across arms."""

    name: str  # column of server_summary / arm_summary
    label: str
    unit: str
    higher_is_better: bool


def figures(audio: bool = False) -> list[Figure]:
    """The figures compared, headline first: tokens, or audio for a speech load."""
    if audio:
        out = [
            Figure("audio_s_per_s", "audio-seconds/s (steady)", "audio-s/s", True),
            Figure("audio_s_per_s_run", "audio-seconds/s (whole run)", "audio-s/s", True),
        ]
        latencies = AUDIO_LATENCIES
    else:
        out = [
            Figure("output_tok_per_s", "output tok/s (steady)", "tok/s", True),
            Figure("output_tok_per_s_run", "output tok/s (whole run)", "tok/s", True),
        ]
        latencies = LATENCIES
    for metric in latencies:
        for stat in ("p50", "p99"):
            out.append(Figure(f"{metric}_{stat}_ms", f"{metric.upper()} {stat}", "ms", False))
    if audio:
        out += [Figure(f"rtf_{stat}", f"RTF {stat}", "x", False) for stat in ("p50", "p99")]
    return out


def measured(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that count: everything but warmup."""
    return requests[~requests["warmup"].astype(bool)]


def ok(requests: pd.DataFrame) -> pd.Series:
    """Succeeded: HTTP 200 and no client-side error."""
    return (requests["status"] == 200) & requests["error"].isna()


def failed(requests: pd.DataFrame) -> int:
    """Measured requests that did not succeed (non-200, no response, or an error)."""
    return int((~ok(measured(requests))).sum())


def completed(requests: pd.DataFrame) -> pd.DataFrame:
    """Measured requests that succeeded: the population of every latency and token count."""
    rows = measured(requests)
    return rows[ok(rows)]


def ttft_s(requests: pd.DataFrame) -> pd.Series:
    return requests["first_token_s"].astype(float) - requests["send_s"]


def tpot_s(requests: pd.DataFrame) -> pd.Series:
    """Mean time per output token after the first; NaN for replies of fewer than 2 tokens."""
    gaps = (requests["output_tokens"] - 1).astype(float)
    decode = requests["end_s"].astype(float) - requests["first_token_s"].astype(float)
    return decode / gaps.where(gaps > 0)


def e2e_s(requests: pd.DataFrame) -> pd.Series:
    return requests["end_s"].astype(float) - requests["send_s"]


def itl_s(requests: pd.DataFrame) -> np.ndarray:
    """Every gap between consecutive token arrivals of a request, all requests together."""
    gaps = [np.diff(np.asarray(t, dtype=float)) for t in requests["token_times_s"]]
    return np.concatenate(gaps) if gaps else np.empty(0)


def token_times(requests: pd.DataFrame) -> np.ndarray:
    times = [np.asarray(t, dtype=float) for t in requests["token_times_s"]]
    return np.concatenate(times) if times else np.empty(0)


def distribution(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p99 (linear interpolation) and mean; NaN when there are no values."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not values.size:
        return dict.fromkeys(STATS, float("nan"))
    quantiles = np.quantile(values, list(QUANTILES.values()))
    return {**dict(zip(QUANTILES, quantiles.tolist(), strict=True)), "mean": float(values.mean())}


def latency_ms(requests: pd.DataFrame) -> dict[str, float]:
    """`<metric>_<stat>_ms` for each latency over the completed requests given."""
    done = completed(requests)
    samples = {"ttft": ttft_s(done), "tpot": tpot_s(done), "itl": itl_s(done), "e2e": e2e_s(done)}
    out = {}
    for metric, seconds in samples.items():
        for stat, value in distribution(np.asarray(seconds, dtype=float) * 1e3).items():
            out[f"{metric}_{stat}_ms"] = value
    return out


def _no_window(requests: pd.DataFrame, start_s: float | None, end_s: float | None) -> bool:
    return (
        measured(requests).empty
        or start_s is None
        or end_s is None
        or pd.isna(start_s)
        or pd.isna(end_s)
        or end_s <= start_s
    )


def steady_tok_per_s(requests: pd.DataFrame, start_s: float | None, end_s: float | None) -> float:
    """Output tokens of completed requests arriving in [start_s, end_s], per second of window;
    NaN without a window or without measured requests."""
    if _no_window(requests, start_s, end_s):
        return float("nan")
    times = token_times(completed(requests))
    return int(((times >= start_s) & (times <= end_s)).sum()) / (end_s - start_s)


def audio_s(requests: pd.DataFrame) -> pd.Series:
    """Seconds of audio each request received: its PCM bytes / PCM_BYTES_PER_S."""
    return requests["audio_bytes"].map(lambda pieces: float(np.sum(pieces))) / PCM_BYTES_PER_S


def rtf(requests: pd.DataFrame) -> pd.Series:
    """Real-time factor: E2E over the seconds of audio received (below 1: faster than it
    plays); NaN for a request that received no audio."""
    seconds = audio_s(requests)
    return e2e_s(requests) / seconds.where(seconds > 0)


def steady_audio_s_per_s(
    requests: pd.DataFrame, start_s: float | None, end_s: float | None
) -> float:
    """Seconds of audio of completed requests arriving in [start_s, end_s] (each piece of
    PCM counted at its arrival), per second of window; NaN without a window."""
    if _no_window(requests, start_s, end_s):
        return float("nan")
    done = completed(requests)
    times = np.concatenate([np.asarray(t, dtype=float) for t in done["audio_times_s"]] or [[]])
    sizes = np.concatenate([np.asarray(b, dtype=float) for b in done["audio_bytes"]] or [[]])
    inside = sizes[(times >= start_s) & (times <= end_s)].sum()
    return float(inside) / PCM_BYTES_PER_S / (end_s - start_s)


def run_audio_s_per_s(requests: pd.DataFrame) -> float:
    """Audio seconds of completed requests over the measured run: first send to last end."""
    span = _run_span(requests)
    return float(audio_s(completed(requests)).sum()) / span if span else float("nan")


def _run_span(requests: pd.DataFrame) -> float | None:
    """Seconds from the first measured send to the last measured end; None when empty."""
    rows = measured(requests)
    if rows.empty:
        return None
    span = rows["end_s"].astype(float).max() - rows["send_s"].min()
    return span if span > 0 else None


def run_tok_per_s(requests: pd.DataFrame) -> float:
    """Output tokens of completed requests over the measured run: first send to last end."""
    span = _run_span(requests)
    return float(completed(requests)["output_tokens"].sum()) / span if span else float("nan")


def audio_latency(requests: pd.DataFrame) -> dict[str, float]:
    """`ttfa_<stat>_ms` and `rtf_<stat>` over the completed requests given. TTFA is the TTFT
    of a speech reply: its first output is its first audio."""
    done = completed(requests)
    out = {f"ttfa_{k}_ms": v for k, v in distribution(np.asarray(ttft_s(done)) * 1e3).items()}
    return out | {f"rtf_{k}": v for k, v in distribution(np.asarray(rtf(done))).items()}


def server_summary(
    requests: pd.DataFrame, servers: pd.DataFrame, audio: bool = False
) -> pd.DataFrame:
    """One row per server (schedule order): counts, throughputs and latency percentiles; with
    `audio` (a speech load) its audio seconds, audio-seconds/s, TTFA and RTF too."""
    groups: Mapping = dict(list(requests.groupby(SERVER_KEY))) if len(requests) else {}
    rows = []
    for server in servers.sort_values(["block", "slot"]).itertuples(index=False):
        reqs = groups.get((server.letter, server.block, server.slot), requests.iloc[:0])
        tok_s = steady_tok_per_s(reqs, server.steady_start_s, server.steady_end_s)
        row = {
            "letter": server.letter,
            "block": server.block,
            "slot": server.slot,
            "healthy": bool(server.healthy),
            "requests": len(measured(reqs)),
            "failed": failed(reqs),
            "output_tokens": int(completed(reqs)["output_tokens"].sum()),
            "timed_tokens": len(token_times(completed(reqs))),  # arrival times recorded
            "output_tok_per_s": tok_s,
            "output_tok_per_s_run": run_tok_per_s(reqs),
        }
        if audio:
            start, end = server.steady_start_s, server.steady_end_s
            row["audio_s"] = float(audio_s(completed(reqs)).sum())
            row["audio_s_per_s"] = steady_audio_s_per_s(reqs, start, end)
            row["audio_s_per_s_run"] = run_audio_s_per_s(reqs)
            row |= audio_latency(reqs)
        rows.append(row | latency_ms(reqs))
    return pd.DataFrame(rows)


def arm_summary(requests: pd.DataFrame, servers: pd.DataFrame, audio: bool = False) -> pd.DataFrame:
    """One row per arm (letter): throughputs are the mean over its servers; latency
    percentiles pool the requests of all its servers."""
    per_server = server_summary(requests, servers, audio)
    rates = ["output_tok_per_s", "output_tok_per_s_run"]
    rates += ["audio_s_per_s", "audio_s_per_s_run"] if audio else []
    counts = ["requests", "failed", "output_tokens", "timed_tokens"] + (
        ["audio_s"] if audio else []
    )
    rows = []
    for letter, group in per_server.groupby("letter", sort=False):
        pooled = requests[requests["letter"] == letter]
        rows.append(
            {"letter": letter, "servers": len(group)}
            | group[counts].sum().to_dict()
            | group[rates].mean().to_dict()
            | latency_ms(pooled)
            | (audio_latency(pooled) if audio else {})
        )
    return pd.DataFrame(rows)

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
SPEECH_LATENCIES = ["ttfa", "e2e", "rtf"]  # a speech load's (RTF is a ratio, not a time)
RATIOS = {"rtf"}
NO_SAMPLES = np.empty(0)
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
            Figure("audio_s_per_s_run", "audio-seconds/s (whole load)", "audio-s/s", True),
        ]
    else:
        out = [
            Figure("output_tok_per_s", "output tok/s (steady)", "tok/s", True),
            Figure("output_tok_per_s_run", "output tok/s (whole load)", "tok/s", True),
        ]
    for metric in SPEECH_LATENCIES if audio else LATENCIES:
        for stat in ("p50", "p99"):
            label = f"{metric.upper()} {stat} (steady)"
            if metric in RATIOS:
                out.append(Figure(f"{metric}_{stat}", label, "x", False))
            else:
                out.append(Figure(f"{metric}_{stat}_ms", label, "ms", False))
    return out


def measured(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that count: everything but warmup."""
    return requests[~requests["warmup"].astype(bool)]


def ok(requests: pd.DataFrame) -> pd.Series:
    """Succeeded: HTTP 200 and no client-side error."""
    return (requests["status"] == 200) & requests["error"].isna()


# A request's error when an interruption (Ctrl-C, a guard's SIGTERM, a stopped load) cut it
# in flight (harness/measure/lanes.py): the client's doing, not the server's failure.
CUT = "interrupted"


def cut(requests: pd.DataFrame) -> int:
    """Measured requests an interruption cut in flight: neither completed nor failed."""
    return int((measured(requests)["error"] == CUT).sum())


def failed(requests: pd.DataFrame) -> int:
    """Measured requests that did not succeed (non-200, no response, or an error), less those
    an interruption cut (`cut`): a server that was working when the run was stopped has not
    failed them."""
    rows = measured(requests)
    return int((~ok(rows) & (rows["error"] != CUT)).sum())


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


def audio_s(requests: pd.DataFrame) -> pd.Series:
    """Seconds of audio each request received: its PCM bytes / PCM_BYTES_PER_S."""
    return requests["audio_bytes"].map(lambda pieces: float(np.sum(pieces))) / PCM_BYTES_PER_S


def rtf(requests: pd.DataFrame) -> pd.Series:
    """Real-time factor: E2E over the seconds of audio received (below 1: made faster than it
    plays); NaN for a request that received no audio."""
    seconds = audio_s(requests)
    return e2e_s(requests) / seconds.where(seconds > 0)


def itl_s(requests: pd.DataFrame) -> np.ndarray:
    """Every gap between consecutive token arrivals of a request, all requests together."""
    gaps = [np.diff(np.asarray(t, dtype=float)) for t in requests["token_times_s"]]
    return np.concatenate(gaps) if gaps else np.empty(0)


def token_times(requests: pd.DataFrame) -> np.ndarray:
    times = [np.asarray(t, dtype=float) for t in requests["token_times_s"]]
    return np.concatenate(times) if times else np.empty(0)


def audio_pieces(requests: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Every piece of PCM the requests received, all requests together: its arrival (seconds)
    and its bytes."""
    times = [np.asarray(t, dtype=float) for t in requests["audio_times_s"]]
    sizes = [np.asarray(b, dtype=float) for b in requests["audio_bytes"]]
    if not times:
        return np.empty(0), np.empty(0)
    return np.concatenate(times), np.concatenate(sizes)


def distribution(values: np.ndarray) -> dict[str, float]:
    """p50/p90/p99 (linear interpolation) and mean; NaN when there are no values."""
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if not values.size:
        return dict.fromkeys(STATS, float("nan"))
    quantiles = np.quantile(values, list(QUANTILES.values()))
    return {**dict(zip(QUANTILES, quantiles.tolist(), strict=True)), "mean": float(values.mean())}


Window = tuple[float, float] | None  # a server's steady window (start_s, end_s), or none


def latency_samples(requests: pd.DataFrame, window: Window = None) -> dict[str, np.ndarray]:
    """Seconds of each latency over the completed requests given (one server's). With a
    steady window, only what happened inside it: TTFT, TPOT and E2E of the requests sent and
    ended inside it, and the ITL gaps whose two arrivals both lie inside it."""
    done = completed(requests)
    gaps = itl_s(done) if window is None else _gaps_inside(done, *window)
    whole = _inside(done, window)
    samples = {"ttft": ttft_s(whole), "tpot": tpot_s(whole), "itl": gaps, "e2e": e2e_s(whole)}
    return {metric: np.asarray(seconds, dtype=float) for metric, seconds in samples.items()}


def speech_samples(requests: pd.DataFrame, window: Window = None) -> dict[str, np.ndarray]:
    """A speech load's latencies over the completed requests given, as latency_samples: TTFA
    (a speech reply's TTFT: its first output is its first audio) and E2E in seconds, and RTF,
    of the requests sent and ended inside the steady window when there is one."""
    whole = _inside(completed(requests), window)
    samples = {"ttfa": ttft_s(whole), "e2e": e2e_s(whole), "rtf": rtf(whole)}
    return {metric: np.asarray(values, dtype=float) for metric, values in samples.items()}


def _inside(done: pd.DataFrame, window: Window) -> pd.DataFrame:
    """The requests sent and ended inside the window (all of them without one)."""
    if window is None:
        return done
    start, end = window
    return done[(done["send_s"] >= start) & (done["end_s"].astype(float) <= end)]


def _gaps_inside(requests: pd.DataFrame, start: float, end: float) -> np.ndarray:
    gaps = []
    for times in requests["token_times_s"]:
        t = np.asarray(times, dtype=float)
        t = t[(t >= start) & (t <= end)]
        gaps.append(np.diff(t))
    return np.concatenate(gaps) if gaps else np.empty(0)


def latency_ms(samples: Mapping[str, np.ndarray]) -> dict[str, float]:
    """`<metric>_<stat>_ms` for each latency's samples (seconds); `<metric>_<stat>` for a
    ratio's (RATIOS: RTF)."""
    out = {}
    for metric, values in samples.items():
        if metric in RATIOS:
            out |= {f"{metric}_{stat}": v for stat, v in distribution(values).items()}
            continue
        for stat, value in distribution(values * 1e3).items():
            out[f"{metric}_{stat}_ms"] = value
    return out


def steady_window(server) -> Window:
    """A server record's steady window, or None when it has none."""
    start, end = server.steady_start_s, server.steady_end_s
    if start is None or end is None or pd.isna(start) or pd.isna(end) or end <= start:
        return None
    return float(start), float(end)


def steady_tok_per_s(requests: pd.DataFrame, window: Window) -> float:
    """Output tokens of completed requests arriving in the steady window, per second of it;
    NaN without a window or without measured requests."""
    if measured(requests).empty or window is None:
        return float("nan")
    start, end = window
    times = token_times(completed(requests))
    return int(((times >= start) & (times <= end)).sum()) / (end - start)


def steady_audio_s_per_s(requests: pd.DataFrame, window: Window) -> float:
    """Seconds of audio of completed requests arriving in the steady window (each piece of
    PCM counted at its arrival), per second of it; NaN as steady_tok_per_s."""
    if measured(requests).empty or window is None:
        return float("nan")
    start, end = window
    times, sizes = audio_pieces(completed(requests))
    inside = sizes[(times >= start) & (times <= end)].sum()
    return float(inside) / PCM_BYTES_PER_S / (end - start)


def run_span_s(requests: pd.DataFrame) -> float:
    """Seconds of load: each server's whole load, first send to last end (warmup included),
    summed over the servers in the frame (their clocks are their own); NaN without measured
    requests."""
    if measured(requests).empty:
        return float("nan")
    servers = requests.assign(end_s=requests["end_s"].astype(float)).groupby(SERVER_KEY)
    span = float((servers["end_s"].max() - servers["send_s"].min()).sum())
    return span if span > 0 else float("nan")


def run_tok_per_s(requests: pd.DataFrame) -> float:
    """Output tokens of every succeeded request, warmup included, over the whole load
    (`run_span_s`). Every token delivered in that span counts and so does all of its time
    (counting only measured requests' tokens over their span would leave out the warmup
    requests' tokens but not the time they took: a figure biased low)."""
    return _per_whole_load_s(requests, lambda rows: rows["output_tokens"].sum())


def run_audio_s_per_s(requests: pd.DataFrame) -> float:
    """Audio seconds of every succeeded request, warmup included, over the whole load, as
    run_tok_per_s."""
    return _per_whole_load_s(requests, lambda rows: audio_s(rows).sum())


def run_request_per_s(requests: pd.DataFrame) -> float:
    """Succeeded requests, warmup included, over the whole load, as run_tok_per_s."""
    return _per_whole_load_s(requests, len)


def _per_whole_load_s(requests: pd.DataFrame, amount) -> float:
    """`amount(succeeded requests)` per second of the whole load (`run_span_s`); NaN without
    measured requests, succeeded ones or time."""
    rows = requests[ok(requests)] if len(requests) else requests
    if rows.empty:
        return float("nan")
    return float(amount(rows)) / run_span_s(requests)


def server_summary(
    requests: pd.DataFrame, servers: pd.DataFrame, audio: bool = False
) -> pd.DataFrame:
    """One row per server (schedule order): counts, throughputs and latency percentiles; with
    `audio` (a speech load) its audio seconds, audio-seconds/s, and TTFA, E2E and RTF."""
    samples_of, names = _latencies(audio)
    rows = []
    for server, reqs, window in _servers(requests, servers):
        tok_s = steady_tok_per_s(reqs, window)
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
            row["audio_s"] = float(audio_s(completed(reqs)).sum())
            row["audio_s_per_s"] = steady_audio_s_per_s(reqs, window)
            row["audio_s_per_s_run"] = run_audio_s_per_s(reqs)
        steady = samples_of(reqs, window) if window else dict.fromkeys(names, NO_SAMPLES)
        rows.append(row | latency_ms(steady))
    if not rows:  # no server: the columns still, so that callers can select and group
        return pd.DataFrame(columns=_server_columns(audio))
    return pd.DataFrame(rows)


def _server_columns(audio: bool) -> list[str]:
    _, names = _latencies(audio)
    columns = ["letter", "block", "slot", "healthy", "requests", "failed", "output_tokens"]
    columns += ["timed_tokens", "output_tok_per_s", "output_tok_per_s_run"]
    if audio:
        columns += ["audio_s", "audio_s_per_s", "audio_s_per_s_run"]
    return columns + list(latency_ms(dict.fromkeys(names, NO_SAMPLES)))


def _latencies(audio: bool):
    """The steady latency samples of a load and their names: tokens', or a speech load's."""
    return (speech_samples, SPEECH_LATENCIES) if audio else (latency_samples, LATENCIES)


def _servers(requests: pd.DataFrame, servers: pd.DataFrame):
    """(server record, its requests, its steady window) in schedule order."""
    groups: Mapping = dict(list(requests.groupby(SERVER_KEY))) if len(requests) else {}
    for server in servers.sort_values(["block", "slot"]).itertuples(index=False):
        reqs = groups.get((server.letter, server.block, server.slot), requests.iloc[:0])
        yield server, reqs, steady_window(server)


def arm_summary(requests: pd.DataFrame, servers: pd.DataFrame, audio: bool = False) -> pd.DataFrame:
    """One row per arm (letter): throughputs are the mean over its servers; steady latency
    percentiles pool the steady samples of all its servers."""
    per_server = server_summary(requests, servers, audio)
    rates = ["output_tok_per_s", "output_tok_per_s_run"]
    rates += ["audio_s_per_s", "audio_s_per_s_run"] if audio else []
    counts = ["requests", "failed", "output_tokens", "timed_tokens"] + (
        ["audio_s"] if audio else []
    )
    samples_of, names = _latencies(audio)
    pooled: dict[str, dict[str, list]] = {}
    for server, reqs, window in _servers(requests, servers):
        samples = pooled.setdefault(server.letter, {m: [] for m in names})
        if window is not None:
            for metric, values in samples_of(reqs, window).items():
                samples[metric].append(values)
    rows = []
    for letter, group in per_server.groupby("letter", sort=False):
        samples = {m: np.concatenate([NO_SAMPLES, *v]) for m, v in pooled[letter].items()}
        rows.append(
            {"letter": letter, "servers": len(group)}
            | group[counts].sum().to_dict()
            | group[rates].mean().to_dict()
            | latency_ms(samples)
        )
    if not rows:  # no server: the columns still
        columns = ["letter", "servers", *counts, *rates]
        return pd.DataFrame(columns=columns + list(latency_ms(dict.fromkeys(names, NO_SAMPLES))))
    return pd.DataFrame(rows)

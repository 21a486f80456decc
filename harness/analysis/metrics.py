"""Request metrics, defined once (docs/METRICS.md): pure functions over the requests frame.

The requests frame has one row per `RequestRecord` (times in client seconds relative to the
slot's load start); the servers frame one row per `ServerRecord` (schema.py). Arms are told
apart by their letter. Warmup requests never count; latencies come from successful requests
only. Their distributions are latencies.py's; each server's and arm's figures server_figures.py's.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from harness.analysis.schema import SERVER_KEY

# OpenAI's response_format `pcm`, what /v1/audio/speech streams: 24 kHz, 16-bit, mono.
PCM_BYTES_PER_S = 24_000 * 2


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


Window = tuple[float, float] | None  # a server's steady window (start_s, end_s), or none


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

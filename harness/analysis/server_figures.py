"""The figures of each server and of each arm (docs/METRICS.md): the columns the comparison
pairs across arms (`figures`), one row per server (`server_summary`) and one per arm
(`arm_summary`). Pure functions over the requests and servers frames (schema.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.latencies import (
    LATENCIES,
    NO_SAMPLES,
    RATIOS,
    SPEECH_LATENCIES,
    latency_ms,
    latency_samples,
    speech_samples,
)
from harness.analysis.metrics import (
    audio_s,
    completed,
    failed,
    measured,
    run_audio_s_per_s,
    run_tok_per_s,
    steady_audio_s_per_s,
    steady_tok_per_s,
    steady_window,
    token_times,
)
from harness.analysis.schema import SERVER_KEY


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

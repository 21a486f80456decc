"""Metric definitions (docs/METRICS.md) on hand-built requests with answers worked out here."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from harness.analysis import latencies, metrics, server_figures
from harness.analysis.measurement import measure
from harness.analysis.schema import RequestRecord, ServerRecord


def request(index: int, times: list[float], send: float = 0.0, **kw) -> RequestRecord:
    """A successful request whose tokens arrive at `times`; it ends with its last token."""
    where = {"arm": "main", "letter": "A", "server": "A0", "block": 0, "slot": 0}
    sent = {"index": index, "warmup": False, "prompt_tokens": 8, "max_tokens": len(times)}
    first, last = (times[0], times[-1]) if times else (None, None)
    got = {"first_token_s": first, "end_s": last, "output_tokens": len(times), "status": 200}
    fields = where | sent | got | {"intended_send_s": send, "send_s": send, "token_times_s": times}
    return RequestRecord(**(fields | kw))


def server(slot: int = 0, start: float = 1.0, end: float = 3.0, **kw) -> ServerRecord:
    where = {"arm": "main", "letter": "A", "server": f"A{slot}", "block": 0, "slot": slot}
    process = {"port": 8000, "log": "s.log", "t0_unix": 0.0, "start_unix": 0.0, "healthy": True}
    fields = where | process | {"steady_start_s": start, "steady_end_s": end}
    return ServerRecord(**(fields | kw))


def frame(records) -> pd.DataFrame:
    return pd.DataFrame([asdict(r) for r in records])


REQUESTS = frame(
    [
        request(0, [0.5, 1.0, 1.5, 2.0], send=0.1),
        request(1, [1.2, 2.2, 3.2], send=1.0),
        request(2, [2.5], send=2.0),  # one token: no TPOT, no ITL
        request(3, [0.2, 0.3], send=0.0, warmup=True),
        request(4, [1.1, 1.4], send=0.9, status=500, error="HTTP 500"),
        request(5, [], send=1.5, status=0, error="connection reset"),
    ]
)


def test_ttft_tpot_e2e_per_request():
    rows = REQUESTS.iloc[:3]
    assert metrics.ttft_s(rows).tolist() == pytest.approx([0.4, 0.2, 0.5])
    assert metrics.e2e_s(rows).tolist() == pytest.approx([1.9, 2.2, 0.5])
    tpot = metrics.tpot_s(rows).tolist()
    assert tpot[:2] == pytest.approx([1.5 / 3, 2.0 / 2]) and np.isnan(tpot[2])


def test_itl_is_every_gap_between_consecutive_tokens():
    assert metrics.itl_s(REQUESTS.iloc[:3]).tolist() == pytest.approx([0.5, 0.5, 0.5, 1.0, 1.0])


def test_warmup_and_failures():
    assert metrics.measured(REQUESTS)["index"].tolist() == [0, 1, 2, 4, 5]
    assert metrics.failed(REQUESTS) == 2  # the warmup request does not count
    assert metrics.completed(REQUESTS)["index"].tolist() == [0, 1, 2]


def test_a_request_an_interruption_cut_is_neither_completed_nor_failed():
    """A guard's SIGTERM cut 16 requests in flight: they once read "failed requests
    16" and pointed at the server. They are counted apart (`cut`), as warmup is."""
    rows = frame(
        [
            request(0, [0.5, 1.0]),
            request(1, [1.1], status=200, error="interrupted"),  # cut mid-stream
            request(2, [], status=0, error="interrupted"),  # cut before its headers
            request(3, [], status=0, error="interrupted", warmup=True),
            request(4, [], status=503, error="HTTP 503"),
        ]
    )
    assert (metrics.failed(rows), metrics.cut(rows)) == (1, 2)
    assert metrics.completed(rows)["index"].tolist() == [0]
    assert (metrics.failed(REQUESTS), metrics.cut(REQUESTS)) == (2, 0)
    result = measure(rows, None, frame([server()]), "main", {})
    assert result.failed == 1
    assert "1 failed requests: see status/error in requests" in result.doubts
    assert (
        "2 requests cut in flight by the interruption: not completed, not counted as failed"
        in result.doubts
    )


def test_steady_tok_per_s_counts_arrivals_of_completed_requests_in_the_window():
    # in [1, 3]: 1.0, 1.5, 2.0 (request 0), 1.2, 2.2 (request 1), 2.5 (request 2); the
    # failed request's 1.1 and 1.4 do not count
    assert metrics.steady_tok_per_s(REQUESTS, (1.0, 3.0)) == pytest.approx(6 / 2.0)
    assert np.isnan(metrics.steady_tok_per_s(REQUESTS, None))
    assert metrics.steady_window(server(start=3.0, end=3.0)) is None
    assert metrics.steady_window(server(start=None)) is None


def test_run_tok_per_s_counts_every_token_over_the_whole_load():
    # every succeeded request, warmup included: 4 + 3 + 1 + 2 tokens; first send 0.0 (the
    # warmup request), last end 3.2
    assert metrics.run_tok_per_s(REQUESTS) == pytest.approx(10 / 3.2)


def test_whole_load_tok_per_s_is_unbiased_where_warmup_overlaps_the_measured_run():
    """Two streams at exactly 10 tok/s each; the first request of each is warmup and runs
    while measured requests already run. Counting only measured tokens over the measured
    requests' span (the old figure) gives less than 20; every token over the whole load
    gives 20."""
    rows = []
    for stream in range(2):
        for k in range(4):
            start = stream * 0.05 + k * 1.0
            times = [start + 0.1 * (j + 1) for j in range(10)]
            rows.append(request(stream * 4 + k, times, send=start, warmup=k == 0 and stream == 0))
    load = frame(rows)
    span = load["end_s"].max() - load["send_s"].min()
    assert metrics.run_tok_per_s(load) == pytest.approx(80 / span)
    assert metrics.run_tok_per_s(load) == pytest.approx(20.0, rel=0.02)
    measured = metrics.measured(load)
    old = measured["output_tokens"].sum() / (measured["end_s"].max() - measured["send_s"].min())
    assert old < 19.5


def test_steady_latencies_keep_only_what_happened_in_the_window():
    # window [1, 3]: request 1 (sent 1.0, ended 3.2) ends after it; request 2 (2.0 .. 2.5) is
    # inside; request 0 was sent before it. ITL gaps with both arrivals inside: 1.0 -> 1.5,
    # 1.5 -> 2.0 (request 0) and 1.2 -> 2.2 (request 1).
    samples = latencies.latency_samples(REQUESTS, (1.0, 3.0))
    assert samples["ttft"].tolist() == pytest.approx([0.5])
    assert samples["e2e"].tolist() == pytest.approx([0.5])
    assert sorted(samples["itl"].tolist()) == pytest.approx([0.5, 0.5, 1.0])
    whole = latencies.latency_samples(REQUESTS)
    assert len(whole["ttft"]) == 3 and len(whole["itl"]) == 5


def test_distribution_quantiles_interpolate_linearly():
    stats = latencies.distribution(np.arange(1.0, 102.0))
    assert stats == pytest.approx({"p50": 51.0, "p90": 91.0, "p99": 100.0, "mean": 51.0})
    assert all(np.isnan(v) for v in latencies.distribution(np.array([np.nan])).values())


def test_server_summary_one_row_per_server_in_schedule_order():
    other = REQUESTS.iloc[:2].assign(slot=1, letter="B", server="B1")  # server 1 is arm B's
    requests = pd.concat([REQUESTS, other], ignore_index=True)
    servers = frame([server(slot=1, letter="B"), server(slot=0), server(slot=2, healthy=False)])
    summary = server_figures.server_summary(requests, servers)
    assert summary["slot"].tolist() == [0, 1, 2]
    assert summary["requests"].tolist() == [5, 2, 0]
    assert summary["failed"].tolist() == [2, 0, 0]
    assert summary["output_tok_per_s"].tolist()[:2] == pytest.approx([3.0, 2.5])
    # steady window [1, 3]: request 2 alone was sent and ended inside it; ITL gaps inside
    # it are 0.5, 0.5 (request 0) and 1.0 (request 1)
    assert summary.loc[0, "ttft_p50_ms"] == pytest.approx(500.0)
    assert summary.loc[0, "itl_mean_ms"] == pytest.approx(2.0 / 3 * 1e3)
    assert np.isnan(summary.loc[2, "output_tok_per_s"])  # no requests, no figure


def test_arm_summary_pools_requests_and_averages_server_rates():
    slow = frame(
        [request(i, [0.6 + i, 1.0 + i], send=0.5 + i, slot=1, server="A1") for i in range(3)]
    )
    requests = pd.concat([REQUESTS, slow], ignore_index=True)
    servers = frame([server(slot=0), server(slot=1, start=1.0, end=4.0)])
    per_server = server_figures.server_summary(requests, servers)
    per_arm = server_figures.arm_summary(requests, servers)
    assert len(per_arm) == 1 and per_arm.loc[0, "requests"] == 8
    assert per_arm.loc[0, "output_tok_per_s"] == pytest.approx(
        per_server["output_tok_per_s"].mean()
    )
    # steady TTFTs pooled: 0.5 (slot 0: request 2) and 0.1, 0.1 (slot 1: the requests sent
    # at 1.5 and 2.5) -> p50 0.1; the servers' own p50s are 0.5 and 0.1
    assert per_arm.loc[0, "ttft_p50_ms"] == pytest.approx(100.0)
    assert per_server["ttft_p50_ms"].mean() == pytest.approx(300.0)


def test_parquet_round_trip_keeps_the_metrics(tmp_path):
    path = tmp_path / "requests.parquet"
    REQUESTS.to_parquet(path)
    back = pd.read_parquet(path)
    assert metrics.itl_s(back).tolist() == pytest.approx(metrics.itl_s(REQUESTS).tolist())
    ms = latencies.latency_ms(latencies.latency_samples(REQUESTS))
    assert latencies.latency_ms(latencies.latency_samples(back)) == pytest.approx(ms, nan_ok=True)


def test_figures_declare_their_direction():
    by_name = {f.name: f for f in server_figures.figures() + server_figures.figures(audio=True)}
    assert by_name["output_tok_per_s"].higher_is_better
    assert by_name["audio_s_per_s"].higher_is_better
    assert not by_name["ttft_p99_ms"].higher_is_better
    assert not by_name["ttfa_p99_ms"].higher_is_better and not by_name["rtf_p50"].higher_is_better
    assert server_figures.figures(audio=True)[0].name == "audio_s_per_s"
    assert "audio_s_per_s" not in {f.name for f in server_figures.figures()}


def speech(index: int, pieces: list[tuple[float, int]], send: float = 0.0, **kw):
    """A successful speech request whose PCM pieces (time, bytes) arrive as given."""
    times, sizes = [t for t, _ in pieces], [b for _, b in pieces]
    return request(
        index, [], send=send, first_token_s=times[0] if times else None,
        end_s=times[-1] if times else send, audio_times_s=times, audio_bytes=sizes, **kw,
    )  # fmt: skip


def test_audio_seconds_ttfa_and_rtf_from_the_bytes_received():
    second = metrics.PCM_BYTES_PER_S
    rows = frame(
        [
            speech(0, [(0.5, second // 2), (1.5, second), (2.5, second // 2)], send=0.0),
            speech(1, [(1.2, second), (2.0, second)], send=1.0),
            speech(2, [], send=1.0),  # no audio: no TTFA, no RTF
            speech(3, [(1.1, second)], send=0.5, status=500, error="HTTP 500"),
        ]
    )
    assert metrics.audio_s(rows).tolist() == pytest.approx([2.0, 2.0, 0.0, 1.0])
    rtf = metrics.rtf(rows).tolist()
    assert rtf[:2] == pytest.approx([2.5 / 2.0, 1.0 / 2.0]) and np.isnan(rtf[2])
    # in [1, 2]: 1.5 (1 s), 1.2 (1 s), 2.0 (1 s); the failed request's 1.1 does not count
    assert metrics.steady_audio_s_per_s(rows, (1.0, 2.0)) == pytest.approx(3.0)
    assert np.isnan(metrics.steady_audio_s_per_s(rows, None))
    # succeeded audio 4 s over the whole load: first send (0.0) to last end (2.5)
    assert metrics.run_audio_s_per_s(rows) == pytest.approx(4.0 / 2.5)
    whole = latencies.latency_ms(latencies.speech_samples(rows))
    assert whole["ttfa_p50_ms"] == pytest.approx(350.0)  # TTFAs 0.5 and 0.2
    summary = server_figures.server_summary(rows, frame([server(start=1.0, end=2.0)]), audio=True)
    assert summary.loc[0, "audio_s_per_s"] == pytest.approx(3.0)
    assert summary.loc[0, "audio_s"] == pytest.approx(4.0)
    # steady window [1, 2]: request 1 alone (sent 1.0, ended 2.0) has audio inside it
    assert summary.loc[0, "ttfa_p50_ms"] == pytest.approx(200.0)
    assert summary.loc[0, "rtf_p50"] == pytest.approx(0.5)

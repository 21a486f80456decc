"""GET /metrics (engine/api/metrics.py, docs/API.md): the API process's tallies in the
Prometheus text format, read back with prometheus_client's own parser (INVARIANTS 67)."""

from __future__ import annotations

import http.client

import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.api.metrics import ITL_S, EngineMetrics
from engine.api.worker_client import WorkerClient
from engine.messages import AddRequest, StepFrames, TokenFrame, WorkerStats


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """(sample name, its labels but model_name) -> value."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))
            out[(s.name, labels)] = s.value
    return out


def test_tallies_render_as_counters_histograms_and_the_pools_gauges(monkeypatch):
    clock = iter([10.5, 10.503, 10.504, 20.0, 20.1, 30.0])
    monkeypatch.setattr("engine.api.metrics.perf_counter", lambda: next(clock))
    metrics = EngineMetrics("m")
    first = metrics.request(prompt_tokens=7, arrival=10.0)
    first.frame(1)  # 10.5: TTFT 0.5 s
    first.frame(2)  # 10.503: a 3 ms gap
    first.frame(1)  # 10.504: 1 ms
    first.finish("length")
    first.finish("abort")  # counted once, by the reason it ended with
    cut = metrics.request(prompt_tokens=3, arrival=19.0)
    cut.frame(1)  # 20.0
    cut.finish("abort")
    metrics.step(open_streams=2)  # 20.1: the first message: no interval yet
    metrics.step(open_streams=0)  # 30.0: 9.9 s, requests open throughout
    pool = WorkerStats(
        free_pages=30, total_pages=40, free_slots=1, total_slots=4, running=3, waiting=2
    )
    got = samples(metrics.render(pool, in_flight=5).decode())
    assert got[("engine:prompt_tokens_total", ())] == 10
    assert got[("engine:generation_tokens_total", ())] == 5
    assert got[("engine:request_success_total", (("finished_reason", "length"),))] == 1
    assert got[("engine:request_success_total", (("finished_reason", "abort"),))] == 1
    assert got[("engine:time_to_first_token_seconds_count", ())] == 2
    assert got[("engine:time_to_first_token_seconds_sum", ())] == pytest.approx(1.5)
    itl = "engine:inter_token_latency_seconds"
    assert got[(itl + "_count", ())] == 2
    assert got[(itl + "_bucket", (("le", "0.002"),))] == 1  # 1 ms <= 2 ms; 3 ms is not
    assert got[(itl + "_bucket", (("le", "0.004"),))] == 2
    assert got[(itl + "_bucket", (("le", "+Inf"),))] == 2
    assert got[("engine:e2e_request_latency_seconds_count", ())] == 2
    assert got[("engine:request_time_per_output_token_seconds_sum", ())] == pytest.approx(0.004 / 3)
    assert got[("engine:step_interval_seconds_sum", ())] == pytest.approx(9.9)
    assert got[("engine:num_requests_running", ())] == 3
    assert got[("engine:num_requests_waiting", ())] == 2
    assert got[("engine:kv_cache_usage_perc", ())] == 0.25
    assert got[("engine:kv_pages_used", ())] == 10
    assert got[("engine:state_slots_used", ())] == 3
    assert got[("engine:api_requests_in_flight", ())] == 5
    # no pool (the worker did not answer): the API process's own metrics still render
    assert ("engine:num_requests_running", ()) not in samples(metrics.render(None, 0).decode())
    assert ITL_S == tuple(sorted(ITL_S))


def test_frames_are_timed_as_the_worker_client_reads_them_not_as_a_handler_drains_them(
    monkeypatch, tmp_path
):
    """Two steps' frames read 4 ms apart and drained together later (a handler behind, its
    queue holding both): the inter-token latency is the 4 ms between the worker's messages,
    not the ~0 between the handler's reads; a frame of no tokens (an end) is not a frame."""
    clock = iter([1.0, 1.004])
    monkeypatch.setattr("engine.api.metrics.perf_counter", lambda: next(clock))
    metrics = EngineMetrics("m")
    tally = metrics.request(prompt_tokens=4, arrival=0.9)
    client = WorkerClient(str(tmp_path))
    try:
        rid, queue = client.submit(lambda rid: AddRequest(rid, [1, 2, 3, 4], 3), tally.frame)
        client._route(StepFrames([TokenFrame(rid, [7])]))
        client._route(StepFrames([TokenFrame(rid, [8, 9])]))
        client._route(StepFrames([TokenFrame(rid, [], finish_reason="length")]))
    finally:
        client.close()
    assert [queue.get_nowait().tokens for _ in range(3)] == [[7], [8, 9], []]
    got = samples(metrics.render(None, 0).decode())
    assert got[("engine:time_to_first_token_seconds_sum", ())] == pytest.approx(0.1)
    assert got[("engine:inter_token_latency_seconds_count", ())] == 1
    assert got[("engine:inter_token_latency_seconds_sum", ())] == pytest.approx(0.004)
    assert got[("engine:generation_tokens_total", ())] == 3


def _scrape(port: int) -> tuple[str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    resp = conn.getresponse()
    text = resp.read().decode()
    conn.close()
    assert resp.status == 200
    return resp.getheader("Content-Type"), samples(text)


@pytest.mark.slow
def test_a_streamed_reply_moves_the_servers_counters_by_its_tokens(tiny_server):
    tiny_server.wait_idle()
    content_type, before = _scrape(tiny_server.port)
    assert content_type.startswith("text/plain") and "version=" in content_type
    prompt = [5, 6, 7, 8, 9, 10]
    events = tiny_server.stream(prompt=prompt, max_tokens=5, ignore_eos=True)
    status, _ = tiny_server.complete(prompt=prompt[:2], max_tokens=3, ignore_eos=True)
    assert status == 200 and events[-1]["usage"]["completion_tokens"] == 5
    _, after = _scrape(tiny_server.port)

    def delta(name: str, labels: tuple = ()) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert delta("engine:generation_tokens_total") == 8
    assert delta("engine:prompt_tokens_total") == 8
    assert delta("engine:request_success_total", (("finished_reason", "length"),)) == 2
    assert delta("engine:time_to_first_token_seconds_count") == 2
    assert delta("engine:e2e_request_latency_seconds_count") == 2
    frames = sum(1 for e in events if e["choices"][0].get("token_ids"))
    assert delta("engine:inter_token_latency_seconds_count") >= frames - 1
    assert after[("engine:kv_pages_total", ())] == 512  # the fixture's engine.kv_pages
    assert after[("engine:num_requests_running", ())] == 0

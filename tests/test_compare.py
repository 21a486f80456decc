"""The comparison end to end on a synthetic ABBA run whose answer is set by construction."""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest
from rich.console import Console

from harness.analysis import phases
from harness.analysis.compare import compare
from harness.analysis.comparison import Comparison
from harness.analysis.schema import RequestRecord, ServerRecord, Slot, SpanRecord
from harness.analysis.verdict import FASTER, NO_CHANGE, NOT_ENOUGH, ONE_BLOCK, SLOWER
from harness.show.comparison import render
from harness.show.format import verdict_words

STREAMS, TOKENS, RUN_S, WINDOW = 4, 20, 6.0, (1.0, 5.0)
LABELS = {"A": "main 9c05c56", "B": "working tree"}


def run(
    blocks=4, ratio=0.9, work_ratio=0.92, noise=0.01, seed=0, arms=("main", "pr"), order="ABBA"
):
    """Frames of a closed-loop run: each server's tokens arrive every `itl` seconds on each of
    STREAMS streams, so its throughput is STREAMS / itl; arm B's is `ratio` times arm A's and
    its postprocess work `work_ratio` times A's. Returns frames and the true tok/s per server."""
    rng = np.random.default_rng(seed)
    requests, spans, servers, truth = [], [], [], []
    for block in range(blocks):
        for number, letter in enumerate(order):
            where = Slot(arms[letter == "B"], letter, f"{letter}{number}", block, number)
            rate = 1000.0 * (ratio if letter == "B" else 1.0) * math.exp(rng.normal(0, noise))
            truth.append(rate)
            requests += _requests(where, itl=STREAMS / rate)
            work = 0.4 * (work_ratio if letter == "B" else 1.0) * math.exp(rng.normal(0, noise))
            spans += _spans(where, work_ms=work)
            facts = {"port": 8000 + number, "log": f"{block}-{number}.log", "healthy": True}
            window = {"steady_start_s": WINDOW[0], "steady_end_s": WINDOW[1]}
            servers.append(
                ServerRecord(**asdict(where), **facts, **window, t0_unix=0.0, start_unix=0.0)
            )
    frames = [pd.DataFrame([asdict(r) for r in rows]) for rows in (requests, spans, servers)]
    return *frames, truth


def _requests(where: Slot, itl: float) -> list[RequestRecord]:
    out = []
    for stream in range(STREAMS):
        send, index = stream * itl / STREAMS, 0
        while send < RUN_S:
            times = [send + itl * (k + 1) for k in range(TOKENS)]
            position = {"index": index * STREAMS + stream, "warmup": index == 0}
            sent = {"prompt_tokens": 32, "max_tokens": TOKENS, "intended_send_s": send}
            got = {"first_token_s": times[0], "end_s": times[-1], "output_tokens": TOKENS}
            stream_facts = {"send_s": send, "token_times_s": times, "status": 200}
            out.append(RequestRecord(**asdict(where), **position, **sent, **got, **stream_facts))
            send, index = times[-1], index + 1
    return out


def _spans(where: Slot, work_ms: float) -> list[SpanRecord]:
    per_iter = {  # ms per iteration
        "worker.iter_total": 3.0,
        "worker.postprocess_batch": work_ms + 0.2 + 0.05,
        "worker.step.completion_wait": 0.2,
        "worker.postprocess.prematerialize": 0.05,
        "worker.msg.add_request": 0.3,
        "worker.msg.add_request.engine": 0.1,
    }
    rows = []
    for window in range(10):
        first = window * 100 + 1
        iterations = {"first_iter": first, "last_iter": first + 99, "iterations": 100}
        for name, ms in per_iter.items():
            n = 10 if name.startswith("worker.msg") else 100
            values = {"n": n, "sum": ms * 100 * 1e6, "p50": 0.0, "p95": 0.0, "max": 0.0}
            kind = {"name": name, "kind": "span", "mean_batch": 30.0}
            rows.append(SpanRecord(**asdict(where), **kind, **iterations, **values))
    return rows


def row(result: Comparison, figure: str):
    return next(f for f in result.figures if f.figure == figure)


def phase(result: Comparison, name: str):
    return next(p for p in result.phases if p.name == name)


@pytest.fixture(scope="module")
def slower():
    requests, spans, servers, truth = run()
    return compare(requests, spans, servers, LABELS), truth


def test_ten_percent_slower_throughput(slower):
    result, truth = slower
    headline = row(result, "output_tok_per_s")
    assert headline.change.verdict == SLOWER and result.regression
    assert headline.change.low <= 0.9 <= headline.change.high
    assert result.blocks == 4 and headline.change.blocks == 4
    # per-server values in schedule order: A A | B B per block of A B B A
    expected_a = [t for i, t in enumerate(truth) if "ABBA"[i % 4] == "A"]
    expected_b = [t for i, t in enumerate(truth) if "ABBA"[i % 4] == "B"]
    assert headline.servers_a == pytest.approx(expected_a, rel=2e-3)
    assert headline.servers_b == pytest.approx(expected_b, rel=2e-3)
    assert headline.a == pytest.approx(np.mean(expected_a), rel=2e-3)


def test_latencies_move_the_other_way(slower):
    result, _ = slower
    ttft = row(result, "ttft_p50_ms")
    assert not ttft.higher_is_better and ttft.change.verdict == SLOWER
    assert ttft.change.low <= 1 / 0.9 <= ttft.change.high
    assert row(result, "tpot_p50_ms").change.verdict == SLOWER


def test_phase_and_message_tables(slower):
    result, _ = slower
    work = phase(result, phases.POSTPROCESS_WORK)
    assert work.change.verdict == FASTER
    assert work.change.low <= 0.92 <= work.change.high
    assert work.a_ms == pytest.approx(0.4, rel=0.03)
    assert phase(result, "worker.iter_total").change.verdict == NO_CHANGE
    messages = {m.name: m for m in result.messages}
    assert messages["worker.msg.add_request"].a_ms == pytest.approx(3.0)  # 30 ms per 10 requests
    assert messages["worker.msg.add_request.engine"].parent == "worker.msg.add_request"
    assert result.postprocess_waits == list(phases.POSTPROCESS_WAITS)


def test_result_is_json_and_renders(slower):
    result, _ = slower
    data = json.loads(json.dumps(result.to_json(), allow_nan=False))
    assert data["regression"] is True and data["labels"] == LABELS
    assert data["figures"][0]["change"]["verdict"] == SLOWER
    console = Console(record=True, width=240)
    console.print(render(result))
    text = console.export_text()
    assert "working tree" in text and "slower" in text and " / " in text
    assert not result.doubts


def test_a_a_run_of_one_arm_is_no_change():
    requests, spans, servers, _ = run(ratio=1.0, work_ratio=1.0, arms=("main", "main"), seed=3)
    result = compare(requests, spans, servers, {"A": "main", "B": "main"})
    assert row(result, "output_tok_per_s").change.verdict == NO_CHANGE
    assert not result.regression


def test_external_arm_without_spans():
    requests, spans, servers, _ = run(seed=1)
    spans = spans[spans["arm"] == "main"]
    result = compare(requests, spans, servers, LABELS, external={"B"})
    work = phase(result, phases.POSTPROCESS_WORK)
    assert work.b_ms is None and work.change.verdict == NOT_ENOUGH
    assert any("no spans from arm B (none expected" in d for d in result.doubts)
    none = compare(requests, None, servers, LABELS)
    assert not none.phases and not none.messages
    assert sum("no spans from arm" in d for d in none.doubts) == 2


def test_failures_and_an_unhealthy_server_are_doubts():
    requests, spans, servers, _ = run(seed=2)
    failing = requests.index[(requests["slot"] == 1) & ~requests["warmup"]][:3]
    requests.loc[failing, "status"] = 500
    requests.loc[failing, "error"] = "HTTP 500"
    servers.loc[2, ["healthy", "error"]] = [False, "exited with code 1"]
    result = compare(requests, spans, servers, LABELS)
    assert any(d.startswith("3 failed requests in arm B") for d in result.doubts)
    assert any("exited with code 1" in d for d in result.doubts)
    assert [s.failed for s in result.servers][:4] == [0, 3, 0, 0]


def test_one_block_gives_its_interval_and_no_verdict():
    """INVARIANTS 50: a clear 10% slowdown in one block is "not enough data", never a
    regression (exit 0), and a doubt says why and how many blocks to run."""
    requests, spans, servers, _ = run(blocks=1, ratio=0.9, noise=0.005, seed=4)
    result = compare(requests, spans, servers, LABELS)
    headline = row(result, "output_tok_per_s")
    assert headline.change.method == ONE_BLOCK and result.blocks == 1
    assert headline.change.high < 0.95 and headline.change.verdict == NOT_ENOUGH
    assert not result.regression
    changes = [f.change for f in result.figures] + [p.change for p in result.phases]
    assert all(c.verdict == NOT_ENOUGH for c in changes)
    doubt = next(d for d in result.doubts if d.startswith("1 block with both arms"))
    assert "position" in doubt and "--blocks 2 or more" in doubt
    assert not any(d.startswith("too noisy") for d in result.doubts)


def test_one_block_asks_for_two_blocks_not_its_own_estimate():
    """INVARIANTS 50: one block's spread, over 2 degrees of freedom, cannot say how many blocks
    a verdict needs: a run on the H200 read "rerun with --blocks 290 or more" from its postprocess
    work's one-block spread. The doubt asks for MIN_BLOCKS; the headline's estimate alone,
    when larger, is a hint said to be rough; postprocess work's is not quoted."""
    requests, spans, servers, _ = run(blocks=1, ratio=1.0, noise=0.05, seed=3)
    work = spans["name"] == "worker.postprocess_batch"
    spans.loc[work, "sum"] = spans.loc[work, "sum"] * np.repeat([1.0, 3.0, 0.4, 2.0], 10)
    result = compare(requests, spans, servers, LABELS)
    headline = row(result, "output_tok_per_s").change.blocks_needed
    work_needed = phase(result, phases.POSTPROCESS_WORK).change.blocks_needed
    assert headline > 2 and work_needed != headline
    (doubt,) = [d for d in result.doubts if d.startswith("1 block with both arms")]
    assert "rerun with --blocks 2 or more, or add blocks to this run" in doubt
    assert doubt.endswith(f"too rough to say how many a decisive verdict needs (the headline's,"
                          f" over 2 degrees of freedom, hints at about {headline})")  # fmt: skip
    assert str(work_needed) not in doubt


def test_noisy_run_asks_for_more_blocks():
    requests, spans, servers, _ = run(blocks=3, ratio=1.0, noise=0.08, seed=5)
    result = compare(requests, spans, servers, LABELS)
    assert row(result, "output_tok_per_s").change.verdict == NOT_ENOUGH
    assert any("too noisy" in d and "blocks in all" in d for d in result.doubts)


def test_tokens_without_arrival_times_are_a_doubt():
    requests, spans, servers, _ = run(seed=6)
    requests["output_tokens"] += 5  # the server counted tokens the stream did not time
    result = compare(requests, spans, servers, LABELS)
    assert any("have no arrival time" in d for d in result.doubts)


def test_an_untimed_arm_is_expected_to_have_no_spans():
    from harness.analysis.summary import summarize

    requests, spans, servers, _ = run(seed=1)
    spans = spans[spans["letter"] == "A"]
    manifest = {
        "arms": [
            {"letter": "A", "name": "timing on", "kind": "worktree"},
            {"letter": "B", "name": "timing off", "kind": "worktree"},
        ],
        "scenario": {"headline": "output_tok_per_s"},
        "untimed": ["B"],
        "margin": 0.02,
        "complete": True,
    }
    frames = {"requests": requests, "spans": spans, "servers": servers}
    result = summarize(manifest, frames)
    assert any("no spans from arm B (none expected" in d for d in result.doubts)
    assert result.rule.margin == 0.02


def test_blocks_needed_are_the_headlines_not_the_noisiest_spans():
    """Defect 6: "rerun with about 105 blocks" came from the noisiest span of the table. The
    doubt names the headline (and postprocess work) and their own estimate only."""
    requests, spans, servers, _ = run(blocks=3, ratio=1.0, noise=0.08, seed=5)
    rng = np.random.default_rng(0)
    noisy = spans["name"] == "worker.msg.add_request"
    spans.loc[noisy, "sum"] = spans.loc[noisy, "sum"] * np.exp(rng.normal(0, 1.0, noisy.sum()))
    result = compare(requests, spans, servers, LABELS)
    headline = row(result, "output_tok_per_s").change
    work = phase(result, phases.POSTPROCESS_WORK).change
    (doubt,) = [d for d in result.doubts if "too noisy" in d]
    assert doubt.startswith("too noisy to decide: output tok/s (steady), postprocess work (the")
    spread = [f"{v[0]} {max(v[1]) / min(v[1]) - 1:.1%}" for v in
              (("A", row(result, "output_tok_per_s").servers_a),
               ("B", row(result, "output_tok_per_s").servers_b))]  # fmt: skip
    assert f"servers spread {', '.join(spread)} max/min within an arm" in doubt
    needed = max(headline.blocks_needed, work.blocks_needed)
    assert f"about {needed} blocks in all" in doubt
    assert phase(result, "worker.msg.add_request").change.verdict == "not enough data"
    assert phase(result, "worker.msg.add_request").change.blocks_needed is None


def test_a_speech_load_is_compared_on_its_audio():
    """Each token's arrival made a PCM piece of 0.1 s of audio: the audio-seconds/s figure is
    a tenth of the tok/s and moves with it; the token figures are left out."""
    requests, spans, servers, _ = run(seed=6)
    tokens = compare(requests, spans, servers, LABELS)
    requests["audio_times_s"] = requests["token_times_s"]
    requests["audio_bytes"] = requests["token_times_s"].map(lambda t: [4800] * len(t))
    result = compare(requests, spans, servers, LABELS, audio=True, headline="audio_s_per_s")
    audio, tok_s = row(result, "audio_s_per_s"), row(tokens, "output_tok_per_s")
    assert audio.a == pytest.approx(tok_s.a / 10.0)
    assert audio.change.verdict == tok_s.change.verdict == SLOWER and result.regression
    assert {f.figure for f in result.figures} >= {"ttfa_p50_ms", "rtf_p99", "e2e_p50_ms"}
    assert "output_tok_per_s" not in {f.figure for f in result.figures}


def test_steady_windows_too_short_for_a_whole_request_say_so():
    """No request sent and ended inside any steady window: the latency rows have no samples
    (not enough data), and a doubt says why and what to do, while throughput stands."""
    requests, spans, servers, _ = run(seed=7)
    servers["steady_end_s"] = servers["steady_start_s"] + 0.05  # a request takes 0.08 s
    result = compare(requests, spans, servers, LABELS)
    assert row(result, "ttft_p50_ms").a is None or math.isnan(row(result, "ttft_p50_ms").a)
    assert any(
        "no request was both sent and ended inside a steady window" in d for d in result.doubts
    )
    assert not math.isnan(row(result, "output_tok_per_s").a)


def test_a_missing_error_beside_a_failed_server_is_no_error():
    """An error column of NaN (a table mixing failed and healthy slots) names no error."""
    requests, spans, servers, _ = run(seed=8)
    servers["error"] = pd.Series(np.nan, index=servers.index, dtype=object)
    servers.loc[2, ["healthy", "error"]] = [False, "interrupted"]
    result = compare(requests, spans, servers, LABELS)
    assert any("slot 2: interrupted" in d for d in result.doubts)
    assert not any(": nan" in d for d in result.doubts)


def test_interference_beside_one_arm_withholds_the_verdict():
    """INVARIANTS 66 / issue 34 item 5: a neighbour that took CPU beside B's servers alone is
    a doubt that withholds the verdict (exit 5, never 1), unless the run allows it."""
    requests, spans, servers, _ = run(blocks=2, ratio=0.80, noise=0.01, seed=7)
    busy = servers.assign(
        outside_cpu_share=np.where(servers["letter"] == "B", 0.30, 0.05),
        outside_cpu_cores=np.where(servers["letter"] == "B", 0.60, 0.10),
        machine_cpus=2,
    )
    result = compare(requests, spans, busy, LABELS)
    assert row(result, "output_tok_per_s").change.verdict == SLOWER
    assert result.withheld and not result.regression
    assert any(d.startswith("interference: ") for d in result.doubts)
    assert verdict_words(result).endswith("(interference)")
    allowed = compare(requests, spans, busy, LABELS, allow_interference=True)
    assert allowed.regression and not allowed.withheld
    quiet = servers.assign(outside_cpu_share=0.05, outside_cpu_cores=0.10, machine_cpus=2)
    assert compare(requests, spans, quiet, LABELS).interference is None

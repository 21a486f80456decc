"""Reports from recorded runs: the markdown's numbers against the synthetic rows they came from,
the plots as real PNGs, the HTML self-contained, and `bench compare` over two runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from harness.cli import app
from harness.records import RequestRecord, ServerRecord, SpanRecord
from harness.report import write_report
from harness.report.style import DPI, WIDTH_IN
from harness.results import RunDir

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
ARMS = [
    {"letter": "A", "name": "main", "kind": "ref", "spec": "main", "commit": "9c05c56" * 5 + "ab",
     "dirty": False, "diff_hash": None, "overrides": {}, "url": None, "tree": "/wt"},
    {"letter": "B", "name": "pr", "kind": "worktree", "spec": "worktree", "commit": "9c05c56" * 5 + "ab",
     "dirty": True, "diff_hash": "c05ef4fd612d3e7b", "overrides": {"engine.mixing": True},
     "url": None, "tree": "/work"},
]  # fmt: skip


def write_run(path: Path, rates: list[float], letters: str = "ABBA", spans: bool = True,
              failed: int = 0, arms: list[dict] = ARMS, run_id: str = "run") -> dict:  # fmt: skip
    """A recorded run: server i (schedule order) streams STREAMS requests at a time whose tokens
    arrive every STREAMS / rates[i] seconds; arm B's spans take SPANS_MS[name][1] ms per
    iteration times (1 + slot / 100). The first `failed` measured requests of server 1 fail.
    Returns the rows, for the test to compute its own expectations."""
    run = RunDir(path)
    run.write_manifest({
        "run_id": run_id, "command": "bench run qwen35 -c 4 --abba", "aa_check": False,
        "scenario": {"name": "qwen35", "size": "tiny", "headline": "output_tok_per_s",
                     "engine": {}, "load": {}, "model": {}},
        "arms": arms, "schedule": list(letters * (len(rates) // len(letters))),
        "concurrency": STREAMS, "requests": None, "duration_s": RUN_S, "warmup": STREAMS,
        "period": ITERS, "complete": True,
        "machine": {"cpu": "x86_64", "cpus": 2, "gpu": None, "host": "ci"},
    })  # fmt: skip
    rows = {"requests": [], "spans": [], "servers": []}
    for i, rate in enumerate(rates):
        block, slot = divmod(i, len(letters))
        letter = letters[slot]
        arm = next(a["name"] for a in arms if a["letter"] == letter)
        t0 = 1000.0 + 100 * i
        requests = _requests(arm, block, slot, STREAMS / rate, failed if i == 1 else 0)
        span_rows = _spans(arm, block, slot, letter, t0) if spans else []
        server = ServerRecord(arm, block, slot, letter, 9000 + i, f"logs/{i}.log", t0, t0 - 1,
                              healthy=True, requests=len(requests),
                              steady_start_s=STEADY[0], steady_end_s=STEADY[1])  # fmt: skip
        run.append_slot(requests, span_rows, server)
        rows["requests"] += requests
        rows["spans"] += span_rows
        rows["servers"].append(server)
    return rows


def _requests(arm, block, slot, itl, failed) -> list[RequestRecord]:
    out = []
    for stream in range(STREAMS):
        send, k = stream * itl / STREAMS, 0
        while send < RUN_S:
            times = [send + itl * (j + 1) for j in range(TOKENS)]
            warmup = k == 0
            bad = not warmup and failed > 0
            failed -= bad
            out.append(RequestRecord(
                arm, block, slot, k * STREAMS + stream, warmup, 16, TOKENS, send, send,
                None if bad else times[0], None if bad else times[-1], 0 if bad else TOKENS,
                [] if bad else times, 500 if bad else 200, "HTTP 500" if bad else None,
            ))  # fmt: skip
            send, k = times[-1], k + 1
    return out


def _spans(arm, block, slot, letter, t0) -> list[SpanRecord]:
    rows, scale = [], 1 + slot / 100
    for w in range(WINDOWS):
        first, start, end = w * ITERS + 1, t0 + w, t0 + w + 1
        for name, ms in (SPANS_MS | MESSAGES_MS).items():
            n = 10 if name.startswith("worker.msg") else ITERS
            total = ms[letter == "B"] * scale * ITERS * 1e6
            rows.append(SpanRecord(arm, block, slot, "w0", name, "span", first, first + ITERS - 1,
                                   ITERS, 3.0, n, total, 0, 0, 0, start, end))  # fmt: skip
        rows.append(SpanRecord(arm, block, slot, "w0", "worker.rows_per_step", "count", first,
                               first + ITERS - 1, ITERS, 3.0, ITERS, 3.5 * ITERS, 3, 4, 4,
                               start, end))  # fmt: skip
    return rows


# --- what the test expects, computed from the rows alone ---------------------------------------


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


# --- tests ---------------------------------------------------------------------------------------

RATES = [1000.0, 900.0, 902.0, 1004.0, 990.0, 893.0, 895.0, 994.0]  # ABBA ABBA: B 10% slower


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    rows = write_run(root / "run", RATES, failed=2)
    results = root / "results"
    (results / "calibration").mkdir(parents=True)
    (results / "calibration" / "latest.json").write_text(json.dumps(
        {"latency": {"tokens_per_s_per_core": 1800.0}, "settings": {"shards": 1}, "unix_time": 0}))  # fmt: skip
    (results / "power").mkdir()
    (results / "power" / "qwen35.json").write_text(json.dumps({  # as harness/power.py writes
        "scenario": "qwen35", "blocks": 5, "quoted_blocks": 5, "concurrency": 64,
        "false_positive_rate": {"output_tok_per_s": 0.04, "ttft_p50_ms": 0.05},
        "min_detectable_slowdown": {"output_tok_per_s": 0.03}, "noise": {"output_tok_per_s": 0.012},
    }))  # fmt: skip
    path = write_report(root / "run", html=True, results=results)
    return path, path.read_text(), rows


def test_setup_line_and_headline(report):
    _, md, rows = report
    setup = next(line for line in md.splitlines() if line.startswith("Setup: "))
    assert "CPU (x86_64, 2 cores)" in setup and "qwen35 tiny" in setup and "c=4" in setup
    assert "ABBA × 2" in setup and "4 / 4 servers (A / B)" in setup
    measured = sum(not r.warmup for r in rows["requests"])
    assert f"{measured:,} measured requests, 2 failed." in setup
    assert "**B is slower** on output tok/s (steady)" in md
    assert row(md, "figure")[1:4] == ["A: main", "B: pr", "change (95% CI)"]


def test_per_server_throughput_in_schedule_order(report):
    _, md, rows = report
    servers, requests = rows["servers"], rows["requests"]
    expect = {x: [steady_tok_per_s(requests, s) for s in servers if s.letter == x] for x in "AB"}
    cells = row(md, "output tok/s (steady)")
    assert numbers(cells[1]) == pytest.approx(expect["A"], abs=0.5)
    assert numbers(cells[2]) == pytest.approx(expect["B"], abs=0.5)
    assert row(md, "server")[1:] == [
        "b0 s0 / b0 s3 / b1 s0 / b1 s3",
        "b0 s1 / b0 s2 / b1 s1 / b1 s2",
    ]
    assert row(md, "failed requests")[1:] == ["0 / 0 / 0 / 0", "2 / 0 / 0 / 0"]
    headline = row(md, "**output tok/s (steady)**")
    assert float(headline[1]) == pytest.approx(np.mean(expect["A"]), abs=0.5)
    assert headline[4] == "slower"


def test_phase_and_message_tables(report):
    _, md, rows = report
    spans, servers = rows["spans"], rows["servers"]
    for name in SPANS_MS:
        cells = row(md, f"`{name}`")
        for column, letter in ((1, "A"), (2, "B")):
            expected = pooled_ms_per_iter(spans, servers, name, letter)
            assert float(cells[column]) == pytest.approx(expected, rel=5e-3, abs=5e-4), name
    work = row(md, "postprocess work")
    for column, letter in ((1, "A"), (2, "B")):
        parts = ("worker.postprocess_batch", "worker.step.completion_wait",
                 "worker.postprocess.prematerialize")  # fmt: skip
        batch, *waits = (pooled_ms_per_iter(spans, servers, n, letter) for n in parts)
        assert float(work[column]) == pytest.approx(batch - sum(waits), rel=5e-3)
    add = row(md, "`worker.msg.add_request`")
    assert float(add[2]) == pytest.approx(
        ms_per_request(spans, servers, add[0][1:-1], "B"), rel=5e-3
    )
    engine = row(md, "↳ engine")
    expected = ms_per_request(spans, servers, "worker.msg.add_request.engine", "A")
    assert float(engine[1]) == pytest.approx(expected, rel=5e-3)


def test_arms_doubts_and_context(report):
    _, md, _ = report
    assert row(md, "A")[1:5] == ["main", "ref", f"`{ARMS[0]['commit'][:12]}`", "no"]
    assert row(md, "B")[4:] == ["yes (diff c05ef4fd612d3e7b)", "`engine.mixing=True`"]
    doubts = md.split("### Doubts")[1].split("###")[0]
    assert "2 failed requests in arm B" in doubts
    assert "of the client's calibrated maximum (1,800 tok/s)" in doubts
    assert "Power (qwen35 at c=64): for output tok/s (steady) with 5 blocks" in md
    assert "false-positive rate 4.0%, smallest detectable slowdown 3.0%, server-to-server" in md
    assert "noise (CV) 1.2%" in md


def test_plots_are_pngs_of_pr_width(report):
    path, md, _ = report
    for name in PLOTS:
        png = path.parent / "plots" / f"{name}.png"
        assert f"](plots/{name}.png)" in md
        assert png.read_bytes()[:8] == PNG
        with Image.open(png) as image:
            image.verify()
        with Image.open(png) as image:
            width, height = image.size
        assert width == round(WIDTH_IN * DPI) and 300 < height < 1200, (name, image.size)


def test_html_embeds_every_image(report):
    path, _, _ = report
    html = (path.parent / "report.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(PLOTS)
    assert "plots/" not in html.split("<body>")[1].replace("plots/ into", "")
    assert "<table>" in html and "<strong>B is slower</strong>" in html


def test_run_without_spans_skips_the_phase_plot(tmp_path):
    write_run(tmp_path / "run", RATES[:4], spans=False)
    md = write_report(tmp_path / "run", results=tmp_path / "none").read_text()
    assert "Not drawn: phase breakdown: no spans from either arm" in md
    assert "### Worker phases" not in md and not (tmp_path / "run/plots/phases.png").exists()
    assert (tmp_path / "run/plots/timeline.png").exists()
    assert "No client calibration on record" in md and "No power result for qwen35" in md


def test_bench_report_command_and_bad_input(tmp_path):
    write_run(tmp_path / "run", RATES[:4])
    result = CliRunner().invoke(app, ["report", str(tmp_path / "run")])
    assert result.exit_code == 0 and (tmp_path / "run" / "report.md").exists()
    bad = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert bad.exit_code == 2 and "is not a run directory" in " ".join(bad.output.split())


SINGLE = [{**ARMS[0], "letter": letter, "name": "nightly"} for letter in "AB"]


def test_bench_compare_two_single_arm_runs(tmp_path):
    last = write_run(tmp_path / "last", [1000.0, 1010.0, 990.0, 1005.0], letters="AA",
                     arms=SINGLE, run_id="last-night")  # fmt: skip
    today = write_run(tmp_path / "today", [900.0, 905.0, 890.0, 910.0], letters="AA",
                      arms=SINGLE, run_id="today")  # fmt: skip
    out = tmp_path / "report"
    args = [
        "compare",
        str(tmp_path / "last"),
        str(tmp_path / "today"),
        "--json",
        "--report",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 1, result.output  # B (today) is slower: a regression
    data = json.loads(result.stdout[: result.stdout.rindex("}") + 1])
    assert data["labels"] == {"A": "last-night", "B": "today"} and data["regression"]
    headline = data["figures"][0]
    for key, rows in (("servers_a", last), ("servers_b", today)):
        expect = [steady_tok_per_s(rows["requests"], s) for s in rows["servers"]]
        assert headline[key] == pytest.approx(expect, rel=1e-6)
    assert headline["change"]["blocks"] == 2 and headline["change"]["verdict"] == "slower"
    assert any("not interleaved" in d for d in data["doubts"])
    md = (out / "report.md").read_text()
    assert "| B | today: nightly |" in md and re.search(r"\| `worker.step.forward` \|", md)
    assert all((out / "plots" / f"{p}.png").exists() for p in PLOTS)


def test_bench_compare_refuses_another_schema(tmp_path):
    write_run(tmp_path / "a", RATES[:4])
    write_run(tmp_path / "b", RATES[:4])
    manifest = json.loads((tmp_path / "b/manifest.json").read_text())
    (tmp_path / "b/manifest.json").write_text(json.dumps(manifest | {"schema_version": 0}))
    result = CliRunner().invoke(app, ["compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 2 and result.output.count("error:") == 1
    assert "has results schema 0" in " ".join(result.output.split())


def test_a_comparison_in_hand_gives_the_same_report(tmp_path):
    """`bench run --report` passes the comparison it printed; the report is the one
    `bench report` writes from the directory."""
    from harness.summarize import summarize

    write_run(tmp_path / "run", RATES[:4])
    first = write_report(tmp_path / "run", results=tmp_path).read_text()
    again = write_report(tmp_path / "run", comparison=summarize(tmp_path / "run"), results=tmp_path)
    assert again.read_text() == first

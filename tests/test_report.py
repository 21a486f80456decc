"""Reports from recorded runs: the markdown's numbers against the synthetic rows they came from,
the plots as real PNGs, the HTML self-contained, and `bench compare` over two runs."""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

from harness.analysis.schema import RequestRecord, ServerRecord, Slot, SpanRecord
from harness.cli import app
from harness.commands.report import report_run
from harness.results import RunDir, summarise
from harness.show.report.style import DPI, WIDTH_IN

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
    calibration = {"latency": {"tokens_per_s_per_core": 1800.0}, "settings": {"shards": 1}}
    (results / "calibration" / "latest.json").write_text(json.dumps(calibration | {"unix_time": 0}))
    (results / "power").mkdir()
    power = {  # as harness/analysis/power.py writes it
        "scenario": "qwen35",
        "blocks": 5,
        "quoted_blocks": 5,
        "concurrency": 64,
        "false_positive_rate": {"output_tok_per_s": 0.04, "ttft_p50_ms": 0.05},
        "min_detectable_slowdown": {"output_tok_per_s": 0.03},
        "noise": {"output_tok_per_s": 0.012},
    }
    (results / "power" / "qwen35.json").write_text(json.dumps(power))
    path = report_run(root / "run", html=True, results=results)
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
        parts = (
            "worker.postprocess_batch",
            "worker.step.completion_wait",
            "worker.postprocess.prematerialize",
        )
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
    md = report_run(tmp_path / "run", results=tmp_path / "none").read_text()
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
    single = {"letters": "AA", "arms": SINGLE}
    last = write_run(
        tmp_path / "last", [1000.0, 1010.0, 990.0, 1005.0], **single, run_id="last-night"
    )
    today = write_run(tmp_path / "today", [900.0, 905.0, 890.0, 910.0], **single, run_id="today")
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


def test_the_report_reads_the_summary_and_never_rewrites_it(tmp_path):
    """A run is summarised once: the report lays out summary.json as it is (a label changed
    there shows) and leaves the file as it found it."""
    write_run(tmp_path / "run", RATES[:4])
    summary = tmp_path / "run" / "summary.json"
    data = json.loads(summary.read_text())
    data["labels"]["B"] = "renamed in summary.json"
    summary.write_text(json.dumps(data))
    before = summary.read_bytes()
    md = report_run(tmp_path / "run", results=tmp_path).read_text()
    assert "B: renamed in summary.json" in md
    assert summary.read_bytes() == before


def test_a_run_never_summarised_is_summarised_once_by_its_report(tmp_path):
    write_run(tmp_path / "run", RATES[:4])
    summary = tmp_path / "run" / "summary.json"
    expected = summary.read_text()
    summary.unlink()
    report_run(tmp_path / "run", results=tmp_path)
    assert summary.read_text() == expected

"""Reports from recorded runs: the markdown's numbers against the synthetic rows they came from,
the plots as real PNGs, the HTML self-contained, summary.json read and never rewritten."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from harness.analysis import power_report
from harness.cli import app
from harness.commands.report import report_run
from harness.results import load_summary
from harness.show.comparison import render
from harness.show.report.style import DPI, WIDTH_IN
from tests.synthetic_run import (
    ARMS,
    PLOTS,
    PNG,
    RATES,
    SPANS_MS,
    ms_per_request,
    numbers,
    pooled_ms_per_iter,
    row,
    steady_tok_per_s,
    write_run,
)


def power_result(concurrency: int) -> dict:
    """A power result as harness/analysis/power_report.py writes it, for the synthetic run's machine."""
    machine = {"host": "ci", "cpu": "x86_64", "cpus": 2, "gpu": None}
    rates = {2: 0.04}, {2: 0.03}, {2: 0.91}, {2: 0.95}
    tok = power_report.FigurePower("output_tok_per_s", True, 0.012, 0.01, "no change", *rates)
    report = power_report.PowerReport(
        "qwen35", "tiny", machine, 5, concurrency, 16, 5.0, 0.2, [tok], [], "-"
    )
    return json.loads(json.dumps(report.to_json()))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    rows = write_run(root / "run", RATES, failed=2)
    results = root / "results"
    (results / "calibration").mkdir(parents=True)
    calibration = {"latency": {"tokens_per_s_per_core": 1800.0}, "settings": {"shards": 1}}
    (results / "calibration" / "latest.json").write_text(json.dumps(calibration | {"unix_time": 0}))
    (results / "power").mkdir()
    (results / "power" / "qwen35.json").write_text(json.dumps(power_result(concurrency=4)))
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
    assert row(md, "figure")[1:4] == ["A: main", "B: pr", "change (CI)"]
    assert "output tok/s (steady) (95% CI) alone decides the exit code" in md


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
    assert "Power (qwen35 at c=4" in md and "for output tok/s (steady) with 2 block(s)" in md
    assert "false-positive rate 4.0%; a +10% slowdown called slower in 91.0% of runs" in md
    assert "its interval holding the truth in 95.0%" in md


def test_a_power_result_of_another_setup_is_not_quoted(tmp_path):
    write_run(tmp_path / "run", RATES[:4])
    (tmp_path / "power").mkdir()
    (tmp_path / "power" / "qwen35.json").write_text(json.dumps(power_result(concurrency=64)))
    md = report_run(tmp_path / "run", results=tmp_path).read_text()
    assert "The power result on record for qwen35" in md and "is not quoted" in md
    assert "concurrency 64 (this run: 4)" in md.split("### Doubts")[1]
    assert "false-positive rate" not in md


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


def test_a_summary_made_with_older_statistics_is_summarised_again_in_memory(tmp_path):
    write_run(tmp_path / "run", RATES)
    summary = tmp_path / "run" / "summary.json"
    data = json.loads(summary.read_text())
    data["rule"] = {"level": 0.95, "min_effect": 0.01, "resolution": 0.05}
    for key in ("family", "unit", "statistics"):
        data.pop(key)
    data["figures"][0]["change"]["verdict"] = "no change"  # what the old rule said
    summary.write_text(json.dumps(data))
    before = summary.read_bytes()
    md = report_run(tmp_path / "run", results=tmp_path).read_text()
    assert "**B is slower**" in md and "summarised the tables again" in md
    assert summary.read_bytes() == before


def test_the_terminal_tables_read_at_80_columns(tmp_path):
    """Row names are never cut and figures wrap rather than being cut (rich marks a cut with
    an ellipsis); the compact interval keeps the change column narrow."""
    write_run(tmp_path / "run", RATES)
    console = Console(width=80, record=True)
    console.print(render(load_summary(tmp_path / "run")))
    text = console.export_text()
    lines = text.splitlines()
    assert "…" not in text and max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line[:1] in "┏┃┡│└"]
    assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in rows)  # no table cropped at its right
    for name in SPANS_MS:
        assert name.removeprefix("worker.") in text


def test_an_interval_of_few_replicates_prints_its_far_bounds_as_past_a_limit():
    """One block's interval (1 degree of freedom) runs to exp(+-many): its bounds print as
    `<-99.9` and `>+999%`, not as eleven-digit percentages; ordinary bounds print as before."""
    from harness.analysis.verdict import ONE_BLOCK, Change
    from harness.show.format import change_text

    far = Change(2.398, 1e-9, 7.2e9, 1, ONE_BLOCK, 1, "not enough data")
    assert change_text(far) == "+139.8% (<-99.9..>+999%)"
    near = Change(1.045, 0.925, 1.18, 3, ONE_BLOCK, 8, "not enough data")
    assert change_text(near) == "+4.5% (-7.5..+18.0%)"
    edge = Change(1.0, 0.001, 10.99, 1, ONE_BLOCK, 1, "not enough data")  # exactly at the limits
    assert change_text(edge) == "+0.0% (-99.9..+999.0%)"


def test_a_speech_servers_output_over_time_is_its_seconds_of_audio():
    """The timeline's top panel for a speech load: each piece of PCM at its arrival, as seconds
    of audio (24 kHz, 16-bit: 48,000 bytes a second); the other server's and a failed request's
    pieces left out. A token load's arrivals are one token each."""
    from harness.show.report import series

    requests = pd.DataFrame(
        {
            "block": [0, 0, 0, 0],
            "slot": [1, 1, 1, 2],
            "status": [200, 200, 500, 200],
            "error": [None, None, None, None],
            "audio_times_s": [[0.5, 1.0], [0.7], [0.8], [0.9]],
            "audio_bytes": [[48_000, 24_000], [4_800], [48_000], [48_000]],
            "token_times_s": [[0.1, 0.2], [0.3], [0.4], [0.5]],
        }
    )
    server = pd.Series({"block": 0, "slot": 1})
    times, seconds = series._arrivals(requests, server, audio=True)
    pieces = sorted(zip(times.tolist(), seconds.tolist(), strict=True))
    assert pieces == [(0.5, 1.0), (0.7, 0.1), (1.0, 0.5)]
    times, tokens = series._arrivals(requests, server, audio=False)
    assert sorted(times.tolist()) == [0.1, 0.2, 0.3] and tokens.tolist() == [1.0, 1.0, 1.0]


def test_the_timeline_shows_each_arms_median_server_by_the_headline(tmp_path):
    """The server drawn over time for each arm is the one with the median headline figure
    (the lower of two), not by tok/s: a speech run's headline is audio-seconds/s."""
    from harness.results import load_run
    from harness.show.report import series
    from harness.show.report.evidence import Evidence

    write_run(tmp_path / "run", [100.0, 300.0, 200.0, 400.0, 500.0, 250.0, 220.0, 600.0])
    manifest, frames = load_run(tmp_path / "run")
    comparison = load_summary(tmp_path / "run")
    headline = next(f for f in comparison.figures if f.figure == comparison.headline)
    # a token rate that orders the servers the other way, as a speech run's (no tokens) can
    by_letter = {
        "A": iter([-v for v in headline.servers_a]),
        "B": iter([-v for v in headline.servers_b]),
    }
    comparison.servers = [
        dataclasses.replace(s, output_tok_per_s=next(by_letter[s.letter]))
        for s in comparison.servers
    ]
    picks = series.median_servers(Evidence(manifest, frames, comparison))
    for letter, values in (("A", headline.servers_a), ("B", headline.servers_b)):
        ordered = [s for s in comparison.servers if s.letter == letter]
        lower_median = sorted(values)[(len(values) - 1) // 2]
        chosen = ordered[values.index(lower_median)]
        assert (picks[letter].block, picks[letter].slot) == (chosen.block, chosen.slot)


def test_batch_windows_are_drawn_from_the_loads_start(tmp_path):
    """A span window begun before the load (the worker's first, over its start-up) is drawn
    from the load's start; one that ended before it (no load step in it) is not drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.results import load_run
    from harness.show.report import series

    write_run(tmp_path / "run", RATES[:4])
    _, frames = load_run(tmp_path / "run")
    server = frames["servers"].iloc[1]
    spans = frames["spans"].copy()
    mine = (spans["block"] == server.block) & (spans["slot"] == server.slot)
    first_end = spans.loc[mine, "end_unix"].min()
    opening = mine & (spans["end_unix"] == first_end)
    spans.loc[opening, "start_unix"] = server.t0_unix - 30.0  # begun at the worker's start
    idle = spans[opening].assign(start_unix=server.t0_unix - 60, end_unix=server.t0_unix - 31)
    spans = pd.concat([spans, idle])
    _, ax = plt.subplots()
    assert series._batch(ax, spans, server, "black")
    segments = [s for c in ax.collections for s in c.get_segments()]
    starts = sorted(float(seg[0][0]) for seg in segments)
    before = frames["spans"]
    windows = before[mine & (before["name"] == "worker.rows_per_step")]
    assert len(segments) == len(windows)  # the idle window not among them
    assert starts[0] == 0.0 and all(x >= 0 for x in starts)
    plt.close("all")


def test_an_aa_run_says_so_at_the_top(tmp_path, report):
    """A run whose arms are the same code (manifest aa_check) says it is an A/A run under its
    headline, so its changes read as the machine's noise; a run of two codes does not."""
    from harness.show.report.document import AA_NOTE

    assert AA_NOTE not in report[1]
    write_run(tmp_path / "run", RATES)
    manifest_path = tmp_path / "run" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps(manifest | {"aa_check": True}))
    md = report_run(tmp_path / "run").read_text()
    assert md.index(AA_NOTE) < md.index("Setup: ")

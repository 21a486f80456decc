"""benchmarks/bench_orpheus_iteration.py on the CPU (tiny): the worker the server runs, both
nodes, its own iteration loop. What it counts is checked against the window arithmetic: each
request's PCM is 2048 samples x 2 bytes per window `windows_for` gives its tokens, the timed
iterations' windows are one per frame each request wrote in them, and the staggered admission
spreads them over the iterations. Also the profile's stream arithmetic
(benchmarks/device_streams.py) on spans with a known answer."""

from __future__ import annotations

import math

import pytest

from benchmarks import bench_orpheus_iteration as bench
from benchmarks.device_streams import (
    DeviceSpan,
    busy_us,
    concurrency_us,
    render,
    summarize,
)
from engine.models.orpheus import FRAME_TOKENS, SAMPLE_RATE, SAMPLES_PER_FRAME, windows_for

BYTES_PER_WINDOW = SAMPLES_PER_FRAME * 2  # int16 samples


@pytest.mark.parametrize(
    "loop, codec_overlap", [("strict", False), ("overlapped", True)]
)  # fmt: skip
def test_the_iteration_benchmark_counts_the_pcm_the_windows_make(loop, codec_overlap):
    requests, iterations = 9, 4 * FRAME_TOKENS
    settings = bench.Settings(
        "tiny", "cpu", loop, requests, prompt=24, warmup=35, iterations=iterations,
        codec_overlap=codec_overlap,
    )  # fmt: skip
    run = bench.measure(settings)
    assert f"codec overlap {codec_overlap}" in run.built
    # drained: every request's PCM is its windows' and it ended on its length
    assert set(run.pcm_bytes) == set(run.max_tokens) == set(range(requests))
    for rid, tokens in run.max_tokens.items():
        assert run.pcm_bytes[rid] == BYTES_PER_WINDOW * windows_for(tokens), rid
        assert run.finish[rid] == "length"
    assert len({t % FRAME_TOKENS for t in run.max_tokens.values()}) == FRAME_TOKENS
    assert bench.pcm_mismatches(run) == [] and bench.problems(run) == []
    # timed: no request ended, each wrote a token an iteration, so a window every 7th
    assert run.running_after == requests
    windows = [b // BYTES_PER_WINDOW for b in run.audio_bytes]
    assert all(b % BYTES_PER_WINDOW == 0 for b in run.audio_bytes)
    assert sum(windows) == requests * iterations // FRAME_TOKENS
    assert max(windows) <= math.ceil(requests / FRAME_TOKENS)  # spread, not all on one step
    seconds = sum(run.audio_bytes) / 2 / SAMPLE_RATE
    assert bench.audio_seconds_per_s(run, SAMPLE_RATE) == pytest.approx(
        seconds / sum(run.iteration_s)
    )


def test_the_benchmark_flags_pcm_that_is_not_its_windows():
    settings = bench.Settings("tiny", "cpu", "strict", 2, 24, 0, 1)
    run = bench.IterationRun(settings, "", [0.01], [0], max_tokens={0: 35, 1: 34})
    run.pcm_bytes = {0: BYTES_PER_WINDOW * 2, 1: BYTES_PER_WINDOW * 2}
    run.finish = {0: "length", 1: "length"}
    assert bench.pcm_mismatches(run) == [1]  # 34 tokens: 4 whole frames, 1 window
    run.running_after = 1  # one request ended inside the measurement
    assert [p.split(":")[0] for p in bench.problems(run)] == ["MISMATCH", "DOUBTFUL"]


def test_the_command_prints_its_figures_and_writes_the_profile(tmp_path, capsys):
    path = tmp_path / "profile.txt"
    argv = ["--size", "tiny", "--device", "cpu", "--loop", "strict", "--requests", "4"]
    argv += ["--prompt", "24", "--iterations", "7", "--profile", str(path)]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "orpheus iteration, size tiny, 4 requests" in out and "audio-s/s" in out
    assert "PCM of 4 of 4 requests" in out and "MISMATCH" not in out and "DOUBTFUL" not in out
    assert "no device events in 7 profiled iterations" in out
    assert "aten::" in path.read_text()  # the host's op table


# --- the profile's stream arithmetic ---------------------------------------------------------
def spans(stream: int, *intervals: tuple[float, float]) -> list[DeviceSpan]:
    return [DeviceSpan(stream, f"k{stream}", start, end) for start, end in intervals]


def test_busy_time_is_the_union_of_the_spans():
    assert busy_us(spans(7, (0, 10), (5, 12), (20, 25))) == 17
    assert busy_us([]) == 0


def test_concurrency_counts_the_time_each_number_of_streams_is_busy():
    llm = spans(7, (0, 10), (20, 30))
    codec = spans(13, (5, 8), (8, 25))  # touching spans of one stream merge
    third = spans(21, (22, 24))
    assert concurrency_us(llm + codec) == {1: 20, 2: 10}
    assert concurrency_us(llm + codec + third) == {1: 20, 2: 8, 3: 2}
    assert concurrency_us(spans(7, (0, 5)) + spans(13, (5, 9))) == {1: 9}  # end to end


def test_the_stream_report_labels_streams_and_sets_busy_against_wall():
    llm = spans(7, (0, 10), (20, 30))
    codec = spans(13, (5, 26))
    report = summarize(llm + codec, {7: "llm", 13: "codec"}, wall_us=40, iterations=2)
    assert [(s.label, s.busy_us, s.events) for s in report.streams] == [
        ("codec", 21, 1),
        ("llm", 20, 2),
    ]
    assert report.busy_us == 30 and report.concurrent_us == 11
    text = render(report)
    assert "any stream (the GPU busy)" in text and "75%" in text  # 30 of 40
    assert "no stream (the GPU idle)" in text and "25%" in text
    unlabelled = summarize(spans(5, (0, 1)), {}, wall_us=1, iterations=1)
    assert unlabelled.streams[0].label == "stream 5"

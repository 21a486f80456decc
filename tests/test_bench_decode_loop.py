"""benchmarks/bench_decode_loop.py on the CPU (tiny): the worker's decode-only iterations timed,
its spans read from the worker's own timer, the doubt when prompt work falls inside the
measurement, and a clear error for settings that cannot run."""

from __future__ import annotations

import statistics

import pytest

from benchmarks import bench_decode_loop
from benchmarks.bench_decode_loop import Settings, measure, render


@pytest.mark.parametrize("loop", ["strict", "overlapped"])
def test_every_timed_iteration_decodes_every_row_and_the_spans_cover_them(loop):
    run = measure(Settings("tiny", "cpu", loop, 6, 24, warmup=3, iterations=12))
    assert len(run.iteration_s) == 12 and run.rows == [6] * 12
    assert run.prefill_steps == 0
    # the worker's own spans, one sample a timed iteration, nothing from before them
    assert len(run.spans_ns["worker.iter_total"]) == 12
    assert len(run.spans_ns["worker.step.forward"]) == 12
    text = render(run)
    assert f"loop {loop}" in text and "6.0 rows an iteration" in text
    assert "worker.step.completion_wait" in text and "DOUBTFUL" not in text


def test_prompt_work_inside_the_measurement_is_flagged():
    run = measure(Settings("tiny", "cpu", "strict", 2, 8, warmup=0, iterations=4))
    run.prefill_steps = 1  # as if a prefill step had landed among the timed ones
    assert "DOUBTFUL: 1 timed iterations had prompt work" in render(run)


def test_the_command_prints_its_figures_and_refuses_what_cannot_run(tmp_path, capsys):
    profile = tmp_path / "loop.txt"
    argv = ["--size", "tiny", "--device", "cpu", "--requests", "3", "--prompt", "16",
            "--iterations", "5", "--warmup", "1", "--profile", str(profile),
            "--profile-iterations", "2"]  # fmt: skip
    assert bench_decode_loop.main(argv) == 0
    out = capsys.readouterr().out
    assert "decode loop, qwen35 tiny, 3 requests" in out and "a CPU run" in out
    assert "decode loop" in profile.read_text()
    assert bench_decode_loop.main(["--size", "tiny", "--device", "cpu", "--prompt", "4000"]) == 2
    assert "exceed engine.max_model_len" in capsys.readouterr().err
    assert bench_decode_loop.main(["--size", "tiny", "--device", "cpu", "--pdl"]) == 2
    assert "engine.pdl needs engine.device: cuda" in capsys.readouterr().err


def test_the_closed_loop_replaces_each_request_that_ends_and_splits_the_iterations(monkeypatch):
    """--closed: the server's closed loop in process: the engine's warmup first, as a server
    runs it; every request that ends is replaced at once (lengths from the scenario's load:
    tiny's outputs of 16-48 tokens end many inside 40 iterations), so the rows stay at c; the
    tokens counted are the frames' own; the timed iterations split into those with prompt
    work and those without."""
    warmed = []
    monkeypatch.setattr(bench_decode_loop, "warm_up", lambda worker: warmed.append(worker))
    settings = Settings("tiny", "cpu", "overlapped", 4, 0, warmup=10, iterations=40, closed=True)
    run = measure(settings)
    assert len(warmed) == 1
    assert len(run.tokens) == 40 and sum(run.tokens) > 0
    assert len(run.prompt_work) == 40 and 0 < run.prefill_steps < 40  # arrivals came, and went
    assert max(run.rows) <= 4 and run.admitted > 4  # replacements came
    text = render(run)
    assert "closed loop, qwen35 tiny, c=4" in text and "output tok/s over 40 iterations" in text
    assert "decode iterations:" in text and "prompt iterations:" in text
    assert "DOUBTFUL" not in text  # prompt work is the closed loop's own
    # what prompt work cost: the run's time beyond as many iterations at the decode median
    decode = [t for t, work in zip(run.iteration_s, run.prompt_work, strict=True) if not work]
    beyond = (sum(run.iteration_s) - 40 * statistics.median(decode)) * 1e3
    assert f"time beyond 40 decode medians {beyond:,.0f} ms" in text


def test_a_scenario_setting_reaches_the_worker_and_a_bad_one_is_one_line(capsys):
    """--set: a scenario setting as bench's overrides (the closed stage's candidates, e.g.
    engine.prefill_hold_steps); a bad one is refused before any worker starts."""
    argv = ["--size", "tiny", "--device", "cpu", "--requests", "3", "--prompt", "16",
            "--iterations", "4", "--warmup", "1", "--set", "engine.prefill_hold_steps=5"]  # fmt: skip
    assert bench_decode_loop.main(argv) == 0
    assert "engine.prefill_hold_steps 5" in capsys.readouterr().out  # as the worker's config
    bad = ["--size", "tiny", "--device", "cpu", "--set", "engine.gdn_decode=fast"]
    assert bench_decode_loop.main(bad) == 2
    assert "engine.gdn_decode must be one of grid, pipelined" in capsys.readouterr().err
    assert bench_decode_loop.main(["--size", "tiny", "--set", "engine.mixing"]) == 2
    assert "is not key=value" in capsys.readouterr().err

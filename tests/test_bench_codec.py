"""benchmarks/bench_codec.py on the CPU (tiny, fp32): it times both modes of each setting
through the stage's own decoder and writes its profile tables; its statistics on known values."""

from __future__ import annotations

import pytest

from benchmarks.bench_codec import StepTimes, against_first, main, render, summarise

CPU_RUN = "--device cpu --preset tiny --windows 1 --repeats 2 --warmup 0".split()


def test_bench_codec_times_each_setting_and_mode_on_the_cpu(capsys):
    main([*CPU_RUN, "--kernels", "torch", "fused"])
    out = capsys.readouterr().out
    steps = [line for line in out.splitlines() if line.startswith("codec step")]
    assert [line.split(":")[0].split()[3:6] for line in steps] == [
        ["torch", "eager", "1"], ["torch", "graphs", "1"],
        ["fused", "eager", "1"], ["fused", "graphs", "1"],
    ]  # fmt: skip
    assert all("wall median" in line and "over 2 steps" in line for line in steps)
    assert "graphs   1 windows, median over the first: torch 1.00, fused" in out


def test_bench_codec_writes_its_profile_tables(tmp_path):
    profile = tmp_path / "profile.txt"
    main([*CPU_RUN, "--kernels", "fused", "--profile", str(profile)])
    tables = profile.read_text()
    for mode in ("eager", "graphs"):
        assert f"== kernels fused, {mode}, 1 windows" in tables
    assert "aten::sin" in tables  # the Snakes' torch ops: a CPU runs them whatever the setting


def test_summary_and_ratios_on_known_step_times():
    fast = StepTimes("fused", "graphs", 4, list(range(1, 21)), [30.0] * 20)
    slow = StepTimes("torch", "graphs", 4, [2.0 * v for v in range(1, 21)], [40.0] * 20)
    s = summarise(fast)
    assert (s.clock, s.median_ms, s.wall_ms, s.steps) == ("device", 10.5, 30.0, 20)
    assert s.p10_ms == pytest.approx(2.1) and s.p90_ms == pytest.approx(18.9)
    assert "device median 10.500 ms" in render(s) and "2625 us a window" in render(s)
    cpu = summarise(StepTimes("torch", "eager", 1, [], [5.0, 1.0, 3.0]))
    assert (cpu.clock, cpu.median_ms, cpu.p10_ms, cpu.p90_ms) == ("wall", 3.0, 1.0, 5.0)
    ratios = against_first([summarise(slow), s])
    assert ratios == {("graphs", 4): {"torch": 1.0, "fused": 0.5}}

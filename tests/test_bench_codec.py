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


def test_bench_codec_times_each_sine_of_each_kernel_setting(capsys):
    """--sines pairs each engine.codec_sine with every kernel setting but torch (whose sines
    are torch's): a setting named by its kernels, and its sine where not the default."""
    main([*CPU_RUN, "--kernels", "torch", "folded", "--sines", "exact", "approx"])
    steps = [line for line in capsys.readouterr().out.splitlines() if line.startswith("codec step")]
    assert [line.split()[3] for line in steps[::2]] == ["torch", "folded", "folded+approx"]


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
    assert (s.clock, s.step_ms.median, s.wall_ms, s.step_ms.n) == ("device", 10.5, 30.0, 20)
    assert s.step_ms.p10 == pytest.approx(2.9) and s.step_ms.p90 == pytest.approx(18.1)
    assert "device median 10.500 ms (p10 2.900, p90 18.100), wall 30.000 ms" in render(s)
    assert "2625 us a window over 20 steps" in render(s)
    cpu = summarise(StepTimes("torch", "eager", 1, [], [5.0, 1.0, 3.0]))
    assert (cpu.clock, cpu.step_ms.median) == ("wall", 3.0)
    assert (cpu.step_ms.p10, cpu.step_ms.p90) == (pytest.approx(1.4), pytest.approx(4.6))
    ratios = against_first([summarise(slow), s])
    assert ratios == {("graphs", 4): {"torch": 1.0, "fused": 0.5}}

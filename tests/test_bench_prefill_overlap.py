"""benchmarks/bench_prefill_overlap.py on the CPU: its arithmetic and its refusals (the
measurement itself needs CUDA streams: `python -m benchmarks.bench_prefill_overlap --size 0.8b` on the GPU machine)."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_prefill_overlap as bench


def test_hidden_share_is_the_prefill_time_two_streams_save():
    times = bench.DeviceTimes(decode=40.0, prefill=4.0, serial=44.0, streams=41.0, doubtful=0)
    assert bench.hidden_share(times) == pytest.approx(0.75)
    none_hidden = bench.DeviceTimes(40.0, 4.0, 44.0, 44.0, 0)
    assert bench.hidden_share(none_hidden) == 0.0
    slower = bench.DeviceTimes(40.0, 4.0, 44.0, 46.0, 0)  # contention: two streams lose
    assert bench.hidden_share(slower) == pytest.approx(-0.5)
    assert bench.hidden_share(bench.DeviceTimes(40.0, 0.0, 40.0, 40.0, 0)) == 0.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is the CPU's")
def test_without_cuda_it_says_so_in_one_line(capsys):
    assert bench.main(["--size", "tiny"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: bench_prefill_overlap measures CUDA streams; no CUDA here"]

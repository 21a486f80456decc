"""benchmarks/bench_decode_attention.py on the CPU: it refuses to run without CUDA in one line,
its options are checked on any machine, and its figures (bytes read, GB/s, the table) on known
timings."""

from __future__ import annotations

import pytest
import torch

from benchmarks import bench_decode_attention as bench


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_without_cuda_it_stops_with_one_line():
    with pytest.raises(SystemExit) as stopped:
        bench.main(["--model", "3b", "--rows", "1"])
    message = str(stopped.value)
    assert message.startswith("bench_decode_attention: needs CUDA") and "\n" not in message


@pytest.mark.parametrize("argv", [["--rows", "0"], ["--model", "7b"], ["--calls", "x"]])
def test_bad_options_are_refused_before_any_work(argv, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(argv)
    assert stopped.value.code == 2 and "error:" in capsys.readouterr().err


def test_the_defaults_are_the_served_shapes_rows_and_contexts():
    args = bench.parse_args([])
    assert args.model == ["0.8b", "3b"] and args.rows == [1, 16, 64, 128]
    assert args.contexts == [256, 512, 2048] and (args.calls, args.sweep) == (20, False)


def test_bytes_read_and_rates_on_known_timings():
    # the steps the kernel was built for read 67 MB of K and V a layer: 3b at 64 rows of 256
    # tokens, 0.8b at 64 rows of 512 (34 MB is its K alone)
    assert bench.kv_bytes(64, 256, kv_heads=8, head_dim=128) == 67_108_864
    assert bench.kv_bytes(64, 512, kv_heads=2, head_dim=256) == 67_108_864
    slow = bench.DecodeTiming("3b", 64, 256, "flashinfer-tensor-cores", None, 67_108_864,
                              [37.4, 36.0, 40.0], 0.0)  # fmt: skip
    fast = bench.DecodeTiming("3b", 64, 256, "triton", 1, 67_108_864, [16.0, 15.0, 17.0], 0.004)
    assert bench.gb_per_s(slow) == pytest.approx(67_108_864 / 37.4e-6 / 1e9)
    line = bench.render(fast)
    assert line.startswith("3b  64 rows x 256  triton (1 splits): median 16.000 us")
    assert "= 4,194 GB/s, err 4.00e-03" in line
    rows = bench.table([slow, fast]).splitlines()
    assert rows[0].split() == ["model", "rows", "context", "flashinfer-tensor-cores", "triton"]
    assert rows[1].split() == ["3b", "64", "256", "37.4", "us", "1,794", "GB/s", "16.0", "us",
                               "4,194", "GB/s"]  # fmt: skip

"""benchmarks/bench_launch.py's host-only run (`--host-only`): the kept path's Python over a
stand-in kernel, on any machine; it leaves Triton's own launch set after it."""

from __future__ import annotations

from benchmarks import bench_launch
from engine.kernels import triton_launch


def test_the_host_only_run_times_both_launches_without_cuda(capsys):
    bench_launch.main(["--host-only", "--calls", "2", "--samples", "2"])
    out = capsys.readouterr().out
    for name in ("rms_norm", "gdn prepare"):
        for row in ("runner", "kept", "kept Python"):
            assert f"  {name} {row} " in out
    assert not triton_launch.BOUND


def test_the_kept_row_times_the_kept_launch_not_tritons():
    """After its first launch, every launch the kept row times finds its kept kernel."""
    for params, args, kwargs in bench_launch._host_launches().values():
        kernel = bench_launch.StandInKernel(params)
        direct, kept = bench_launch.measure_kept_python(kernel, args, kwargs, calls=3, samples=2)
        assert direct.n == kept.n == 2
        assert kernel.launches == 1

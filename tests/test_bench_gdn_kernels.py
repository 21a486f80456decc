"""benchmarks/bench_gdn_kernels.py: its shapes and its analysis (pure functions) on synthetic
samples with known answers, and a smoke run on the CPU in Triton's interpreter (every path
but fla, a sweep of one config beside the default, and one launch of the recurrence beside
the engine's), whose paths agree.

The smoke run needs the `triton` package (skips where it is missing, as in CI)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_gdn_kernels import (
    Sample,
    Shape,
    axis_winners,
    best_per_shape,
    parse_recurrent,
    summarise,
)
from engine.kernels.gdn_config import SPLIT_DEFAULT, SplitConfig


def test_shapes_parse_and_print():
    assert Shape.parse("4x256") == Shape(0, 4, 256)
    mixed = Shape.parse("64d+1x384")
    assert mixed == Shape(64, 1, 384) and str(mixed) == "64d+1x384"
    assert mixed.num_new == [1] * 64 + [384]
    decode = Shape.parse("64d")  # a decode step: the recurrence alone
    assert decode == Shape(64, 0, 0) and str(decode) == "64d" and decode.num_new == [1] * 64
    for bad in ("384", "1x0", "d+1x8", "2x3x4", "0d"):
        with pytest.raises(ValueError, match="RxL"):
            Shape.parse(bad)


def test_recurrent_launches_parse_and_bad_ones_are_refused():
    assert parse_recurrent("64:8") == (64, 8)
    for bad in ("64", "48:4", "32:3", "32:4:1"):
        with pytest.raises(argparse.ArgumentTypeError, match="BV:WARPS"):
            parse_recurrent(bad)


def _sample(split: SplitConfig, times: list[float], shape: str = "1x384", **kw) -> Sample:
    return Sample(shape, "captured", "float32", str(split), "sweep", gpu_us=times, **kw)


def test_summarise_takes_the_median_and_deciles_and_counts_doubtful_calls():
    sample = _sample(SPLIT_DEFAULT, [float(t) for t in range(20, 0, -1)],
                     host_us=[5.0] * 18 + [50.0, 60.0], spin_us=[40.0] * 20)  # fmt: skip
    summary = summarise(sample)
    gpu = summary.gpu
    assert gpu.median == 10.5 and (gpu.p10, gpu.p90) == (pytest.approx(2.9), pytest.approx(18.1))
    assert summary.host.median == 5.0 and summary.doubtful == 2
    assert summarise(_sample(SPLIT_DEFAULT, [])).gpu is None  # failed: no figure


def test_axis_winners_keep_the_best_value_of_each_axis_that_beats_the_default():
    rows = [
        (SPLIT_DEFAULT, _sample(SPLIT_DEFAULT, [100.0])),
        (SplitConfig(states_warps=1), _sample(SplitConfig(states_warps=1), [120.0])),
        (SplitConfig(states_warps=4), _sample(SplitConfig(states_warps=4), [90.0])),
        (SplitConfig(fixed_states_rows=1), _sample(SplitConfig(fixed_states_rows=1), [60.0])),
        (SplitConfig(fixed_states_rows=16), _sample(SplitConfig(fixed_states_rows=16), [70.0])),
        (SplitConfig(outputs_bv=32), _sample(SplitConfig(outputs_bv=32), [101.0])),
        (SplitConfig(chunk=64), _sample(SplitConfig(chunk=64), [], error="OutOfResources")),
    ]
    winners = axis_winners(rows)
    assert winners == [SplitConfig(states_warps=4), SplitConfig(fixed_states_rows=1)]


def test_best_per_shape_pairs_the_default_with_the_fastest():
    samples = [
        _sample(SPLIT_DEFAULT, [100.0], "1x384"),
        _sample(SplitConfig(states_warps=8), [80.0], "1x384"),
        _sample(SplitConfig(chunk=64), [], "1x384", error="failed"),
        _sample(SPLIT_DEFAULT, [50.0], "4x256"),
        _sample(SplitConfig(states_warps=8), [55.0], "4x256"),
    ]
    best = best_per_shape(samples)
    assert best["1x384"][0].split == "default" and best["1x384"][1].split == "states_warps=8"
    assert best["4x256"][1].split == "default"


def test_the_benchmark_runs_in_the_interpreter(tmp_path):
    pytest.importorskip("triton")
    from engine.kernels.gdn_launch import PIPELINED_LAUNCH, RECURRENT_LAUNCH

    out = tmp_path / "gdn.json"
    root = Path(__file__).resolve().parents[1]
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_gdn_kernels", "--device", "cpu",
         "--size", "tiny", "--shapes", "1d+1x12", "--paths", "fla", "triton", "triton_split",
         "captured", "--state-dtypes", "float32", "--warmup", "0", "--repeats", "1",
         "--max-rows", "4", "--max-tokens", "64",
         "--sweep", "fixed_states_rows=1,fixed_chunks=1,scores_in_prepare=true",
         "--recurrent", "16:2", "--recurrent-shapes", "3d", "--json", str(out)],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=120,
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "split configs on captured" in done.stdout and "best split config" in done.stdout
    head, *samples = (json.loads(line) for line in out.read_text().splitlines())
    assert head["schema"] == 1 and head["environment"]["device"] == "cpu (interpreter)"
    paths = {s["path"]: s for s in samples if s["kind"] == "path"}
    assert paths["fla"]["error"] == "flash-linear-attention is not importable"
    for name in ("triton", "triton_split", "captured"):
        assert paths[name]["error"] is None and len(paths[name]["gpu_us"]) == 1, paths[name]
    for name in ("triton_split", "captured"):  # the same op as the first path's, in bf16
        assert paths[name]["err"] < 1e-2, paths[name]
    sweep = [s for s in samples if s["kind"] == "sweep"]
    assert [s["split"] for s in sweep] == [
        "default",
        "fixed_states_rows=1,fixed_chunks=1",  # scores_in_prepare: the default's already
    ]
    assert sweep[1]["error"] is None and sweep[1]["err"] < 1e-2
    # the recurrence's launches on a decode step: the engine's first, then its other form (the
    # same rule summed in another order: bf16 outputs within a rounding), then the one asked
    # for, the same outputs (each program's columns are its own: no sum is reordered)
    recurrent = [s for s in samples if s["kind"] == "recurrent"]
    engine = f"recurrent bv={RECURRENT_LAUNCH.bv},warps={RECURRENT_LAUNCH.warps}"
    other = f"one_pass={not RECURRENT_LAUNCH.one_pass}"
    # and then the pipelined kernel (engine.gdn_decode) under each launch of its sweep, the
    # same per-tile arithmetic: the same outputs
    from benchmarks.bench_gdn_kernels import PIPELINED_SWEEP

    p = PIPELINED_LAUNCH
    default = (p.bv, p.warps, p.per_sm, p.stages)
    assert PIPELINED_SWEEP[0] == default  # the engine's launch first

    pipelined = [("3d", "pipelined bv={},warps={},per_sm={},stages={}".format(*launch))
                 for launch in PIPELINED_SWEEP]  # fmt: skip
    assert [(s["shape"], s["split"]) for s in recurrent] == [
        ("3d", engine),
        ("3d", f"{engine},{other}"),
        ("3d", "recurrent bv=16,warps=2"),
        *pipelined,
    ]
    assert recurrent[1]["error"] is None and recurrent[1]["err"] < 1e-2
    for sample in recurrent[2:]:
        assert sample["error"] is None and sample["err"] == 0.0, sample
    assert {s["path"] for s in recurrent[3:]} == {"pipelined"}

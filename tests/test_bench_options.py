"""The micro-benchmarks refuse a count below 1 when they read their options (a one-line
error, exit 2), before any model, kernel or GPU: unchecked, `--steps 0` would run the whole
set-up and then fail on the summary of no samples (AttributeError)."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import pytest

from benchmarks import (
    bench_codec,
    bench_gdn_kernels,
    bench_gemm,
    bench_gpu_step,
    bench_launch,
    bench_orpheus_iteration,
)
from benchmarks.options import append_json_lines, positive_int


def test_positive_int_takes_whole_numbers_from_one():
    assert positive_int("1") == 1 and positive_int("30") == 30
    for text, says in (("0", "got 0"), ("-2", "got -2"), ("3.5", "'3.5'"), ("x", "'x'")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            positive_int(text)


@pytest.mark.parametrize("main,option", [
    (bench_gpu_step.main, "--steps"),
    (bench_gpu_step.main, "--batch"),
    (bench_gdn_kernels.main, "--repeats"),
    (bench_gemm.main, "--repeats"),
    (bench_gemm.main, "--rows"),
    (bench_codec.main, "--repeats"),
    (bench_codec.main, "--windows"),
    (bench_orpheus_iteration.main, "--iterations"),
    (bench_launch.main, "--samples"),
])  # fmt: skip
def test_a_count_below_one_is_refused_before_anything_runs(main, option, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([option, "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"error: argument {option}: must be >= 1, got 0"), err


@dataclass
class _Timing:
    arm: str
    times_us: list[float]


def test_json_lines_are_appended_one_record_a_line(tmp_path):
    """`--json PATH` (bench_gemm, bench_decode_attention): each timing one JSON line, appended
    after what the file held, so runs of several calls collect in one file."""
    path = tmp_path / "t.jsonl"
    append_json_lines(str(path), [_Timing("a", [1.5]), _Timing("b", [])])
    append_json_lines(str(path), [_Timing("c", [2.0, 3.0])])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"arm": "a", "times_us": [1.5]},
        {"arm": "b", "times_us": []},
        {"arm": "c", "times_us": [2.0, 3.0]},
    ]

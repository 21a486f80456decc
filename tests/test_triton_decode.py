"""Our Triton decode attention's launch rules on the CPU (engine/kernels/decode_config.py): the
split count from the rows and heads alone, the launches by head dim.

What the kernels compute: tests/test_triton_interpret.py; on the GPU tests/test_gpu_kernels.py.
"""

from __future__ import annotations

import pytest

from engine.kernels.decode_config import (
    MAX_SPLITS,
    PROGRAMS_PER_SM,
    SHAPES,
    SMS,
    DecodeLaunch,
    decode_splits,
    launch_for,
    launch_sweep,
)
from engine.worker.graphs import BUCKETS


def test_split_counts_of_the_served_models_at_each_graph_bucket():
    """The docstring's table: 0.8b (2 KV heads) and Orpheus 3b (8) on an H200's 132 SMs."""
    want = {
        "0.8b": [16, 16, 16, 16, 16, 16, 8, 8, 4, 4, 2, 2, 2, 1, 1],
        "3b": [16, 16, 16, 8, 4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1],
    }
    for model, (_, kv_heads, _) in SHAPES.items():
        assert [decode_splits(rows, kv_heads) for rows in BUCKETS] == want[model], model


def test_the_split_count_is_the_smallest_power_of_two_that_fills_the_sms():
    for sms in (80, 108, SMS):
        for kv_heads in (1, 2, 4, 8):
            for rows in range(1, 300):
                splits = decode_splits(rows, kv_heads, sms)
                assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
                fills = rows * kv_heads * splits >= PROGRAMS_PER_SM * sms
                assert fills or splits == MAX_SPLITS, (rows, kv_heads, sms)
                half = rows * kv_heads * (splits // 2) >= PROGRAMS_PER_SM * sms
                assert splits == 1 or not half, (rows, kv_heads, sms)
    for bad in ((0, 2, SMS), (4, 0, SMS), (4, 2, 0)):
        with pytest.raises(ValueError, match="decode_splits"):
            decode_splits(*bad)


def test_launches_by_head_dim_and_their_sweep():
    assert launch_for(256) == DecodeLaunch(block_n=32, warps=4, stages=3)
    assert launch_for(128) == launch_for(64) == DecodeLaunch(block_n=64, warps=4, stages=3)
    for head_dim in (128, 256):
        sweep = launch_sweep(head_dim)
        assert sweep[0] == launch_for(head_dim) and len(set(sweep)) == len(sweep) == 8
        assert all(16 <= launch.block_n <= 128 for launch in sweep)
    for bad, message in (
        ({"block_n": 48}, "block_n must be a power of two"),
        ({"block_n": 8}, "block_n must be a power of two"),
        ({"block_n": 64, "warps": 3}, "warps must be"),
        ({"block_n": 64, "stages": 0}, "stages must be"),
    ):
        with pytest.raises(ValueError, match=message):
            DecodeLaunch(**bad)

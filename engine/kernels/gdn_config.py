"""The split Gated DeltaNet kernel's tuning: the launch before its config existed
(`SPLIT_LEGACY`) and what benchmarks/bench_gdn_kernels.py --sweep tries (`split_sweep()`), each
config legal for the H200's compiler (tests/test_triton_compile.py compiles every one for
sm_90). The config itself, its default and `auto`'s threshold are the engine's settings
(engine/config/gdn_split.py).

Plain Python: the benchmark's argument parsing imports it without triton.
"""

from __future__ import annotations

import dataclasses

from engine.config.gdn_split import SPLIT_DEFAULT, SplitConfig

# The launch before the config existed (Triton's warps and stages, 16 value columns, one
# program per row or chunk a fixed grid can hold, the scores recomputed per value block).
SPLIT_LEGACY = SplitConfig(
    states_bv=16,
    states_warps=4,
    states_stages=3,
    outputs_bv=16,
    fixed_recurrent_rows=None,
    fixed_states_rows=None,
    fixed_chunks=None,
    scores_in_prepare=False,
)


# What --sweep tries: one axis at a time around the default (the others at their defaults),
# the legacy launch, and a few combinations whose parts only pay together (more value columns
# a program want more warps). Every entry compiles for sm_90 within the shared memory a block
# may have (tests/test_triton_compile.py); the benchmark then times each and combines each
# shape's winning values of the axes in one more config. A sweep around the legacy launch
# also tried chunk 64 with 8 warps in every pass: its outputs were wrong at 128 and
# 384 tokens (max error 1.1 and 0.95 against the default's, where chunk 64 alone is within
# 3e-3) and it hit an illegal address at 4 x 256, leaving the CUDA context unusable for
# every config after it. Its cause is not known (a kernel reading past a tile at that size is
# the first suspect); SplitConfig refuses it until a test explains it.
SWEEP_AXES: dict[str, tuple] = {
    "chunk": (16, 64),
    "prepare_warps": (2, 8),
    "states_bv": (16, 64),
    "states_warps": (1, 4),
    "states_stages": (2, 3),
    "outputs_bv": (32, 128),
    "outputs_warps": (2, 8),
    "fixed_recurrent_rows": (None, 64),
    "fixed_states_rows": (None, 1, 16),
    "fixed_chunks": (None, 64),
    "scores_in_prepare": (False,),
}
SWEEP_COMBINED = (
    {"states_bv": 64, "states_warps": 4},
    {"states_bv": 64, "states_warps": 8},
    {"outputs_bv": 128, "outputs_warps": 8},
    {"fixed_recurrent_rows": 64, "fixed_states_rows": 1, "fixed_chunks": 64},
)  # fmt: skip


def split_sweep(chunk: int | None = None) -> list[SplitConfig]:
    """The configs --sweep times, the default first; with `chunk`, only those of that chunk
    (the captured form's chunk is fixed by the step inputs' tables)."""
    configs = [SPLIT_DEFAULT, SPLIT_LEGACY]
    configs += [
        SplitConfig(**{axis: value}) for axis, values in SWEEP_AXES.items() for value in values
    ]
    configs += [SplitConfig(**combined) for combined in SWEEP_COMBINED]
    return [c for c in configs if chunk is None or c.chunk == chunk]


def combine_winners(winners: list[SplitConfig]) -> SplitConfig | None:
    """One config with every field any of `winners` changed from the default (a later winner's
    value where two change the same field): the sweep's per-shape combination; None where
    that combination is not a legal config (e.g. chunk 64 beside 8 warps)."""
    changed: dict[str, object] = {}
    for config in winners:
        for f in dataclasses.fields(config):
            if getattr(config, f.name) != f.default:
                changed[f.name] = getattr(config, f.name)
    try:
        return SplitConfig(**changed)
    except ValueError:
        return None

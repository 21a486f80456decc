"""The split Gated DeltaNet kernel's launch configuration (`SplitConfig`): its chunk size, each
launch's value block, warps and pipeline stages, the fixed grid's program counts, and the
precomputed scores option. The default is session 7's sweep winner on the H200 (below);
`SPLIT_LEGACY` is what the kernels launched before the config existed; `split_sweep()` is
what benchmarks/bench_gdn_kernels.py --sweep tries, each config legal for the H200's compiler
(tests/test_triton_compile.py compiles every one for sm_90). Also `auto`'s threshold between
the one-launch and the split kernel (`SPLIT_FROM_TOKENS`).

Plain Python: the step inputs and the benchmark's argument parsing import it without triton.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.kernels.gdn_tables import CHUNK


def _power_of_two(value: int, low: int, high: int) -> bool:
    return low <= value <= high and not value & (value - 1)


@dataclass(frozen=True)
class SplitConfig:
    """How `gated_delta_chunked_split` and `gated_delta_fixed_grid` launch their kernels.

    - `chunk`: tokens a chunk (C): 16, 32 or 64. The captured form's chunk is the step
      inputs' (`gdn_tables.CHUNK`), which a config run there must equal.
    - `<kernel>_bv`: value columns a program of the states / outputs pass (a power of two >= 8;
      the wrappers cap it at the head's value dim); `<kernel>_warps`, `<kernel>_stages`: the
      launch's num_warps and num_stages (software pipelining of a loop's loads; Triton's
      defaults are 4 and 3).
    - `fixed_recurrent_rows`, `fixed_states_rows`, `fixed_chunks` (the captured form only):
      the programs along a fixed grid's bounded axis, each striding over the rows or chunks
      the step has (`PERSISTENT` in the kernels); None: one program per row or chunk the
      bucket can hold, those past the step's count exiting.
    - `scores_in_prepare`: the prepare pass computes each chunk's masked, decayed q k^T once
      and the outputs pass reads it, instead of every value block of the outputs pass
      recomputing it with the keys' norms and the gates (docs/KERNELS.md, "Tuning").
    """

    # The defaults: the H200 sweep's winning axes (session 7, docs/KERNELS.md "Tuning"): per
    # layer call at 4 x 256 tokens 192 -> 120 us eager, 267 -> 123 us captured; 1 x 384 82 ->
    # 76 us eager, 175 -> 94 us captured; 1 x 1536 278 -> 290 us eager (the one shape it loses),
    # 439 -> 329 captured. Outputs equal to the legacy launch's (same chunk: same sums).
    chunk: int = CHUNK
    prepare_warps: int = 4
    prepare_stages: int = 3
    states_bv: int = 32
    states_warps: int = 2
    states_stages: int = 1
    outputs_bv: int = 64
    outputs_warps: int = 4
    outputs_stages: int = 3
    fixed_recurrent_rows: int | None = 16
    fixed_states_rows: int | None = 4
    fixed_chunks: int | None = 16
    scores_in_prepare: bool = True

    def __post_init__(self) -> None:
        problems = []
        if not _power_of_two(self.chunk, 16, 64):
            problems.append(f"chunk must be 16, 32 or 64, got {self.chunk}")
        for kernel in ("states", "outputs"):
            bv = getattr(self, f"{kernel}_bv")
            if not _power_of_two(bv, 8, 128):
                problems.append(f"{kernel}_bv must be a power of two from 8 to 128, got {bv}")
        for kernel in ("prepare", "states", "outputs"):
            warps, stages = getattr(self, f"{kernel}_warps"), getattr(self, f"{kernel}_stages")
            if not _power_of_two(warps, 1, 16):
                problems.append(f"{kernel}_warps must be 1, 2, 4, 8 or 16, got {warps}")
            if not 1 <= stages <= 6:
                problems.append(f"{kernel}_stages must be 1 to 6, got {stages}")
        for name in ("fixed_recurrent_rows", "fixed_states_rows", "fixed_chunks"):
            count = getattr(self, name)
            if count is not None and count < 1:
                problems.append(f"{name} must be None or a positive count, got {count}")
        wide = [k for k in ("prepare", "states", "outputs") if getattr(self, f"{k}_warps") >= 8]
        if self.chunk == 64 and wide:  # see SWEEP_AXES: wrong outputs on the H200, session 7
            problems.append(
                f"chunk 64 with {', '.join(wide)}_warps >= 8 computed wrong outputs on the H200 "
                "(an illegal address at 4 x 256 tokens); not allowed until a test explains it"
            )
        if problems:
            raise ValueError("; ".join(problems))

    def launch(self, kernel: str) -> dict[str, int]:
        """The launch options of the pass `kernel` (prepare, states, outputs)."""
        return {
            "num_warps": getattr(self, f"{kernel}_warps"),
            "num_stages": getattr(self, f"{kernel}_stages"),
        }

    def __str__(self) -> str:
        """The fields that differ from the default, as `parse_split_config` reads them."""
        changed = [
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != f.default
        ]
        return ",".join(changed) or "default"


SPLIT_DEFAULT = SplitConfig()
# `auto`'s choice, made per step on the host from the longest chunked row (engine's
# gdn_split_from_tokens; this is its default). Measured on the H200, a prefill step beside 64
# decoding rows, piecewise graphs (docs/BENCHMARKS.md, session 7): the split kernel (tuned
# launch) takes 40-82 us of GPU a layer at 128-384 tokens against the one launch's 84-243,
# but ~220 us of host against ~95 (four launches); the step is host-bound below ~256 tokens
# (1 x 128: 6.9 ms split, 4.5 one launch) and GPU-bound above (1 x 384: 6.5 against 7.7;
# 4 x 256: 6.8 against 9.4).
SPLIT_FROM_TOKENS = 256
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


def parse_split_config(text: str) -> SplitConfig:
    """`name=value,...` (SplitConfig's fields; `default` or empty: the default), e.g.
    `chunk=64,prepare_warps=8` or `fixed_states_rows=4,scores_in_prepare=true`."""
    if text.strip() in ("", "default"):
        return SPLIT_DEFAULT
    types = {f.name: f.type for f in dataclasses.fields(SplitConfig)}
    values: dict[str, object] = {}
    for item in text.split(","):
        name, _, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if name not in types:
            raise ValueError(f"unknown split config field {name!r}; fields: {', '.join(types)}")
        if types[name] == "bool":
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"{name} must be true or false, got {raw!r}")
            values[name] = raw.lower() in ("true", "1")
        elif raw.lower() == "none" and "None" in types[name]:
            values[name] = None
        else:
            try:
                values[name] = int(raw)
            except ValueError:
                raise ValueError(f"{name} must be a whole number, got {raw!r}") from None
    return SplitConfig(**values)


# What --sweep tries: one axis at a time around the default (the others at their defaults),
# the legacy launch, and a few combinations whose parts only pay together (more value columns
# a program want more warps). Every entry compiles for sm_90 within the shared memory a block
# may have (tests/test_triton_compile.py); the benchmark then times each and combines each
# shape's winning values of the axes in one more config. Session 7's sweep (around the legacy
# launch) also tried chunk 64 with 8 warps in every pass: its outputs were wrong at 128 and
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

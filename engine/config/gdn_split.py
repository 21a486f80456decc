"""The split Gated DeltaNet kernel's launch configuration (`SplitConfig`, engine.gdn_split):
its chunk size, each launch's value block, warps and pipeline stages, the fixed grid's program
counts, and the precomputed scores option; and `auto`'s threshold between the one-launch and
the split kernel (`SPLIT_FROM_TOKENS`). Plain Python, part of the configuration: a bad
setting is a one-line error where the scenario is read. The kernels read it from here; the
legacy launch and the sweep the benchmark tries are theirs (engine/kernels/gdn_config.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

CHUNK = 32  # tokens a chunk of the split kernel; the step inputs' tables chunk by it too


def _power_of_two(value: int, low: int, high: int) -> bool:
    return low <= value <= high and not value & (value - 1)


@dataclass(frozen=True)
class SplitConfig:
    """How `gated_delta_chunked_split` and `gated_delta_fixed_grid` launch their kernels.

    - `chunk`: tokens a chunk (C): 16, 32 or 64. The captured form's chunk is the step
      inputs' (`CHUNK`), which a config run there must equal.
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

    # The defaults: the H200 sweep's winning axes (docs/KERNELS.md "Tuning"), ahead of the
    # legacy launch at every shape swept but one long eager prefill; outputs equal to the
    # legacy launch's (same chunk: same sums).
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
        if self.chunk == 64 and wide:  # see gdn_config.SWEEP_AXES: wrong outputs on the H200
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
# `auto`'s choice, made per step on the host from the longest chunked row (the default of
# engine.gdn_split_from_tokens). On the H200, a prefill step beside 64 decoding rows on
# piecewise graphs: the split kernel takes less GPU time a layer than the one launch but about
# twice its host time (four launches); the step is host-bound below ~256 tokens and GPU-bound
# above (docs/BENCHMARKS.md).
SPLIT_FROM_TOKENS = 256


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

"""Stop policies: the one place that decides when a loop ends.

A model declares a policy per loop (`get_stop_policies(walk)`); the runtime applies it to a
whole step at once, one array expression over the batch (INVARIANTS 3). The per-request
limits it reads live on the request's runtime info (`StopLimits`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class StopKind(enum.Enum):
    AR = "ar"  # iteration count reaches the cap, or an EOS token unless ignore_eos
    ITER = "iter"  # iteration count only (diffusion, flow matching)
    EOS = "eos"  # the token only; the loop's cap (its budget) is enforced by the runtime


@dataclass(frozen=True)
class StopLimits:
    """One request's limits for one (node, walk)."""

    max_iters: int  # the loop's cap: iterations this walk may run
    eos_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


@dataclass(frozen=True)
class StopColumns:
    """A step's limits gathered per row, as arrays (what `StopPolicy.stops` reads)."""

    counts: np.ndarray  # int64 [R], the loop's iteration count after this step
    caps: np.ndarray  # int64 [R]
    ignore_eos: np.ndarray  # bool [R]
    eos: np.ndarray  # int64 [R, E], padded with -1 (never a token id)


@dataclass(frozen=True)
class StopPolicy:
    kind: StopKind
    token_column: str = "new_token"  # which stop buffer of the model output holds the token

    def stops(self, tokens: np.ndarray, cols: StopColumns) -> tuple[np.ndarray, np.ndarray]:
        """Per-row decision: (stopped, by_token). `by_token` marks EOS stops (finish 'stop')."""
        if self.kind is StopKind.ITER:
            return cols.counts >= cols.caps, np.zeros(len(tokens), dtype=bool)
        by_token = (tokens[:, None] == cols.eos).any(axis=1) & ~cols.ignore_eos
        if self.kind is StopKind.EOS:
            return by_token, by_token
        return by_token | (cols.counts >= cols.caps), by_token


def gather_columns(limits: list[StopLimits], counts: np.ndarray) -> StopColumns:
    """Rows' limits as arrays; the runtime keeps them gathered per handle instead (runtime.py)."""
    width = max([len(lim.eos_ids) for lim in limits] + [1])
    eos = np.full((len(limits), width), -1, dtype=np.int64)
    for row, lim in enumerate(limits):
        eos[row, : len(lim.eos_ids)] = lim.eos_ids
    return StopColumns(
        counts=np.asarray(counts, dtype=np.int64),
        caps=np.array([lim.max_iters for lim in limits], dtype=np.int64),
        ignore_eos=np.array([lim.ignore_eos for lim in limits], dtype=bool),
        eos=eos,
    )

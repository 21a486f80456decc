"""Stop policies: the one place that decides when a loop ends.

A model declares a policy per loop (`get_stop_policies(walk)`); the runtime applies it to a
whole step at once, one array expression over the batch (INVARIANTS 3). The per-request
limits it reads live on the request's runtime info (`StopLimits`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NamedTuple

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

    @property
    def stop_tokens(self) -> tuple[int, ...]:
        """The tokens that end the loop: the EOS ids, or none under ignore_eos. The one place
        ignore_eos is applied; every stop check reads this."""
        return () if self.ignore_eos else tuple(self.eos_ids)


class StopColumns(NamedTuple):
    """A step's limits gathered per row, as arrays (what `StopPolicy.stops` reads)."""

    counts: np.ndarray  # int64 [R], the loop's iteration count after this step
    caps: np.ndarray  # int64 [R]
    stop_tokens: np.ndarray  # int64 [R, E], each row's StopLimits.stop_tokens, padded with -1


@dataclass(frozen=True)
class StopPolicy:
    kind: StopKind
    token_column: str = "new_token"  # which stop buffer of the model output holds the token

    def stops(self, tokens: np.ndarray, cols: StopColumns) -> tuple[np.ndarray, np.ndarray]:
        """Per-row decision: (stopped, by_token). `by_token` marks EOS stops (finish 'stop')."""
        if self.kind is StopKind.ITER:
            return cap_reached(cols), np.zeros(len(tokens), dtype=bool)
        stop = cols.stop_tokens
        by_token = tokens == stop[:, 0]
        for column in range(1, stop.shape[1]):  # a few ids: a column at a time is fastest
            by_token |= tokens == stop[:, column]
        if self.kind is StopKind.EOS:
            return by_token, by_token
        return by_token | cap_reached(cols), by_token


def cap_reached(cols: StopColumns) -> np.ndarray:
    """The count check, in one place: the loop has run its cap of iterations."""
    return cols.counts >= cols.caps


def gather_columns(limits: list[StopLimits], counts: np.ndarray) -> StopColumns:
    """Rows' limits as arrays; the runtime keeps them gathered per handle instead (runtime.py)."""
    width = max([len(lim.stop_tokens) for lim in limits] + [1])
    stop = np.full((len(limits), width), -1, dtype=np.int64)
    for row, lim in enumerate(limits):
        stop[row, : len(lim.stop_tokens)] = lim.stop_tokens
    return StopColumns(
        counts=np.asarray(counts, dtype=np.int64),
        caps=np.array([lim.max_iters for lim in limits], dtype=np.int64),
        stop_tokens=stop,
    )

"""When an open-loop load sends each request: a gamma process at a mean rate, drawn from the
load's seed, so every arm, slot and shard sees the same arrivals (docs/LOADGEN.md).

As vLLM's `bench serve` draws them: the gaps between arrivals are gamma-distributed with
shape `burstiness` and mean 1/rate; burstiness 1 is a Poisson process (exponential gaps),
below 1 burstier, above 1 more regular. Request 0 arrives at time 0.
"""

from __future__ import annotations

import math
from functools import cached_property

import msgspec
import numpy as np

SALT = 0x0A11  # keeps the arrival draws apart from the requests' (seeded with (seed, index))


class ArrivalSchedule(msgspec.Struct, frozen=True, dict=True):
    rate: float  # mean requests per second; inf: all at once
    burstiness: float
    seed: int
    count: int

    def __post_init__(self):
        if not self.rate > 0 or not self.burstiness > 0:
            raise ValueError("the request rate and the burstiness must be > 0")

    @cached_property
    def times(self) -> np.ndarray:
        """Seconds from the load's start at which each request is due."""
        if math.isinf(self.rate):
            return np.zeros(self.count)
        rng = np.random.default_rng([self.seed, SALT])
        gaps = rng.gamma(self.burstiness, 1.0 / (self.rate * self.burstiness), self.count)
        return np.concatenate([[0.0], np.cumsum(gaps[:-1])])

    def __getitem__(self, index: int) -> float:
        return float(self.times[index])

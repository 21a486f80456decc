"""How long a deciding run would take on this machine, from a block's own servers.

`bench run` on a CPU says it after its first block (docs/STATISTICS.md, "Noise on a CPU"):
the servers' spread with the arm effect taken out, one server's residual spread, and the
blocks (and minutes, at this block's wall time) at which the headline would likely be decided
either way (`block_model._blocks_needed` at its worst case, half the margin: every outcome
decisive). One block's residuals have 2 degrees of freedom (A B B A), so the figure is a
rough one; the run's own "blocks needed" after its last block is the better one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from harness.analysis.block_model import Design, _blocks_needed, fit, residuals
from harness.analysis.metrics import steady_tok_per_s, steady_window
from harness.analysis.schema import RequestRecord, ServerRecord
from harness.analysis.stats import usable
from harness.analysis.verdict import Rule


@dataclass(frozen=True)
class DecidingEstimate:
    servers: int
    spread: float  # max/min - 1 of the servers' values, B's arm effect taken out
    sd: float  # one server's residual spread (log units, the model's)
    blocks: int | None  # blocks in all that would likely decide; None: cannot say
    block_s: float  # this block's wall time

    @property
    def seconds(self) -> float | None:
        return None if self.blocks is None else self.blocks * self.block_s


def deciding_estimate(
    values: pd.DataFrame, block_s: float, rule: Rule = Rule()
) -> DecidingEstimate | None:
    """From per-server values (columns letter, block, value; one block or more): the estimate,
    or None where the servers leave no residual (fewer than 3 usable, or one arm missing)."""
    rows = usable(values, "A", "B")
    design = Design(rows["block"].to_numpy(), (rows["letter"] == "B").to_numpy())
    if not design.block_count or design.df < 1:
        return None
    logs = np.log(rows["value"].to_numpy(float))
    left = residuals(logs, design)
    sd = float(math.sqrt(np.mean(left**2)))
    adjusted = logs - float(fit(logs, design)[0]) * design.is_b
    spread = float(math.expm1(adjusted.max() - adjusted.min()))
    blocks = _blocks_needed(sd, design, rule)
    return DecidingEstimate(len(rows), spread, sd, blocks, block_s)


def slot_values(slots: Sequence[tuple[ServerRecord, list[RequestRecord]]]) -> pd.DataFrame:
    """Each slot's steady output tok/s (letter, block, value), from its records as measured."""
    rows = []
    for server, records in slots:
        frame = pd.DataFrame([asdict(r) for r in records])
        value = steady_tok_per_s(frame, steady_window(server)) if len(frame) else float("nan")
        rows.append({"letter": server.letter, "block": server.block, "value": value})
    return pd.DataFrame(rows, columns=["letter", "block", "value"])

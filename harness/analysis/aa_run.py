"""What the real A/A run's own blocks say of the headline (docs/POWER.md): how often runs of k
consecutive blocks raise a false alarm, and how far a server's position in its block moves
it (`real_aa`). Pure functions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from harness.analysis.block_model import MIN_BLOCKS
from harness.analysis.power_stats import BLOCK_SIZE
from harness.analysis.stats import paired_change
from harness.analysis.student_t import t_quantile
from harness.analysis.verdict import FASTER, SLOWER, Rule


@dataclass
class PositionEffect:
    """One position of the A/A blocks: how far its servers sat from their block's mean."""

    position: int  # 0..3 within the block
    letters: str  # the arm at this position in each block, e.g. "ABAB"
    mean: float | None  # mean log deviation from the block mean (about a relative offset)
    low: float | None  # t-interval over the blocks (level 0.95)
    high: float | None


@dataclass
class RealAA:
    """The headline figure over the real A/A blocks: false alarms of runs of k consecutive
    blocks (the blocks split into disjoint groups of k), and position effects."""

    blocks: int
    alarms: dict[int, list[int]]  # k -> [runs called faster or slower, runs of k blocks]
    positions: list[PositionEffect]
    outer_minus_inner: PositionEffect | None  # positions 0 and 3 against 1 and 2


def real_aa(values: pd.DataFrame, higher_is_better: bool, rule: Rule = Rule()) -> RealAA | None:
    """The real A/A blocks of one figure (columns letter, block, slot, value): how often runs
    of k consecutive blocks raise a false alarm (k from MIN_BLOCKS: one block gives no
    verdict), and where in a block its servers sat."""
    values = values[values["value"] > 0]
    blocks = sorted(values["block"].unique())
    if not blocks:
        return None
    alarms = {}
    for k in range(MIN_BLOCKS, len(blocks) + 1):
        groups = [blocks[i : i + k] for i in range(0, len(blocks) - k + 1, k)]
        found = [
            paired_change(values[values["block"].isin(g)], "A", "B", higher_is_better, rule)
            for g in groups
        ]
        alarms[k] = [sum(c.verdict in (FASTER, SLOWER) for c in found), len(found)]
    logs = values.assign(log=np.log(values["value"].astype(float)))
    logs["deviation"] = logs["log"] - logs.groupby("block")["log"].transform("mean")
    logs["position"] = logs["slot"] - logs.groupby("block")["slot"].transform("min")
    positions = []
    for position, rows in logs.groupby("position", sort=True):
        order = "".join(rows.sort_values("block")["letter"])
        positions.append(_mean_interval(rows["deviation"], int(position), order))
    outer = logs["position"].isin([0, BLOCK_SIZE - 1])
    by_block = logs[outer].groupby("block")["deviation"].mean()
    by_block -= logs[~outer].groupby("block")["deviation"].mean()
    contrast = _mean_interval(by_block.dropna(), -1, "outer - inner")
    return RealAA(len(blocks), alarms, positions, contrast)


def _mean_interval(deviations: pd.Series, position: int, letters: str) -> PositionEffect:
    x = deviations.to_numpy(float)
    if len(x) < 2:
        mean = float(x.mean()) if len(x) else None
        return PositionEffect(position, letters, mean, None, None)
    half = t_quantile(0.95, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return PositionEffect(position, letters, float(x.mean()), x.mean() - half, x.mean() + half)

"""How often `bench power`'s intervals hold the true rate (docs/POWER.md, "How far to trust
it"): one synthetic setup (server noise 5%, block offsets 5%, normal) analysed again and
again, each analysis a fresh pool of m whole blocks, its detection rate of a planted +10% at
3 blocks and its false-positive rate quoted with their 95% intervals, against the setup's
true rates (200,000 fresh runs).

    python scripts/power_coverage.py [--analyses 200] [--pools 3,6,12,24]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis.block_model import Design, judge, schedule
from harness.analysis.power_stats import Experiments  # noqa: E402
from harness.analysis.verdict import FASTER, SLOWER, Rule

BLOCKS, SIGMA = 3, 0.05


def pool(count: int, rng) -> np.ndarray:
    return rng.normal(0, SIGMA, (count, 4)) + rng.normal(0, 0.05, (count, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--analyses", type=int, default=200)
    parser.add_argument("--pools", default="3,6,12,24")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    design = Design.of(schedule(BLOCKS, abba=True), 4)
    fresh = pool(200_000 * BLOCKS, rng).reshape(200_000, 4 * BLOCKS)
    slowed = fresh - math.log1p(0.1) * design.is_b
    true_found = float((judge(slowed, design, True, Rule())[3] == SLOWER).mean())
    true_fp = float(np.isin(judge(fresh, design, True, Rule())[3], [FASTER, SLOWER]).mean())
    print(f"true: +10% found {true_found:.1%}, false positives {true_fp:.1%} ({BLOCKS} blocks)\n")
    print("| pool (blocks) | +10% found: quoted (5-95% of analyses) | interval holds it |", end="")
    print(" false pos.: quoted | interval holds it |")
    print("|--:|--:|--:|--:|--:|")
    for count in (int(x) for x in args.pools.split(",")):
        found, fp = [], []
        for _ in range(args.analyses):
            runs = Experiments.of(pool(count, rng), BLOCKS, True, 1000, rng)
            found.append(runs.detection_rate(0.1))
            fp.append(runs.false_positive_rate())
        cells = []
        for rates, truth in ((found, true_found), (fp, true_fp)):
            quoted = np.percentile([r.value for r in rates], [5, 95])
            held = np.mean([r.low <= truth <= r.high for r in rates])
            cells += [f"{quoted[0]:.0%}..{quoted[1]:.0%}", f"{held:.0%}"]
        print(f"| {count} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

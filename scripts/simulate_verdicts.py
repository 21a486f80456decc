"""The verdicts' error rates, coverage and power over seeded synthetic runs: the tables of
docs/STATISTICS.md ("Checked by simulation").

    python scripts/simulate_verdicts.py [--runs 20000]

Each synthetic run has one log value per server of `bench run`'s schedule: a block offset
(sd 5%), a drift of 1% per slot, server noise (sd 5% unless a table says otherwise), and arm
B's true change; it is judged by the harness's own interval and verdict
(harness.analysis.simulation, which tests/test_verdict_simulation.py holds to bounds).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.analysis.simulation import Noise, auto_rates, between_runs, rates  # noqa: E402


def pct(x: float) -> str:
    return f"{x:.1%}"


SPREADS = (0.01, 0.03, 0.08)  # server-to-server noise: an H200's, a quiet CPU's, a busy one's
SLOWDOWNS = {"3%": -math.log(1.03), "10%": -math.log(1.10)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    runs = parser.parse_args().runs
    drift = Noise(server=0.05, block=0.05, drift=0.01)

    print(f"A/A, ABBA / BAAB blocks: slower / faster or slower ({runs:,} runs per cell)\n")
    heads = [f"spread {n:.0%}, drift {d:.0%}" for n in SPREADS for d in (0.0, 0.01)]
    print("| blocks | " + " | ".join(heads) + " |")
    print("|--:|" + "--:|" * len(heads))
    for blocks in range(1, 7):
        cells = []
        for n in SPREADS:
            for d in (0.0, 0.01):
                r = rates(blocks, Noise(server=n, block=0.05, drift=d), runs=runs, seed=blocks)
                cells.append(f"{pct(r.slower)} / {pct(r.any_verdict)}")
        print(f"| {blocks} | " + " | ".join(cells) + " |")

    print("\nA planted slowdown called slower, ABBA / BAAB blocks, 1% drift per slot\n")
    heads = [f"{name} at spread {n:.0%}" for name in SLOWDOWNS for n in SPREADS]
    print("| blocks | " + " | ".join(heads) + " |")
    print("|--:|" + "--:|" * len(heads))
    for blocks in range(1, 7):
        cells = [
            pct(rates(blocks, Noise(n, 0.05, 0.01), effect, runs=runs, seed=blocks).slower)
            for effect in SLOWDOWNS.values()
            for n in SPREADS
        ]
        print(f"| {blocks} | " + " | ".join(cells) + " |")

    print("\n--blocks auto --max-blocks 8 (looks at 2..8 blocks; 1% drift per slot)\n")
    print("| spread | A/A slower | A/A any verdict | A/A blocks | 3% found | 3% blocks"
          " | 10% found | 10% blocks |")  # fmt: skip
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    for n in SPREADS:
        noise = Noise(server=n, block=0.05, drift=0.01)
        aa = auto_rates(8, noise, runs=runs, seed=7)
        cells = [pct(aa.rates.slower), pct(aa.rates.any_verdict), f"{aa.mean_blocks:.1f}"]
        for effect in SLOWDOWNS.values():
            found = auto_rates(8, noise, effect, runs=runs, seed=8)
            cells += [pct(found.rates.slower), f"{found.mean_blocks:.1f}"]
        print(f"| {n:.0%} | " + " | ".join(cells) + " |")

    print("\nA/A with a position effect or a cold first server, server noise 5%, 1% drift:")
    print("faster or slower, the interval alone (what one block said before) / the verdict\n")
    outer = {share: (math.log(share), 0.0, 0.0, math.log(share)) for share in (0.75, 0.90)}
    effects = {
        "outer servers 25% slower": replace(drift, positions=outer[0.75]),
        "outer servers 10% slower": replace(drift, positions=outer[0.90]),
        "first server 25% slower": replace(drift, first=math.log(0.75)),
    }
    print("| blocks | " + " | ".join(effects) + " |")
    print("|--:|" + "--:|" * len(effects))
    for blocks in range(1, 7):
        found = [rates(blocks, noise, runs=runs, seed=50 + blocks) for noise in effects.values()]
        cells = [f"{pct(r.interval_alone)} / {pct(r.any_verdict)}" for r in found]
        print(f"| {blocks} | " + " | ".join(cells) + " |")

    print("\nbench compare of A/A recorded runs of 3 blocks each, server noise 5%\n")
    print("| run-to-run spread | blocks paired by order (before) | 1 run a side | 3 runs a side |")
    print("|--:|--:|--:|--:|")
    for spread in (0.0, 0.02, 0.05):
        noise = Noise(server=0.05, block=0.05, drift=0.0, run=spread)
        by_order = between_runs(1, 3, noise, by_order=True, runs=runs, seed=1)
        one = between_runs(1, 3, noise, runs=runs, seed=2)
        three = between_runs(3, 3, noise, runs=runs, seed=3)
        cells = [
            f"slower {pct(by_order.slower)}",
            "no verdict" if one.any_verdict == 0 else pct(one.slower),
            f"slower {pct(three.slower)}, any {pct(three.any_verdict)}",
        ]
        print(f"| {spread:.0%} | " + " | ".join(cells) + " |")


def nightly() -> None:
    from harness.analysis.step_simulation import nightly_table

    print("\nbench nightly's step test (a step lasting 3 commits; harness/analysis/steps.py)\n")
    print(nightly_table(20_000))


if __name__ == "__main__":
    main()
    nightly()

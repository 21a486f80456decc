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

from harness.analysis.simulation import Noise, between_runs, rates  # noqa: E402

SLOWDOWN = -math.log(1.10)  # a 10% slowdown of a throughput, log B/A


def pct(x: float) -> str:
    return f"{x:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20_000)
    runs = parser.parse_args().runs
    drift = Noise(server=0.05, block=0.05, drift=0.01)

    print(f"A/A, 1% drift per server, server noise 5% ({runs:,} runs per row)\n")
    print("| blocks | schedule | df | slower | faster or slower | no change | CI holds 0 |")
    print("|--:|---|--:|--:|--:|--:|--:|")
    for abba in (True, False):
        for blocks in range(1, 7):
            r = rates(blocks, drift, runs=runs, seed=blocks, abba=abba)
            size = 4 if abba else 2
            df = size * blocks - blocks - 1
            order = "ABBA / BAAB" if abba else "AB / BA"
            row = [str(blocks), order, str(df) if df > 0 else "-"]
            row += [pct(r.slower), pct(r.any_verdict), pct(r.no_change), pct(r.covered)]
            print("| " + " | ".join(row) + " |")

    print("\nA planted 10% slowdown (throughput / 1.1), ABBA / BAAB blocks: called slower\n")
    noises = (0.03, 0.05, 0.08)
    print(
        "| blocks | "
        + " | ".join(f"server noise {n:.0%}" for n in noises)
        + " | CI holds it (5%) |"
    )
    print("|--:|" + "--:|" * (len(noises) + 1))
    for blocks in range(1, 7):
        found = [
            rates(blocks, Noise(server=n, block=0.05, drift=0.01), SLOWDOWN, runs=runs, seed=blocks)
            for n in noises
        ]
        cells = [pct(f.slower) for f in found] + [pct(found[1].covered)]
        print(f"| {blocks} | " + " | ".join(cells) + " |")

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


if __name__ == "__main__":
    main()

"""The synthetic rates of a finished `bench power` run again, with more draws: the
false-positive, detection and coverage rates of a planted +10% for n blocks, each with its
interval, drawn from the run's own whole blocks (docs/POWER.md, method 4-5).

    python scripts/power_resample.py results/power/<run-id> [--draws 20000] [--seed 123]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from harness.analysis import power
from harness.analysis.power_stats import Experiments, aa_blocks, null_blocks
from harness.results import load_run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="scripts/power_resample.py")
    parser.add_argument("run", type=Path, help="a bench power run directory")
    parser.add_argument("--draws", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=123)
    parser.add_argument("--figure", default="output_tok_per_s", choices=list(power.FIGURES))
    args = parser.parse_args(argv)
    configurations = sorted(p for p in args.run.iterdir() if (p / "manifest.json").is_file())
    pool = np.concatenate([
        (aa_blocks if p.name == "aa" else null_blocks)(
            power._figure(power.server_values(load_run(p)[1]), args.figure)
        )
        for p in configurations
    ])  # fmt: skip
    sd = power.within_sd(pool)
    print(f"{args.figure}: {len(pool)} blocks, server sd {sd:.4f}; {args.draws} draws a row")
    print("blocks  false pos.          +10% found          CI holds +10%")
    higher = power.FIGURES[args.figure]
    for n in (2, 3, 5, 6, 10):
        ex = Experiments.of(pool, n, higher, args.draws, np.random.default_rng(args.seed))
        cells = [ex.false_positive_rate(), ex.detection_rate(0.1), ex.coverage(0.1)]
        print(f"{n:6d}  " + "  ".join(f"{shown(r):18}" for r in cells))


def shown(rate) -> str:
    return f"{rate.value:.1%} ({rate.low:.1%}..{rate.high:.1%})"


if __name__ == "__main__":
    main()

"""The synthetic rates of a finished `bench power` run again, with more draws: the
false-positive, detection and coverage rates of a planted +10% for n blocks, resampled from
the run's own server residuals (docs/POWER.md, method 4-5).

    python scripts/power_resample.py results/power/<run-id> [--draws 20000] [--seed 123]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from harness.analysis import power
from harness.analysis.power_stats import Experiments, experiments, run_residuals
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
        run_residuals(power._figure(power.server_values(load_run(p)[1]), args.figure))
        for p in configurations
    ])  # fmt: skip
    rms = float(np.sqrt(np.mean(pool**2)))
    print(f"{args.figure}: {len(pool)} residuals, rms {rms:.4f}; {args.draws} draws a row")
    print("blocks  false pos.  +10% found  CI holds +10%")
    for n in (1, 2, 3, 5, 6, 10):
        design = power.Design.of(power.schedule(n, abba=True), power.BLOCK_SIZE)
        noise = experiments(pool, design, args.draws, np.random.default_rng(args.seed))
        ex = Experiments(noise, design, higher_is_better=power.FIGURES[args.figure])
        print(
            f"{n:6d}  {ex.false_positive_rate():10.1%}  {ex.detection_rate(0.1):10.1%}"
            f"  {ex.coverage(0.1):13.1%}"
        )


if __name__ == "__main__":
    main()

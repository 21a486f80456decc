"""How steady this machine's cores are: the noise no layout or schedule can take out.

A CPU run's servers read far apart (issue 41, docs/STATISTICS.md "Noise on a CPU"). This
script separates the machine's share from the run's:

- `cores`: the same fixed torch work (a 256x512 @ 512x512 matmul and a 16 MB copy, one thread)
  runs on each core at once for `--seconds`, and the rate is printed per `--window` seconds:
  each core's coefficient of variation, its max/min - 1, and the correlation of the cores'
  rates. Nothing else runs: a rate that wanders by tens of percent over seconds is the host's
  (other tenants of a virtual machine's physical cores, their caches and memory bandwidth),
  invisible to the guest as steal time or outside CPU.
- `--run DIR`: one server's own steady tok/s in consecutive windows (a `bench measure` run
  with many requests): what a fresh server's figure would vary by if every server were the
  same process.
- `--pair DIR DIR`: two servers loaded at the same time, both workers on one core
  (scripts/duet_pairs.sh): each one's tok/s over the time both were loaded, their ratio, and the
  correlation of their 2-s rates (how much of the machine's noise the two share).

    python scripts/machine_noise.py cores --seconds 30
    python scripts/machine_noise.py --run results/<id> --window 4
    python scripts/machine_noise.py --pair /tmp/duet/m1-18001 /tmp/duet/m1-18002
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.analysis.metrics import token_times  # noqa: E402


def _core_rates(core: int, seconds: float, window: float, out) -> None:
    os.sched_setaffinity(0, {core})
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(256, 512), torch.randn(512, 512)
    src, dst = torch.randn(4 << 20), torch.empty(4 << 20)

    def work() -> None:
        for _ in range(10):
            a @ b
        dst.copy_(src)

    work()
    rates, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        start, n = time.perf_counter(), 0
        while time.perf_counter() - start < window:
            work()
            n += 1
        rates.append(n / (time.perf_counter() - start))
    out.put((core, rates))


def cores(seconds: float, window: float) -> None:
    queue = mp.get_context("fork").Queue()
    count = os.cpu_count() or 1
    procs = [
        mp.get_context("fork").Process(target=_core_rates, args=(c, seconds, window, queue))
        for c in range(count)
    ]
    for p in procs:
        p.start()
    got = dict(queue.get() for _ in procs)
    for p in procs:
        p.join()
    for core in sorted(got):
        _line(f"core {core}", np.asarray(got[core]), window)
    if len(got) > 1:
        n = min(len(r) for r in got.values())
        corr = np.corrcoef([got[c][:n] for c in sorted(got)])
        print(f"correlation of the cores' rates: {corr[np.triu_indices(len(got), 1)].round(2)}")


def server_windows(run: Path, window: float) -> None:
    import pandas as pd

    records = pd.read_parquet(run / "requests.parquet")
    for server, rows in records[~records["warmup"]].groupby("server"):
        stamps = np.sort(token_times(rows))
        edges = np.arange(stamps[0] + window, stamps[-1] - window, window)  # ramps left out
        if len(edges) < 3:
            print(f"{server}: too short for {window} s windows")
            continue
        _line(f"{server} output tok/s", np.histogram(stamps, edges)[0] / window, window)


def _stamps(run: Path) -> np.ndarray:
    """Every measured token's time (unix seconds) of a one-server run."""
    import pandas as pd

    server = pd.read_parquet(run / "servers.parquet").iloc[0]
    records = pd.read_parquet(run / "requests.parquet")
    return np.sort(token_times(records[~records["warmup"]])) + server["t0_unix"]


def pair(a_run: Path, b_run: Path, trim: float = 3.0) -> None:
    a, b = _stamps(a_run), _stamps(b_run)
    lo, hi = max(a[0], b[0]) + trim, min(a[-1], b[-1]) - trim
    rate_a, rate_b = (((t >= lo) & (t < hi)).sum() / (hi - lo) for t in (a, b))
    edges = np.arange(lo, hi, 2.0)
    corr = np.corrcoef(np.histogram(a, edges)[0], np.histogram(b, edges)[0])[0, 1]
    print(
        f"both loaded {hi - lo:.1f} s: {rate_a:.0f} and {rate_b:.0f} output tok/s,"
        f" second/first - 1 {rate_b / rate_a - 1:+.1%}; 2-s rates correlated {corr:+.2f}"
    )


def _line(label: str, rates: np.ndarray, window: float) -> None:
    print(
        f"{label}: {len(rates)} windows of {window:g} s, mean {rates.mean():.1f},"
        f" cv {rates.std() / rates.mean():.1%}, max/min - 1 {rates.max() / rates.min() - 1:.1%}"
    )
    print("  " + " ".join(f"{r:.0f}" for r in rates))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", nargs="?", choices=["cores"], help="probe the cores")
    parser.add_argument("--run", type=Path, help="a bench measure run: one server's windows")
    parser.add_argument("--pair", type=Path, nargs=2, help="two runs loaded at one time")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--window", type=float, default=None, help="seconds (cores 0.5, run 4)")
    args = parser.parse_args(argv)
    if args.pair is not None:
        pair(*args.pair)
    elif args.run is not None:
        server_windows(args.run, args.window or 4.0)
    elif args.what == "cores":
        cores(args.seconds, args.window or 0.5)
    else:
        parser.error("give `cores` or --run DIR")


if __name__ == "__main__":
    sys.exit(main())

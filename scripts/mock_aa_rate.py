"""How often an A/A run on one `bench mock` reads a verdict: the load of tests/test_verdicts.py
(a mock at 8 ms a token, -c 8, 2 ABBA blocks) run N times through `bench run`, both arms the
same URL. Prints one JSON line a run (verdict, ratio, interval, the servers' values), then the
verdicts counted and the servers' mean by position, so a bias (a cold first server, a position
effect) shows apart from chance (docs/STATISTICS.md, "The confidence level").

    python scripts/mock_aa_rate.py --runs 40 [--confidence 0.95]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from harness.measure.server import free_port  # noqa: E402

LOAD = ["-c", "8", "--requests", "24", "--warmup", "8", "--output-len", "16", "--input-len", "8"]


def start_mock() -> tuple[subprocess.Popen, str]:
    port = free_port()
    command = [sys.executable, "-m", "harness", "mock", "--port", str(port), "--ttft-ms", "2"]
    proc = subprocess.Popen([*command, "--itl-ms", "8.0"], cwd=ROOT, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the mock did not start")


def one_run(url: str, out: Path, confidence: float) -> dict:
    command = [sys.executable, "-m", "harness", "run", "qwen35", "--abba", *LOAD,
               "--arm", f"a={url}", "--arm", f"b={url}", "--allow-interference",
               "--confidence", str(confidence), "--out", str(out), "--overwrite", "--json"]  # fmt: skip
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    summary = json.loads(proc.stdout)
    headline = next(f for f in summary["figures"] if f["figure"] == summary["headline"])
    change = headline["change"]
    return {
        "exit": proc.returncode, "verdict": change["verdict"], "ratio": change["ratio"],
        "low": change["low"], "high": change["high"],
        "a": headline["servers_a"], "b": headline["servers_b"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--confidence", type=float, default=0.95)
    args = parser.parse_args()
    proc, url = start_mock()
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.runs):
                rows.append(one_run(url, Path(tmp) / "run", args.confidence))
                print(json.dumps({"run": i, **rows[-1]}), flush=True)
    finally:
        proc.terminate()
    counts = collections.Counter(r["verdict"] for r in rows)
    a, b = np.array([r["a"] for r in rows]), np.array([r["b"] for r in rows])
    first = a[:, 0] / np.concatenate([a[:, 1:], b], axis=1).mean(axis=1)
    print(f"verdicts: {dict(counts)} of {len(rows)} (at {args.confidence:.2%} a false one is"
          f" expected in {1 - args.confidence:.1%})")  # fmt: skip
    print(f"A by position (A0 A3 A5 A6) {a.mean(axis=0).round(1).tolist()}, B (B1 B2 B4 B7)"
          f" {b.mean(axis=0).round(1).tolist()}; the first server over the rest"
          f" {first.mean():.4f} (sd {first.std():.4f})")  # fmt: skip


if __name__ == "__main__":
    main()

"""asv benchmarks (asv.conf.json, docs/NIGHTLY.md).

The code measured is BENCH_TREE's (`bench nightly` points it at a worktree of the commit it
records, BENCH_COMMIT), or this repository's when it is unset. BENCH_TREE goes first on
sys.path and this repository after it, so the microbenchmarks time the commit's `engine`; a
commit whose engine lacks what a benchmark calls records a failed benchmark
(docs/NIGHTLY.md). The session benchmark runs the commit's engine as servers under this
repository's harness, in a process of its own (bench_session.py), so every commit is measured
by one harness version.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TREE = Path(os.environ.get("BENCH_TREE") or REPO).resolve()
COMMIT = os.environ.get("BENCH_COMMIT")  # None: the tree as it is, uncommitted edits included

for _path in dict.fromkeys((str(REPO), str(TREE))):  # the last inserted goes first
    if _path not in sys.path:
        sys.path.insert(0, _path)

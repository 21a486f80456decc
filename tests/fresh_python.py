"""Run a snippet in a fresh interpreter at the repository root: what a new process imports
(tests that hold start-up costs, e.g. no torch in the API server)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def fresh_python(code: str) -> str:
    """`code`'s stdout, stripped; the test fails with its stderr if it exits non-zero."""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()

"""Mutation check of the stop-policy code.

    python scripts/mutation_stops.py          # the named mutants, then mutmut over stops.py
    python scripts/mutation_stops.py --named  # the named mutants only (seconds)

Named mutants are the bugs the tests must catch (an off-by-one in the count check, ignoring
ignore_eos); each is applied to the source, the stop-policy tests run, and the source is
restored. Then mutmut mutates engine/runtime/stops.py exhaustively and reports its score.
Results are recorded in docs/MUTATION.md.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_stop_policies.py", "tests/test_postprocess.py"]
NAMED = [
    ("count check off by one", "engine/runtime/stops.py",
     "return cols.counts >= cols.caps", "return cols.counts > cols.caps"),
    ("EOS kind: the runtime skips the cap", "engine/runtime/runtime.py",
     "stopped = stopped | cap_reached(cols)", "pass"),
    ("ignore_eos ignored", "engine/runtime/stops.py",
     "return () if self.ignore_eos else tuple(self.eos_ids)", "return tuple(self.eos_ids)"),
    ("EOS never checked", "engine/runtime/stops.py",
     "by_token = tokens == stop[:, 0]", "by_token = tokens == -2"),
    ("limits of a recycled handle kept", "engine/runtime/runtime.py",
     "self.packed[handle, self.HAS] = 0", "pass"),
]  # fmt: skip


def run_tests() -> bool:
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *TESTS]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True).returncode == 0


def named_mutants() -> int:
    if not run_tests():  # a mutant is "killed" only if the unmutated source passes
        raise SystemExit(
            f"the stop-policy tests fail without any mutant; fix that first: "
            f"{sys.executable} -m pytest {' '.join(TESTS)}"
        )
    survived = 0
    for label, rel, old, new in NAMED:
        path = ROOT / rel
        source = path.read_text()
        if source.count(old) != 1:
            raise SystemExit(
                f"mutant {label!r}: {old!r} not found once in {rel}; update the script"
            )
        try:
            path.write_text(source.replace(old, new))
            passed = run_tests()
        finally:
            path.write_text(source)
        survived += passed
        print(f"{'SURVIVED' if passed else 'killed  '}  {label}")
    return survived


def mutmut() -> None:
    runner = f"{sys.executable} -m pytest -x -q -p no:cacheprovider " + " ".join(TESTS)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "mutmut",
            "run",
            "--paths-to-mutate",
            "engine/runtime/stops.py",
            "--runner",
            runner,
            "--no-progress",
        ],
        cwd=ROOT,
    )
    subprocess.run([sys.executable, "-m", "mutmut", "results"], cwd=ROOT)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--named", action="store_true", help="named mutants only")
    args = parser.parse_args()
    survived = named_mutants()
    if not args.named:
        mutmut()
    sys.exit(1 if survived else 0)


if __name__ == "__main__":
    main()

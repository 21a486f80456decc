"""The micro-benchmarks' shared command-line option types (argparse) and their `--json`
output."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass

# A worker benchmark's --loop: the worker's loops it runs, a fresh worker each
LOOPS = {"strict": ("strict",), "overlapped": ("overlapped",), "both": ("strict", "overlapped")}


@dataclass(frozen=True)
class LoopSettings:
    """One measurement of a worker benchmark (bench_orpheus_iteration, bench_decode_loop):
    the worker as a size builds it, its loop, and the iterations timed."""

    size: str
    device: str | None  # None: the size's
    loop: str  # "strict" | "overlapped"
    requests: int
    prompt: int  # tokens (a speech prompt's markers included)
    warmup: int
    iterations: int
    profile_iterations: int = 0  # 0: no profile


def add_loop_options(parser: argparse.ArgumentParser, loop: str) -> None:
    """A worker benchmark's options for LoopSettings' worker: --size, --device, --loop (its
    default `loop`), --requests."""
    parser.add_argument("--size", default=None, help="default: the scenario's for this machine")
    parser.add_argument("--device", default=None, help="default: the size's")
    parser.add_argument("--loop", default=loop, choices=list(LOOPS))
    parser.add_argument("--requests", type=positive_int, default=64)


def positive_int(text: str) -> int:
    """A count that must be at least 1: samples to time (none give no summary to print, and
    the benchmark would fail after its set-up), rows, windows. argparse prints the message
    on one line after the usage and exits 2."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def append_json_lines(path: str, records: Iterable) -> None:
    """`--json PATH`: each record (a dataclass) appended to PATH as one JSON line."""
    with open(path, "a") as out:
        for record in records:
            out.write(json.dumps(asdict(record)) + "\n")

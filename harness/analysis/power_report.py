"""What `bench power` found, as a record (docs/POWER.md): a `PowerReport` of each figure's
rates by block count, the planted levels' verdicts and the real A/A run's, stamped with the
setup it was measured on (`stamp`); and how a stored report is read back: its rates at a block
count (`rates_for`) and how its setup differs from a run's (`mismatch`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from harness.analysis.aa_run import RealAA
from harness.analysis.power_stats import Rate

MACHINE_KEYS = ("host", "cpu", "cpus", "gpu")  # what makes two machines the same for noise


@dataclass
class FigurePower:
    figure: str
    higher_is_better: bool
    cv: float | None  # spread of the per-server values across the A/A run's servers
    noise_sd: float | None  # a server's noise within its block (log units), the pool's
    aa_verdict: str  # the verdict of the real A/A run
    # blocks -> the rate and its interval (None without a pool)
    false_positive_rate: dict[int, Rate | None]  # share called faster or slower
    min_detectable_slowdown: dict[int, Rate | None]  # +x time per unit of work
    detection: dict[int, Rate | None]  # share of a planted +10% called slower
    coverage: dict[int, Rate | None]  # share of intervals holding that +10%
    pool: int = 0  # whole blocks the rates rest on


@dataclass
class LevelResult:
    fraction: float
    delay_us: int
    run_dir: str
    expected: dict[str, float | None]  # figure -> B/A the delay should give on this run's A
    measured: dict[str, dict]  # figure -> the run's Change (ratio, low, high, verdict, ...)


@dataclass
class PowerReport:
    scenario: str
    size: str
    machine: dict
    blocks: int
    concurrency: int
    requests: int
    iteration_ms: float | None
    postprocess_ms: float | None
    figures: list[FigurePower]
    levels: list[LevelResult]
    run_dir: str
    pool_size: int = 0  # whole blocks the rates rest on (the smallest over the figures)
    real_aa: RealAA | None = None
    doubts: list[str] = field(default_factory=list)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def quoted_blocks(self) -> int:
        """The block count the headline numbers are for."""
        return self.blocks

    def stamp(self) -> dict:
        """What the figures hold for: a report of another setup must not quote them."""
        machine = {key: self.machine.get(key) for key in MACHINE_KEYS}
        return {
            "scenario": self.scenario,
            "size": self.size,
            "machine": machine,
            "concurrency": self.concurrency,
            "blocks": self.blocks,
        }

    def to_json(self) -> dict:
        n = self.quoted_blocks
        return {
            "stamp": self.stamp(),
            "scenario": self.scenario,
            "size": self.size,
            "machine": self.machine,
            "blocks": self.blocks,
            "false_positive_rate": {
                f.figure: _plain(f.false_positive_rate, n) for f in self.figures
            },
            "min_detectable_slowdown": {
                f.figure: _plain(f.min_detectable_slowdown, n) for f in self.figures
            },
            "noise": {f.figure: f.cv for f in self.figures},
            "levels": [asdict(level) for level in self.levels],
            "created": self.created,
            "quoted_blocks": n,
            "concurrency": self.concurrency,
            "requests": self.requests,
            "iteration_ms": self.iteration_ms,
            "postprocess_ms": self.postprocess_ms,
            "figures": [asdict(f) for f in self.figures],
            "real_aa": asdict(self.real_aa) if self.real_aa else None,
            "run_dir": self.run_dir,
            "pool_size": self.pool_size,
            "doubts": self.doubts,
        }


def _plain(rates: dict[int, Rate | None], n: int) -> float | None:
    rate = rates.get(n)
    return rate.value if rate else None


def mismatch(power: dict, manifest: dict) -> list[str]:
    """How the setup a power result was measured on differs from a run's: scenario, size,
    concurrency and machine (MACHINE_KEYS). Empty when they agree; a result without a stamp
    (written before stamps) is a mismatch. The block count is not: the result holds its rates
    for several block counts (`rates_for`)."""
    stamp = power.get("stamp")
    if not isinstance(stamp, dict):
        return ["it carries no stamp of the setup it was measured on"]
    scenario = manifest.get("scenario") or {}
    machine = manifest.get("machine") or {}
    ours = {
        "scenario": scenario.get("name"),
        "size": scenario.get("size"),
        "concurrency": manifest.get("concurrency"),
    }
    out = [
        f"{key} {stamp.get(key)} (this run: {value})"
        for key, value in ours.items()
        if stamp.get(key) != value
    ]
    theirs = stamp.get("machine") or {}
    out += [
        f"machine {key} {theirs.get(key)} (this run: {machine.get(key)})"
        for key in MACHINE_KEYS
        if theirs.get(key) != machine.get(key)
    ]
    return out


def rates_for(power: dict, figure: str, blocks: int) -> dict[str, float | None] | None:
    """A power result's rates for one figure at a block count: false positives, smallest
    slowdown detected, detection and coverage of +10% (each its value; `<key>_low` and
    `<key>_high` its interval where the result has one); None when it has none for them."""
    entry = next((f for f in power.get("figures") or [] if f.get("figure") == figure), None)
    keys = ("false_positive_rate", "min_detectable_slowdown", "detection", "coverage")
    if entry is None or str(blocks) not in {str(k) for k in entry.get(keys[0]) or {}}:
        return None
    out: dict[str, float | None] = {}
    for key in keys:
        found = {str(k): v for k, v in (entry.get(key) or {}).items()}.get(str(blocks))
        rate = found if isinstance(found, dict) else {"value": found}  # before intervals: plain
        out |= {key: rate.get("value"), f"{key}_low": rate.get("low")}
        out[f"{key}_high"] = rate.get("high")
    return out

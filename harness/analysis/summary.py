"""A run summarised: its manifest and tables in, its summary out, once per run: a
`Comparison` (bench run), a `Measurement` (bench measure) or a `Sweep` (bench sweep), as the
manifest's `kind` says.

`summary_json` is what summary.json holds; harness/results/ writes it when the run ends and the
report reads it back (`from_summary_json`) rather than summarising the run again.
"""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from harness.analysis.compare import compare
from harness.analysis.comparison import Comparison
from harness.analysis.measurement import Measurement, measure
from harness.analysis.sweep import Sweep, sweep
from harness.analysis.verdict import FASTER, SLOWER, Rule, level_text

INCOMPLETE = "the run did not finish (interrupted or failed): partial data"
CALL_CUT = (
    "the call that ran from block {} did not finish: its last block holds what it measured"
    " (bench run --continue added blocks after it)"
)
AA_VERDICT = (
    "an A/A check (one code and settings in both arms) read '{}' on its headline: a false"
    " verdict, which intervals at {} give in up to {} of A/A runs; a check that must not"
    " see one runs at --confidence 0.99 or 0.999"
)
Summary = Comparison | Measurement | Sweep


def summarize(manifest: dict, frames: dict[str, pd.DataFrame]) -> Summary:
    """The run's summary: of one target, of a sweep, or arm B against arm A. The servers that
    failed during the run are left out of it (`without_failed_servers`)."""
    kind = manifest.get("kind", "compare")
    frames, left_out = without_failed_servers(
        manifest, frames, "the comparison" if kind == "compare" else "the figures"
    )
    if kind == "measure":
        result = _measurement(manifest, frames)
    elif kind == "sweep":
        loads = {p["server"]: p["load"] for p in manifest["points"]}
        labels = {arm["letter"]: arm["name"] for arm in manifest["arms"]}
        result = sweep(
            frames["requests"],
            frames["servers"],
            loads,
            labels,
            manifest["axis"],
            manifest.get("goodput"),
        )
    else:
        result = _comparison(manifest, frames)
        result.doubts += _aa_verdict(manifest, result)
    result.doubts[:0] = left_out
    if manifest.get("budget_stop"):
        result.doubts.insert(0, manifest["budget_stop"])
    if not manifest.get("complete", False):
        result.doubts.insert(0, INCOMPLETE)
    for call in (manifest.get("calls") or [])[:-1]:  # a continued run's earlier calls
        if not call.get("complete", True):
            result.doubts.insert(0, CALL_CUT.format(call["first_block"]))
    return result


def _aa_verdict(manifest: dict, result: Comparison) -> list[str]:
    """An A/A check's headline verdict said for what it is (docs/STATISTICS.md, "The confidence
    level")."""
    row = result.headline_row
    if not manifest.get("aa_check") or row is None or row.change.verdict not in (FASTER, SLOWER):
        return []
    level = result.rule.level
    return [AA_VERDICT.format(row.change.verdict, level_text(level), level_text(1 - level))]


def _measurement(manifest: dict, frames: dict[str, pd.DataFrame]) -> Measurement:
    arm = manifest["arms"][0]
    return measure(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        arm["name"],
        manifest.get("load") or {},
        headline=manifest["scenario"]["headline"],
        slos_ms=manifest.get("goodput"),
        slo_attainment=manifest.get("slo_attainment", 0.99),
        external=arm["kind"] == "url",
        audio=speaks(manifest),
    )


def _comparison(manifest: dict, frames: dict[str, pd.DataFrame]) -> Comparison:
    """Arm B against arm A of one run directory's tables, headline from its scenario, the
    verdict rule from the run's manifest (`rule_of`)."""
    arms = {a["letter"]: a for a in manifest["arms"]}
    unspanned = {letter for letter, arm in arms.items() if arm["kind"] == "url"}
    unspanned |= set(manifest.get("untimed") or ())
    return compare(
        frames["requests"],
        frames["spans"],
        frames["servers"],
        labels={letter: arm["name"] for letter, arm in arms.items()},
        external=tuple(sorted(unspanned)),
        audio=speaks(manifest),
        headline=manifest["scenario"]["headline"],
        rule=rule_of(manifest),
        allow_interference=bool(manifest.get("allow_interference", False)),
    )


def rule_of(manifest: dict) -> Rule:
    """The verdict rule a run's manifest records (run_plan.rule_manifest); a field an older run
    lacks is the default's, except its margin, which was 5% before significance came first."""
    default = Rule()
    return Rule(
        level=float(manifest.get("level", default.level)),
        margin=float(manifest.get("margin", 0.05)),
        fail_at=float(manifest.get("fail_at", default.fail_at)),
        looks=int(manifest.get("looks", default.looks)),
        look=int(manifest.get("look", default.look)),
    )


def speaks(manifest: dict) -> bool:
    """The run drove /v1/audio/speech: its figures are audio's."""
    return (manifest["scenario"].get("load") or {}).get("api") == "speech"


def summary_json(manifest: dict, summary: Summary) -> dict:
    """summary.json: the run's id, whether it finished, and its summary."""
    return {
        "run_id": manifest.get("run_id"),
        "complete": manifest.get("complete", False),
        **summary.to_json(),
    }


def without_failed_servers(
    manifest: dict, frames: dict[str, pd.DataFrame], of: str = "the comparison"
) -> tuple[dict[str, pd.DataFrame], list[str]]:
    """The tables without the requests and spans of the servers the manifest names in
    `failed_servers` (one that died or stalled under load, or most of whose requests failed:
    its figures would describe the fault, not the arm), and a doubt naming them. Their rows in
    the servers table stay, with the error that says what happened."""
    failed = list(manifest.get("failed_servers") or {})
    if not failed:
        return frames, []
    kept = {
        name: frame if name == "servers" else frame[~frame["server"].isin(failed)]
        for name, frame in frames.items()
    }
    noun = "servers" if len(failed) > 1 else "server"
    return kept, [f"{noun} {', '.join(failed)} failed during the run: left out of {of}"]


def from_summary_json(data: Mapping) -> Summary:
    """The summary summary.json holds, of the kind it says (a comparison when it says none)."""
    kind = data.get("kind")
    cls = Measurement if kind == "measure" else Sweep if kind == "sweep" else Comparison
    return cls.from_json(data)

"""A run continued (`bench run --continue`): more blocks added to a recorded run directory and
judged with the recorded ones as one run, as if they had all run in one call.

The block + arm model gives every block its own offset, so whatever shifts a whole block (the
day, the machine, a reboot between calls) is absorbed like any other block effect
(docs/STATISTICS.md). What must not change is what the servers run and how they are driven:
the arms (what their specs resolved to), the scenario, the load and the schedule's kind. A call
whose setup differs is refused before anything is written (`continued_manifest`). The machine
may differ; each call's first block and machine are listed in the manifest's `calls`.
"""

from __future__ import annotations

import json

from harness.errors import BenchError

# the manifest's fields a continued run must share with the recorded one (docs/RESULTS.md)
LOAD_KEYS = (
    "concurrency",
    "load",
    "requests",
    "request_digest",
    "duration_s",
    "warmup",
    "period",
    "untimed",
)
# The verdict rule's fields: how this call judges every block, the recorded ones too (an
# analysis setting, not a measured one, so a continued run may change them).
RULE_KEYS = ("margin", "fail_at", "level", "looks", "look", "allow_interference")
ARM_KEYS = ("name", "kind", "spec", "commit", "dirty", "diff_hash", "overrides", "url", "scenario")
MACHINE_KEYS = ("host", "cpu", "cpus", "gpu", "torch", "cuda")
# a call's end, top level for the last call, moved into its entry of `calls` when continued
CALL_END = ("complete", "budget_stop", "error")


def continued_manifest(recorded: dict, planned: dict, first_block: int) -> dict:
    """The manifest of `recorded` continued by this call, whose own manifest (`RunPlan.manifest`)
    is `planned` and whose blocks start at `first_block`: the recorded one with this call's
    schedule (every block's letters), time budget and entry in `calls`, the recorded call's end
    moved into its entry. A BenchError names the first setting that differs."""
    kind = recorded.get("kind", "compare")
    if kind != "compare":
        raise BenchError(f"the run holds a bench {kind}, not a bench run: it cannot be continued")
    if recorded.get("moved_to"):  # a write failed and the run went on elsewhere
        raise BenchError(f"the run was moved to {recorded['moved_to']}: continue that one")
    differs = difference(setup(recorded), setup(planned))
    if differs:
        raise BenchError(f"the recorded run differs from this call: {differs}; nothing was run")
    calls = [dict(call) for call in recorded.get("calls") or [call_entry(recorded, 0)]]
    calls[-1] |= {key: recorded[key] for key in CALL_END if key in recorded}
    kept = {k: v for k, v in recorded.items() if k not in (*CALL_END, "schema_version")}
    return kept | {
        "schedule": planned["schedule"],
        "block_size": planned["block_size"],
        "request_digest": planned["request_digest"],
        "time_budget_s": planned["time_budget_s"],
        **{key: planned[key] for key in RULE_KEYS if key in planned},
        "complete": False,
        "calls": [*calls, call_entry(planned, first_block)],
    }


def call_entry(manifest: dict, first_block: int) -> dict:
    """One call's entry in `calls`: where its blocks start, its command, time and machine."""
    keys = ("command", "unix_time", "machine")
    return {"first_block": first_block, **{key: manifest.get(key) for key in keys}}


def setup(manifest: dict) -> dict:
    """What a run's servers run and how they are driven: the manifest's fields that must not
    change between the calls of one run, JSON-plain (tuples as lists). A field older runs lack
    (`request_digest`) is left out there."""
    plain = json.loads(json.dumps(manifest, default=str))
    arms = {
        arm["letter"]: {key: arm.get(key) for key in ARM_KEYS}
        | {"scenario": scenario(arm.get("scenario"))}
        for arm in plain.get("arms") or []
    }
    size = plain.get("block_size") or (4 if "--abba" in str(plain.get("command")).split() else 2)
    return {
        "arms": arms,
        "scenario": scenario(plain.get("scenario")),
        "schedule": "A B B A / B A A B (--abba)" if size == 4 else "A B / B A",
        **{key: plain[key] for key in LOAD_KEYS if key in plain},
    }


def scenario(resolved: dict | None) -> dict | None:
    """A resolved scenario without what says where and why it was read (its file's path, how
    its size was chosen): the same file on another machine is the same scenario."""
    if resolved is None:
        return None
    return {k: v for k, v in resolved.items() if k not in ("source", "size_reason")}


def difference(recorded: dict, planned: dict, where: str = "") -> str | None:
    """The first field that differs between two setups, said as `field: recorded X, this call
    Y`; a field only one side has is left out when it is new (`request_digest`)."""
    for key in sorted(recorded.keys() | planned.keys()):
        if key == "request_digest" and (key not in recorded or key not in planned):
            continue  # a run from before the digest: its seed and lengths are still compared
        a, b = recorded.get(key), planned.get(key)
        name = f"{where}.{key}" if where else key
        if isinstance(a, dict) and isinstance(b, dict):
            inner = difference(a, b, name)
            if inner:
                return inner
        elif a != b:
            return f"{name}: recorded {_short(a)}, this call {_short(b)}"
    return None


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def machine_note(manifest: dict) -> str | None:
    """A note when the calls of a continued run ran on different machines."""
    calls = manifest.get("calls") or []
    machines = [{k: (c.get("machine") or {}).get(k) for k in MACHINE_KEYS} for c in calls]
    if len({json.dumps(m, sort_keys=True) for m in machines}) <= 1:
        return None
    parts = [
        f"from block {call['first_block']} on {m['host']} ({m['gpu'] or m['cpu']})"
        for call, m in zip(calls, machines, strict=True)
    ]
    return (
        "the run's blocks ran on different machines, "
        + ", ".join(parts)
        + ": each block's own offset absorbs its machine (docs/STATISTICS.md)"
    )

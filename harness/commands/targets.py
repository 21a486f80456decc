"""What a run's arms are and what each runs: a TARGET (a scenario or a URL) as arm A, each arm's
scenario with its overrides (`arm_scenarios`), the arm as the manifest records it, and the
vocabulary the random prompts draw from."""

from __future__ import annotations

from harness.errors import BenchError
from harness.measure.arms import Arm, resolve
from harness.scenario import Scenario, load_scenario


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def target_arm(target: str, scenario: str, size: str | None) -> tuple[Scenario, Arm]:
    """`bench measure`'s and `bench sweep`'s TARGET as arm A: a scenario (a fresh engine of
    this tree) or a URL, driven with `scenario`'s load."""
    resolved = load_scenario(scenario if is_url(target) else target, size)
    return resolved, resolve("A", target, target if is_url(target) else "worktree")


def arm_scenarios(arms: list[Arm], scenario: Scenario) -> dict[str, Scenario | None]:
    """The scenario each arm's servers run, its overrides applied, by letter (None for a URL
    arm). A load override is refused: every arm must see the same requests."""
    for arm in arms:
        if any(key.startswith("load.") for key in arm.overrides):
            raise BenchError(
                f"arm {arm.name} overrides the load; both arms must see the same requests"
            )
    return {
        arm.letter: None
        if arm.kind == "url"
        else load_scenario(scenario.source, scenario.size, arm.overrides)
        for arm in arms
    }


def arm_manifest(arm: Arm, scenario: Scenario | None) -> dict:
    """The arm as resolved, with the scenario its servers run (scenarios/<letter>.yaml)."""
    if scenario is None:
        return {**arm.manifest(), "scenario": None, "scenario_file": None}
    file = f"scenarios/{arm.letter}.yaml"
    return {**arm.manifest(), "scenario": scenario.to_dict(), "scenario_file": file}


def vocab(scenario: Scenario) -> int:
    from engine.models import vocab_size

    return vocab_size(scenario.model)

"""Scenarios as the harness runs them: the engine's model and engine settings (engine/config)
beside the load the harness drives and the headline metric that decides a run.

A scenario file's `model` and `engine` sections are the engine's; `load`, `headline` and
`description` are the harness's. This module is the harness's one door to the engine's
scenario files: its commands and measurements import scenarios from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from engine.config import ConfigError, EngineConfig, ModelSpec, parse_overrides
from engine.config.checks import check_one_of
from engine.config.files import SECTIONS, coerce, resolve, scenario_names, served

__all__ = ["ConfigError", "LoadProfile", "Scenario", "load_scenario", "parse_overrides"]
__all__ += ["scenario_names", "scenario_source"]

HARNESS_SECTIONS = (*SECTIONS, "load")
APIS = ("completions", "speech")


@dataclass(frozen=True)
class LoadProfile:
    prompt_tokens: tuple[int, int] = (16, 64)
    output_tokens: tuple[int, int] = (16, 48)  # max_tokens (with ignore_eos: the length)
    requests: int = 256
    warmup: int = 16
    seed: int = 1234
    # The endpoint the load drives: /v1/completions (SSE tokens) or /v1/audio/speech (PCM).
    api: str = "completions"

    def __post_init__(self) -> None:
        check_one_of("load.api", self.api, APIS)


@dataclass(frozen=True)
class Scenario:
    name: str
    size: str
    size_reason: str
    description: str
    headline: str
    model: ModelSpec
    engine: EngineConfig
    load: LoadProfile
    sizes: tuple[str, ...] = field(default=())
    source: str = ""  # the file it was read from

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_scenario(
    name: str, size: str | None = None, overrides: dict[str, object] | None = None
) -> Scenario:
    found = resolve(name, size, overrides, HARNESS_SECTIONS)
    engine_part = served(found)
    return Scenario(
        name=engine_part.name,
        size=found.size,
        size_reason=found.reason,
        description=found.raw.get("description", ""),
        headline=found.raw.get("headline", "output_tok_per_s"),
        model=engine_part.model,
        engine=engine_part.engine,
        load=coerce(LoadProfile, "load", found.sections["load"]),
        sizes=tuple(found.raw.get("sizes") or {}),
        source=engine_part.source,
    )


def scenario_source(
    name: str, size: str | None = None, overrides: dict[str, object] | None = None
) -> dict:
    """The scenario at one size with `overrides` applied, as a scenario file of that one size:
    the settings its file and the overrides state, and no default filled in. Loaded back, it
    resolves to `load_scenario(name, size, overrides)`'s settings; an engine of another revision
    fills what it leaves out with its own defaults, as it does for its own scenarios. The harness
    starts every server of an arm with this file."""
    found = resolve(name, size, overrides, HARNESS_SECTIONS)
    head = {key: found.raw[key] for key in ("name", "description", "headline") if key in found.raw}
    return {
        **head,
        **found.sections,
        "default_size": {"cuda": found.size, "cpu": found.size},
        "sizes": {found.size: {}},
    }

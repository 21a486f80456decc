"""The engine's settings registry (engine/config/whole.py): each flat name has one owner whose
file declares it, every default is the part's, docs/CONFIG.md is the registry's, and the flat
names of the scenarios and of `--set engine.NAME` reach the owner's part (INVARIANTS 79)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.config import SETTINGS, ConfigError, EngineConfig, parse_overrides
from engine.config.files import SCENARIO_DIR
from engine.config.whole import OWNERS
from harness.cli import app
from harness.scenario import load_scenario, scenario_names
from harness.show.config import markdown, setting_rows

ROOT = Path(__file__).resolve().parent.parent


def test_each_setting_has_one_owner_whose_file_declares_it():
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)) == len(dataclasses.fields(EngineConfig))
    for s in SETTINGS:
        part = OWNERS[s.owner]
        assert s.name in {f.name for f in dataclasses.fields(part)}
        assert f"    {s.name}: " in (ROOT / "engine" / "config" / f"{s.owner}.py").read_text()
        assert s.meaning and "\n" not in s.meaning


def test_the_whole_and_its_parts_agree_on_every_value():
    config = EngineConfig(max_rows=8, max_tokens_per_step=64, overlap=True, codec_sine="approx")
    for s in SETTINGS:
        assert getattr(getattr(config.parts, s.owner), s.name) == getattr(config, s.name)
        assert getattr(EngineConfig(), s.name) == s.default
    changed = dataclasses.replace(config, mixing=True)
    assert changed.parts.scheduler.mixes and changed.parts.loop.overlap
    assert changed.parts.kernels.split == EngineConfig().parts.kernels.split  # parsed once


def test_docs_config_is_the_registry():
    """docs/CONFIG.md is generated: `python -m harness.show.config > docs/CONFIG.md`."""
    assert (ROOT / "docs" / "CONFIG.md").read_text() == markdown(setting_rows())


def test_bench_config_lists_every_setting():
    result = CliRunner().invoke(app, ["config", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["name"] for r in rows] == [f"engine.{s.name}" for s in SETTINGS]
    assert {r["owner"] for r in rows} == set(OWNERS)


def test_scenario_and_override_names_stay_flat():
    """Every `engine:` key of every scenario file is a registry name; `--set engine.NAME`
    reaches the owner's part."""
    import yaml

    flat = {s.name for s in SETTINGS}
    for name in scenario_names():
        raw = yaml.safe_load((SCENARIO_DIR / f"{name}.yaml").read_text())
        sections = [raw.get("engine") or {}] + [
            (extra or {}).get("engine") or {} for extra in (raw.get("sizes") or {}).values()
        ]
        assert set().union(*sections) <= flat, name
        for size in raw["sizes"]:
            assert load_scenario(name, size).engine.parts.scheduler.max_rows >= 1
    overrides = "engine.stall_timeout_s=3,engine.planted_gpu_delay_us=40,engine.cuda_graphs=false"
    s = load_scenario("qwen35", "tiny", parse_overrides(overrides + ",engine.gdn_prefill=fla"))
    parts = s.engine.parts
    assert parts.api.stall_timeout_s == 3 and parts.loop.planted_gpu_delay_us == 40
    assert parts.graphs.cuda_graphs is False and parts.kernels.gdn_prefill == "fla"
    with pytest.raises(ConfigError, match="engine.gdn_prefill must be one of"):
        load_scenario("qwen35", "tiny", parse_overrides("engine.gdn_prefill=fast"))

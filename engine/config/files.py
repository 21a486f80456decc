"""Scenario files as the engine reads them: one YAML per workload, resolved for one size,
with typed overrides. The engine reads a file's `model` and `engine` sections
(`load_served`); the harness reads the same files for the load it drives (harness/scenario.py
passes its own sections to `resolve`). `sizes.<name>` holds per-size overrides; the machine
picks the default size (`default_size.cuda` where CUDA is present, else `default_size.cpu`).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import yaml

from engine.config.checks import ConfigError
from engine.config.model import ModelSpec
from engine.config.whole import EngineConfig

SCENARIO_DIR = Path(__file__).resolve().parent.parent.parent / "scenarios"
SECTIONS = ("model", "engine")  # the sections the engine serves


@dataclass(frozen=True)
class Resolved:
    """A scenario file at one size: its sections' settings, no default filled in."""

    path: Path
    raw: dict
    size: str
    reason: str  # why this size: asked for, or the machine's
    sections: dict[str, dict]


@dataclass(frozen=True)
class Served:
    """What `python -m engine serve` runs: a scenario's model and engine at one size."""

    name: str
    size: str
    size_reason: str
    model: ModelSpec
    engine: EngineConfig
    source: str = ""  # the file it was read from


def scenario_names() -> list[str]:
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name: str) -> Path:
    """A scenario's file: `name` itself when it names a .yaml/.yml file, else
    scenarios/<name>.yaml."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise ConfigError(f"no scenario file {name}")
        return path.resolve()
    path = SCENARIO_DIR / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(scenario_names()) or "none"
        raise ConfigError(f"unknown scenario {name!r}; known scenarios: {known}")
    return path


def _read(path: Path, sections: tuple[str, ...]) -> dict:
    """A scenario file's mapping, or a one-line ConfigError saying what is wrong with it."""
    see = f"see {SCENARIO_DIR / 'qwen35.yaml'} for the format"
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read scenario {path} ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"scenario {path} is not text (UTF-8)") from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"scenario {path} is not valid YAML{at}: {problem}") from None
    if raw is None:
        raise ConfigError(f"scenario {path} is empty; {see}")
    if not isinstance(raw, dict):
        kind = "list" if isinstance(raw, list) else type(raw).__name__
        raise ConfigError(f"scenario {path} is a YAML {kind}, not a mapping of settings; {see}")
    if not isinstance(raw.get("name"), str) or not raw["name"].strip():
        raise ConfigError(f"scenario {path} has no `name:` (a string, e.g. name: qwen35)")
    for key in (*sections, "sizes", "default_size"):
        if not isinstance(raw.get(key) or {}, dict):
            raise ConfigError(f"scenario {path}: {key} must be a mapping, got {raw[key]!r:.60}")
    for size, extra in (raw.get("sizes") or {}).items():
        extra = extra or {}
        if not isinstance(extra, dict) or not all(
            isinstance(v or {}, dict) for v in extra.values()
        ):
            raise ConfigError(
                f"scenario {path}: sizes.{size} must map {', '.join(sections)} to settings,"
                f" got {extra!r:.60}"
            )
    return raw


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def parse_overrides(text: str | None) -> dict[str, object]:
    """`engine.mixing=true,load.requests=64` -> {"engine.mixing": True, "load.requests": 64}.

    A comma starts a new item only when a `section.key=` follows it, so
    `model.eos_token_ids=[1,2]` and `engine.gdn_split=states_bv=32,outputs_bv=64` stay one
    item each."""
    out: dict[str, object] = {}
    parts = re.split(r",(?=\s*[A-Za-z_]\w*\.[\w.]*=)", text or "")
    for item in filter(None, (part.strip() for part in parts)):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not key=value (e.g. engine.mixing=true)")
        out[key.strip()] = yaml.safe_load(value) if value.strip() else ""
    return out


def _merge(base: dict, extra: dict) -> dict:
    merged = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def coerce(cls: type, section: str, values: dict):
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"unknown setting {section}.{key}; known: {', '.join(sorted(known))}")
        kwargs[key] = _check_type(f"{section}.{key}", hints[key], value)
    return cls(**kwargs)


def _check_type(name: str, hint, value):
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in typing.get_args(hint):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        origin = typing.get_origin(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or len(value) != 2:
            raise ConfigError(f"{name} must be a [low, high] pair, got {value!r}")
        low, high = (_check_type(name, int, v) for v in value)
        if low < 1 or high < low:
            raise ConfigError(f"{name} must satisfy 1 <= low <= high, got {value!r}")
        return (low, high)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{name} must be a list, got {value!r}")
        return [_check_type(name, typing.get_args(hint)[0], v) for v in value]
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name} must be an integer, got {value!r}")
        if value < 0:
            raise ConfigError(f"{name} must not be negative, got {value!r}")
        return value
    if hint is str and not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def resolve(
    name: str,
    size: str | None,
    overrides: dict[str, object] | None,
    sections: tuple[str, ...] = SECTIONS,
) -> Resolved:
    """The file, its mapping, the size (asked for, or by machine) and why, and its `sections`
    at that size with the overrides applied (no default filled in)."""
    path = scenario_path(name)
    raw = _read(path, sections)
    sizes = raw.get("sizes") or {}
    if size is None:
        has_cuda = cuda_available()
        machine = "cuda" if has_cuda else "cpu"
        size = (raw.get("default_size") or {}).get(machine)
        if size is None:
            raise ConfigError(f"scenario {path} has no default_size.{machine}; give --size")
        reason = "CUDA found" if has_cuda else "no CUDA on this machine"
    else:
        reason = "asked for"
    if size not in sizes:
        raise ConfigError(f"scenario {raw['name']} has no size {size!r}; sizes: {', '.join(sizes)}")
    extra = {k: v for k, v in (sizes[size] or {}).items() if k in sections}
    resolved = _merge({k: raw.get(k) or {} for k in sections}, extra)
    for key, value in (overrides or {}).items():
        section, _, leaf = key.partition(".")
        if section not in resolved or not leaf or "." in leaf:
            known = ", ".join(f"{s}.X" for s in sections[:-1]) + f" or {sections[-1]}.X"
            raise ConfigError(f"override {key!r} must be {known}")
        resolved[section][leaf] = value
    return Resolved(path, raw, size, reason, resolved)


def served(found: Resolved) -> Served:
    """The model and engine of a resolved file, typed and validated."""
    return Served(
        name=found.raw["name"],
        size=found.size,
        size_reason=found.reason,
        model=coerce(ModelSpec, "model", found.sections["model"]),
        engine=coerce(EngineConfig, "engine", found.sections["engine"]),
        source=str(found.path),
    )


def load_served(
    name: str, size: str | None = None, overrides: dict[str, object] | None = None
) -> Served:
    """A scenario's model and engine at `size` with `overrides` (model.X, engine.X)."""
    return served(resolve(name, size, overrides))

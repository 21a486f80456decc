"""What every part of the engine's configuration shares: its error, a setting's declaration
(a default and a one-line meaning, listed by `bench config` and docs/CONFIG.md), and the
checks a part runs once, where it is made."""

from __future__ import annotations

from dataclasses import field


class ConfigError(ValueError):
    """A scenario, size or override that cannot be used; the message says what to do."""


def setting(default, meaning: str):
    """A part's field: its default and what it means in one line (the registry's)."""
    return field(default=default, metadata={"meaning": meaning})


def check_one_of(setting_name: str, value, choices) -> None:
    """A ConfigError naming `setting_name` unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{setting_name} must be one of {', '.join(choices)}, got {value!r}")


def check_at_least_one(part, *names: str) -> None:
    """A size of 0 leaves a worker that never schedules a row (its warmup never ends)."""
    for name in names:
        if getattr(part, name) < 1:
            raise ConfigError(f"engine.{name} must be at least 1, got {getattr(part, name)}")


def check_seconds(part, *names: str) -> None:
    for name in names:
        value = getattr(part, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
            raise ConfigError(f"engine.{name} must be a positive number of seconds, got {value!r}")

"""The engine's configuration: a part per owner (scheduler.py, cache.py, kernels.py,
graphs.py, loop.py, codec.py, api.py, device.py), the whole and its registry (whole.py), the
model (model.py) and the scenario files the engine reads (files.py)."""

from engine.config.checks import ConfigError, check_one_of
from engine.config.files import Served, load_served, parse_overrides
from engine.config.kernels import (
    DECODE_ATTENTIONS,
    DENSE_KERNELS,
    GDN_DECODES,
    TRITON_LAUNCHES,
    KernelsConfig,
)
from engine.config.model import ModelSpec
from engine.config.whole import SETTINGS, EngineConfig

__all__ = [
    "DECODE_ATTENTIONS",
    "DENSE_KERNELS",
    "GDN_DECODES",
    "SETTINGS",
    "TRITON_LAUNCHES",
    "ConfigError",
    "EngineConfig",
    "KernelsConfig",
    "ModelSpec",
    "Served",
    "check_one_of",
    "load_served",
    "parse_overrides",
]

"""The engine's configuration as a whole: one part per owner, and the registry of every
setting by its public name.

A scenario (and `--set engine.NAME=value`) names a setting flat, `engine.<name>`; the
registry says which part owns it. `EngineConfig` is the whole with those flat names, built
from the parts' fields (so no default is written twice): the form a scenario file, a
manifest and the worker's spec carry. Each part validates itself once, where it is made;
`EngineConfig.parts` holds them, and each owner is handed its part whole (`build_ops` the
kernels', `Worker` the loop's, `Scheduler` the scheduler's). The checks between parts are
the whole's."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass

from engine.config.api import ApiConfig
from engine.config.cache import CacheConfig
from engine.config.checks import ConfigError
from engine.config.codec import CodecConfig
from engine.config.device import DeviceConfig
from engine.config.graphs import GraphsConfig
from engine.config.kernels import KernelsConfig
from engine.config.loop import LoopConfig
from engine.config.scheduler import SchedulerConfig


@dataclass(frozen=True)
class EngineParts:
    """The owners' parts; each file under engine/config/ is one."""

    scheduler: SchedulerConfig
    cache: CacheConfig
    kernels: KernelsConfig
    graphs: GraphsConfig
    loop: LoopConfig
    codec: CodecConfig
    api: ApiConfig
    device: DeviceConfig


OWNERS: dict[str, type] = typing.get_type_hints(EngineParts)  # owner -> its part, in order


@dataclass(frozen=True)
class Setting:
    """One row of the registry: `engine.<name>`, its owner's part, default and meaning."""

    name: str
    owner: str
    default: object
    type: object
    meaning: str


SETTINGS: tuple[Setting, ...] = tuple(
    Setting(f.name, owner, f.default, typing.get_type_hints(part)[f.name], f.metadata["meaning"])
    for owner, part in OWNERS.items()
    for f in dataclasses.fields(part)
)
OWNER_OF = {s.name: s.owner for s in SETTINGS}


class _Whole:
    """EngineConfig's behaviour; its fields are the registry's (below)."""

    def __post_init__(self) -> None:
        values = dataclasses.asdict(self)
        parts = {
            owner: part(**{f.name: values[f.name] for f in dataclasses.fields(part)})
            for owner, part in OWNERS.items()
        }
        object.__setattr__(self, "parts", EngineParts(**parts))
        if self.piecewise_gdn and not self.piecewise_graphs:
            raise ConfigError(
                "engine.piecewise_gdn captures Gated DeltaNet inside the piecewise graphs; it "
                "needs engine.piecewise_graphs: true (set engine.piecewise_gdn=false with "
                "engine.piecewise_graphs=false)"
            )
        if self.pdl and self.device != "cuda":
            raise ConfigError("engine.pdl needs engine.device: cuda (Hopper's launch control)")


EngineConfig = dataclasses.make_dataclass(
    "EngineConfig",
    [(s.name, s.type, dataclasses.field(default=s.default)) for s in SETTINGS],
    bases=(_Whole,),
    frozen=True,
)
EngineConfig.__module__ = __name__
EngineConfig.__doc__ = "Every engine setting by its flat name; `.parts` holds the owners' parts."

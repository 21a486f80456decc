"""Where the model runs: the device, its dtype, and the worker's threads on a CPU."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import setting


@dataclass(frozen=True)
class DeviceConfig:
    device: str = setting("cpu", "the model's device: cpu or cuda")
    dtype: str = setting("float32", "the model's dtype")
    # The worker shares the machine with the API server and the load generator; more threads
    # than free cores make torch's spinning thread pools fight (a tiny decode step about 20x
    # slower with 2 threads than with 1 on a loaded 2-core machine).
    cpu_threads: int = setting(1, "intra-op threads of the worker on a CPU")

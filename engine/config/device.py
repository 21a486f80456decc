"""Where the model runs: the device, its dtype, and the worker's threads on a CPU."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import ConfigError, check_one_of, setting

DEVICES = ("cpu", "cuda")  # engine.device: a worker's GPU is chosen by CUDA_VISIBLE_DEVICES
DTYPES = ("float32", "bfloat16", "float16")  # engine.dtype


@dataclass(frozen=True)
class DeviceConfig:
    device: str = setting("cpu", "the model's device: cpu or cuda")
    dtype: str = setting("float32", "the model's dtype")
    # The worker shares the machine with the API server and the load generator; more threads
    # than free cores make torch's spinning thread pools fight (a tiny decode step about 20x
    # slower with 2 threads than with 1 on a loaded 2-core machine).
    cpu_threads: int = setting(1, "intra-op threads of the worker on a CPU")

    def __post_init__(self) -> None:
        check_one_of("engine.device", self.device, DEVICES)
        check_one_of("engine.dtype", self.dtype, DTYPES)
        if self.cpu_threads < 1:
            raise ConfigError(f"engine.cpu_threads must be at least 1, got {self.cpu_threads}")

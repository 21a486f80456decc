"""Planted slowdowns, for the harness's own checks (bench power's known slowdown, the verdict
tests): a busy-wait on the host, and the device kept busy after a step."""

from __future__ import annotations

import time

import torch

# SM cycles a microsecond on the H200 (torch.cuda._sleep: 1e8 cycles = 50.6 ms, docs GPU.md)
SLEEP_CYCLES_PER_US = 1976


def spin(seconds: float) -> None:
    """Busy-wait: the planted slowdown must cost CPU time like real work, not sleep."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def planted_device_delay(device: torch.device, microseconds: int) -> None:
    """`engine.planted_gpu_delay_us`: the device busy for `microseconds` after what is queued
    (a spin kernel on the current stream; on a CPU, where the step ran at launch, a busy-wait)."""
    if device.type == "cuda":
        torch.cuda._sleep(SLEEP_CYCLES_PER_US * microseconds)
    else:
        spin(microseconds / 1e6)

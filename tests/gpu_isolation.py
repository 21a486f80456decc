"""What one GPU test may leave for the next in one process, and the suite's guard (docs/GPU_TESTS.md).

GPU tests share a process's global state: torch's numerics switches (TF32, reduced-precision
reductions, matmul precision, deterministic algorithms, the default dtype), the current CUDA
stream and device, the Triton launch mode (engine/kernels/triton_launch.py's BOUND and
PDL_ON), the global RNGs, the environment, the caching allocator, and whatever the last failed
test's traceback keeps alive (pytest keeps it in sys.last_traceback: its engines, graphs and
pools). `Guard` snapshots the settings before each GPU test and puts back what the test
changed (warning with its name), and frees what it left before the next one starts.

`RandomModels` builds each seeded random CUDA model once per session and hands out deep copies:
a 0.8b model's weights are drawn on the host (~10 s each; test_gpu.py builds ~40), and a copy
is the same bits, so no test sees another's model.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

Setting = tuple[Callable[[], object], Callable[[object], None]]


def _attribute(owner: Callable[[], object], name: str) -> Setting:
    return (lambda: getattr(owner(), name), lambda value: setattr(owner(), name, value))


def _deterministic(value) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _triton_launch() -> object:
    module = sys.modules.get("engine.kernels.triton_launch")  # imported by a CUDA engine only
    return None if module is None else (module.BOUND, module.PDL_ON)


def _set_triton_launch(value) -> None:
    if value is not None:
        bound, pdl = value
        sys.modules["engine.kernels.triton_launch"].set_launch("bound" if bound else "jit", pdl)


def _stream_is_default() -> bool:
    return torch.cuda.current_stream() == torch.cuda.default_stream()


def _set_default_stream(value) -> None:
    torch.cuda.set_stream(torch.cuda.default_stream())


# pytest's own: it names the test and its phase ("... (setup)", "... (call)"), so it differs
# between the guard's snapshot and its restore in every test (the H100 run of 2026-12-07 warned
# "left changed: environment" for each of its 100 tests)
PYTEST_OWN = "PYTEST_CURRENT_TEST"


def _environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name != PYTEST_OWN}


def _set_environment(value: dict[str, str]) -> None:
    own = os.environ.get(PYTEST_OWN)
    os.environ.clear()
    os.environ.update(value)
    if own is not None:
        os.environ[PYTEST_OWN] = own


def _rng() -> tuple:
    return torch.random.get_rng_state(), tuple(torch.cuda.get_rng_state_all())


def _set_rng(value) -> None:
    torch.random.set_rng_state(value[0])
    torch.cuda.set_rng_state_all(list(value[1]))


_cuda_matmul = lambda: torch.backends.cuda.matmul  # noqa: E731
_cudnn = lambda: torch.backends.cudnn  # noqa: E731
SETTINGS: dict[str, Setting] = {
    "torch.float32_matmul_precision": (
        torch.get_float32_matmul_precision,
        torch.set_float32_matmul_precision,
    ),
    "torch.deterministic_algorithms": (
        lambda: (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
        ),
        _deterministic,
    ),
    "torch.default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.grad_enabled": (torch.is_grad_enabled, torch.set_grad_enabled),
    "cuda.matmul.allow_tf32": _attribute(_cuda_matmul, "allow_tf32"),
    "cuda.matmul.allow_bf16_reduced_precision_reduction": _attribute(
        _cuda_matmul, "allow_bf16_reduced_precision_reduction"
    ),
    "cuda.matmul.allow_fp16_reduced_precision_reduction": _attribute(
        _cuda_matmul, "allow_fp16_reduced_precision_reduction"
    ),
    "cudnn.enabled": _attribute(_cudnn, "enabled"),
    "cudnn.benchmark": _attribute(_cudnn, "benchmark"),
    "cudnn.deterministic": _attribute(_cudnn, "deterministic"),
    "cudnn.allow_tf32": _attribute(_cudnn, "allow_tf32"),
    "cuda.device": (torch.cuda.current_device, torch.cuda.set_device),
    "cuda.stream_is_default": (_stream_is_default, _set_default_stream),
    "triton_launch (BOUND, PDL_ON)": (_triton_launch, _set_triton_launch),
    "environment": (_environment, _set_environment),
    "global RNG states": (_rng, _set_rng),
}


def _equal(a, b) -> bool:
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    return a == b


QUIET = {"global RNG states"}  # restored without a warning: drawing from it changes it
NEEDS_A_DEVICE = {"cuda.device", "cuda.stream_is_default"}


def snapshot() -> dict[str, object]:
    """Every setting this process has (the device's with CUDA)."""
    return {
        name: get()
        for name, (get, _put) in SETTINGS.items()
        if torch.cuda.is_available() or name not in NEEDS_A_DEVICE
    }


def restore(before: dict[str, object]) -> list[str]:
    """Put back every setting that differs from `before`; the names of those that did, but
    for the RNGs (so each GPU test starts from the same RNG state, whatever ran before)."""
    changed = []
    for name, value in before.items():
        get, put = SETTINGS[name]
        if not _equal(get(), value):
            put(value)
            changed += [] if name in QUIET else [name]
    return changed


def free_what_is_left() -> None:
    """The last failure's frames (pytest keeps them for post-mortem debugging), cycles, and
    the allocator's cached blocks, after the device has finished the test's work."""
    sys.last_type = sys.last_value = sys.last_traceback = None
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


class Guard:
    """Around each GPU test: the settings restored, what it left freed, and with a log path one
    JSON line per test (seconds, allocated MiB before and after, peak, what it changed)."""

    def __init__(self, log: str | None, models: RandomModels, poison: bool = False):
        self.log, self.models = (Path(log) if log else None), models
        self.poison = poison  # --gpu-poison: fresh device memory filled with 0xFF first

    def around(self, nodeid: str):
        free_what_is_left()
        if self.poison:
            from benchmarks.probe_graph_order import poison

            poison(release=True)  # the pages a later cudaMalloc (a graph pool's) may get
            poison(release=False)  # the blocks the caching allocator hands out next
        before, start = snapshot(), time.monotonic()
        allocated = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        yield
        seconds = time.monotonic() - start
        free_what_is_left()
        changed = restore(before)
        if changed:
            warnings.warn(
                f"{nodeid} left changed (now restored): {', '.join(changed)}", stacklevel=1
            )
        if self.log is not None:
            mib = 1 << 20
            record = {
                "test": nodeid,
                "s": round(seconds, 2),
                "allocated_before_mib": round(allocated / mib),
                "allocated_after_mib": round(torch.cuda.memory_allocated() / mib),
                "peak_mib": round(torch.cuda.max_memory_allocated() / mib),
                "cached_models_mib": round(self.models.bytes() / mib),
                "changed": changed,
            }
            with self.log.open("a") as out:
                out.write(json.dumps(record) + "\n")


class RandomModels:
    """Each seeded random model built on CUDA once (`random` of every network the registry
    names, keyed by its arguments), handed out as a deep copy: the same bits, its own tensors."""

    def __init__(
        self, on: Callable[[object], bool] = lambda device: torch.device(device).type == "cuda"
    ):
        self.on, self.built, self._originals = on, {}, {}

    def install(self) -> None:
        from engine.models import ARCHITECTURES

        networks = {a.network for a in ARCHITECTURES.values()}
        networks |= {s.network for a in ARCHITECTURES.values() for s in a.streams}
        for network in networks:
            if "random" in vars(network):
                self._originals[network] = vars(network)["random"]
                network.random = classmethod(self._cached(vars(network)["random"].__func__))

    def uninstall(self) -> None:
        for network, original in self._originals.items():
            network.random = original
        self._originals.clear()
        self.built.clear()

    def _cached(self, build):
        def random(network, config, seed, dtype, device, *args, **kwargs):
            if not self.on(device):
                return build(network, config, seed, dtype, device, *args, **kwargs)
            key = (network, repr(config), seed, dtype, str(device), repr(args), repr(kwargs))
            if key not in self.built:
                self.built[key] = build(network, config, seed, dtype, device, *args, **kwargs)
            return copy.deepcopy(self.built[key])

        return random

    def bytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for model in self.built.values()
            for t in [*model.parameters(), *model.buffers()]
        )

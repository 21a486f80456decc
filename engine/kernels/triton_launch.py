"""Triton launches through the compiled kernel's own launcher (`engine.triton_launch: bound`).

`kernel[grid](*args, **kw)` finds the compiled kernel for its arguments on every call: it
binds them, specialises each (dtype, 16-byte alignment, integer values of 1 or multiples of
16, None), builds a cache key, checks the kernel's globals, then runs the C launcher. On the
H200's machine that is 25.3 us of host for a 12-argument norm kernel, 13.7 of them the
launcher's (benchmarks/bench_launch.py), and more for the Gated DeltaNet kernels' ~25
arguments: an eager step makes ~100-250 such launches (docs/BENCHMARKS.md).

`bound` wraps a launched kernel (`@bound` above `@triton.jit`). While `BOUND` is on, its
`[grid](...)` keeps the compiled kernel Triton returned for a call signature, each tensor's
dtype, device and 16-byte alignment, every other argument's type and value, the keyword
arguments, and calls that kernel's launcher directly on a later call of the same signature,
every parameter by position (constexprs and defaults filled in, as Triton's own launch passes
them). The signature holds everything Triton specialises on and more (an integer's value, not
just its divisibility), so the kept kernel is the one Triton would have found. It skips
Triton's check that the kernel's globals have not changed: no kernel here reads a global that
changes. Off (`jit`, the default), `[grid]` is the kernel's own. Under the interpreter
(TRITON_INTERPRET=1) a launch returns no compiled kernel, so every launch is the JIT's.
"""

from __future__ import annotations

import inspect

import torch

from engine.config import TRITON_LAUNCHES

BOUND = False  # set from engine.triton_launch (engine.kernels.build_ops), one per process


def bound(kernel):
    """The launched kernel `kernel` (a @triton.jit function), launchable through `BOUND`."""
    return BoundKernel(kernel)


class BoundKernel:
    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None) or ()
        self.names = tuple(p.name for p in params)
        empty = inspect.Parameter.empty
        self.defaults = {p.name: p.default for p in params if p.default is not empty}
        self.compiled: dict[tuple, object] = {}

    def __getattr__(self, name: str):  # fn, arg_names, params, ...: the kernel's own
        if name == "kernel":  # not set yet (a copy being built): no recursion through it
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        if not BOUND:
            return self.kernel[grid]
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        """One launch: through the kept compiled kernel when this signature has one, else
        through Triton's JIT, keeping what it returns. Returns the compiled kernel (or the
        interpreter's None), as `kernel[grid](...)` does."""
        key = (tuple(map(signature, args)), tuple(kwargs.items()))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if compiled is not None and hasattr(compiled, "packed_metadata"):
                self.compiled[key] = compiled
            return compiled
        rest = self.names[len(args) :]
        values = (*args, *(kwargs[n] if n in kwargs else self.defaults[n] for n in rest))
        compiled[grid_3d(grid)](*values)
        return compiled


def signature(arg) -> tuple:
    """What a launch's specialisation may depend on, for one argument."""
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.device, arg.data_ptr() % 16 == 0
    return arg.__class__, arg  # True and 1 are equal and hash alike; Triton tells them apart


def grid_3d(grid) -> tuple[int, int, int]:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def set_launch(kind: str) -> None:
    """`engine.triton_launch`: `jit` (Triton's own launch) or `bound` (this module's)."""
    global BOUND
    if kind not in TRITON_LAUNCHES:
        raise ValueError(f"triton_launch must be one of {', '.join(TRITON_LAUNCHES)}, got {kind!r}")
    BOUND = kind == "bound"

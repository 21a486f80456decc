"""Triton launches through the compiled kernel's own launcher (`engine.triton_launch: bound`).

`kernel[grid](*args, **kw)` finds the compiled kernel for its arguments on every call: it
binds them, specialises each (dtype, 16-byte alignment, integer values of 1 or multiples of
16, None), builds a cache key, checks the kernel's globals, then runs the C launcher. On the
H200's machine that is 25.3 us of host for a 12-argument norm kernel, 13.7 of them the
launcher's (benchmarks/bench_launch.py), and more for the Gated DeltaNet kernels' ~25
arguments: an eager step makes ~100-250 such launches (docs/BENCHMARKS.md).

`bound` wraps a launched kernel (`@bound` above `@triton.jit`). While `BOUND` is on, its
`[grid](...)` keeps the compiled kernel Triton returned for a call signature (`signature`:
each tensor's dtype, device and 16-byte alignment, every other argument's type and value, the
keywords' names, each keyword's value read the same way) and calls that kernel's runner
directly on a later call of the same signature, every parameter by position (constexprs and
defaults filled in, as Triton's own launch passes them). The signature holds everything Triton
specialises on and more (an integer's value, not just its divisibility), so the kept kernel is
the one Triton would have found. It skips Triton's check that the kernel's globals have not
changed: no kernel here reads a global that changes. Off (`jit`, the default), `[grid]` is the
kernel's own. Under the interpreter (TRITON_INTERPRET=1) a launch returns no compiled kernel,
so every launch is the JIT's.

A kept launch is Python the host runs between the model and the C launcher, so per call it
does only what depends on the call: the signature, one dict lookup, the call of the runner
(`python -m benchmarks.bench_launch --host-only` times it). Which parameters follow the
positional ones, and their defaults, depend on the signature alone: they are worked out when
the kernel is kept. The runner of the last grid is kept too: `compiled[grid]` is a closure over
the grid alone, which reads the current stream and Triton's hooks at each call.

Programmatic dependent launch (`engine.pdl`, Hopper and later): a kernel with a `PDL`
constexpr parameter calls `triton_pdl.pdl_start(PDL)` before it reads or writes anything a
kernel before it may touch. With `PDL_ON` set, every launch of such a kernel passes `PDL=True` and Triton's
`launch_pdl=True`: the launch carries CUDA's programmatic stream serialisation attribute (in a
CUDA graph, a programmatic edge), so the GPU may start its programs while the kernel before it
still runs; `pdl_start` then lets the kernel after it launch early too
(`griddepcontrol.launch_dependents`) and waits until the kernel before it has finished and its
writes are visible (`griddepcontrol.wait`). What a program does before that wait must depend
on nothing an earlier kernel writes (the dense GEMM prefetches its weight slice into L2
there). A kernel without the parameter launches as ever, and so does every torch, cuBLAS or
FlashInfer kernel: each waits for the whole of the kernel before it. Without `PDL_ON` the
constexpr is False and the kernel compiles as it did before (the instructions are Hopper's:
Triton's interpreter has none, so CPU runs never set it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from engine.config import TRITON_LAUNCHES

BOUND = False  # set from engine.triton_launch (engine.kernels.build_ops), one per process
PDL_ON = False  # set from engine.pdl (engine.kernels.build_ops), one per process
PDL_KEYWORDS = {"PDL": True, "launch_pdl": True}  # a PDL kernel's launch with PDL_ON


def bound(kernel):
    """The launched kernel `kernel` (a @triton.jit function), launchable through `BOUND`."""
    return BoundKernel(kernel)


@dataclass(slots=True)
class Kept:
    """The compiled kernel Triton returned for one call signature; the parameters after the
    positional ones, with their defaults (a keyword given replaces its default; a parameter
    with neither is never kept, Triton's launch refuses it); and the runner of the last grid,
    one (grid, runner) pair replaced whole, so a launch on another thread reads a matched pair."""

    compiled: object
    tail_names: tuple[str, ...]
    tail_defaults: tuple
    last: tuple[object, Callable | None] = (None, None)  # no runner before the first kept launch


class BoundKernel:
    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None) or ()
        self.names = tuple(p.name for p in params)
        self.defaults = tuple(p.default for p in params)  # inspect.Parameter.empty: none
        self.pdl = "PDL" in self.names  # it calls pdl_start(PDL) first
        self.kept: dict[tuple, Kept] = {}

    def __getattr__(self, name: str):  # fn, arg_names, params, ...: the kernel's own
        if name == "kernel":  # not set yet (a copy being built): no recursion through it
            raise AttributeError(name)
        return getattr(self.kernel, name)

    def __getitem__(self, grid):
        pdl = PDL_ON and self.pdl
        if not BOUND:
            if not pdl:
                return self.kernel[grid]
            run = self.kernel[grid]
            return lambda *args, **kwargs: run(*args, **kwargs, **PDL_KEYWORDS)
        if pdl:
            return lambda *args, **kwargs: self.launch(grid, args, kwargs | PDL_KEYWORDS)
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid, args: tuple, kwargs: dict):
        """One launch: through the kept compiled kernel when this signature has one, else
        through Triton's JIT, keeping what it returns. Returns the compiled kernel (or the
        interpreter's None), as `kernel[grid](...)` does."""
        key = signature(args, kwargs)
        kept = self.kept.get(key)
        if kept is None:
            return self.first_launch(key, grid, args, kwargs)
        last_grid, runner = kept.last
        if grid != last_grid:
            runner = kept.compiled[grid_3d(grid)]
            kept.last = grid, runner
        runner(*args, *map(kwargs.get, kept.tail_names, kept.tail_defaults))
        return kept.compiled

    def first_launch(self, key: tuple, grid, args: tuple, kwargs: dict):
        """Triton's own launch of a signature not kept yet, keeping the compiled kernel it
        returns."""
        compiled = self.kernel[grid](*args, **kwargs)
        if compiled is not None and hasattr(compiled, "packed_metadata"):
            tail = slice(len(args), None)
            self.kept[key] = Kept(compiled, self.names[tail], self.defaults[tail])
        return compiled


def signature(args: tuple, kwargs: dict) -> tuple:
    """What a launch's specialisation may depend on: the keywords' names, then for each value
    (positional, then keyword) a tensor's dtype, device and address mod 16 (its 16-byte
    alignment), any other value's class and value (True and 1 are equal and hash alike; Triton
    tells them apart). The device is `get_device()`, the CUDA index (-1 for the CPU, whose
    memory Triton's launcher refuses): an int, where `tensor.device` builds a torch.device."""
    return (
        *kwargs,
        *[
            (v.dtype, v.get_device(), v.data_ptr() & 15)
            if isinstance(v, Tensor)
            else (v.__class__, v)
            for v in (*args, *kwargs.values())
        ],
    )


def grid_3d(grid) -> tuple[int, int, int]:
    return (grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1)


def set_launch(kind: str, pdl: bool = False) -> None:
    """`engine.triton_launch`: `jit` (Triton's own launch) or `bound` (this module's); `pdl`
    (`engine.pdl`): the PDL kernels' launches programmatic."""
    global BOUND, PDL_ON
    if kind not in TRITON_LAUNCHES:
        raise ValueError(f"triton_launch must be one of {', '.join(TRITON_LAUNCHES)}, got {kind!r}")
    BOUND = kind == "bound"
    PDL_ON = pdl

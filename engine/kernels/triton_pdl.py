"""The device side of programmatic dependent launch (`engine.pdl`; the host side, which
launches a kernel with a `PDL` parameter programmatically, is engine/kernels/triton_launch.py).

A kernel launched with CUDA's programmatic stream serialisation may have its programs running
before the kernel ahead of it in the stream has finished. `pdl_start(PDL)` is therefore the
first thing such a kernel does with anything another kernel reads or writes:
`griddepcontrol.launch_dependents` (the kernel after it may launch as soon as every program of
this one has started) and `griddepcontrol.wait` (block until the kernel before has completed
and its writes are visible). The wait is transitive: the kernel before passed its own wait
before it ended. Both instructions are Hopper's (sm_90); without the launch attribute the wait
returns at once. With PDL False (every CPU run: Triton's interpreter has neither) it is nothing.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def pdl_start(PDL: tl.constexpr):
    """Let the next kernel's programs launch, then wait for the previous kernel's end."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()

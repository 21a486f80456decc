"""CUDA streams a lane owns alone (`own_streams`).

Why: `torch.cuda.Stream()` hands out the streams of a pool of 32 in turn, so two calls, say
the decode graphs' capture stream and, some engines later, the prefill stream or a piecewise
bucket's capture stream, can return one CUDA stream. And torch keeps one cuBLAS (and cuBLASLt)
workspace per (handle, stream): a GEMM captured in a graph keeps the workspace of the stream it
was captured on, and cuBLAS's split-K kernels write their partials there. Two graphs captured
on one stream, replayed at once on two (a decode graph beside a prefill's piecewise graph with
`engine.prefill_stream`), write each other's partial sums: results that change with timing,
runs of the same steps parting in their tokens. So each lane that runs beside another
captures and runs on a stream no other live lane holds (INVARIANTS 90).
"""

from __future__ import annotations

import gc
import weakref

import torch

POOL = 32  # torch's streams of one priority a device (c10's kStreamsPerPool)

# The CUDA stream handles live lanes own. By handle, released when the owner is collected:
# not a weak set of the streams, since torch.cuda.Stream's weak references dangle (a
# process crashed reading one after its stream was freed: torch's stream type does not clear
# them when it is deallocated).
_held: set[int] = set()


def own_streams(device: torch.device, count: int, owner: object) -> list[torch.cuda.Stream]:
    """`count` streams of `device`, each a CUDA stream no live owner holds, drawn from torch's
    pool until enough are new; they stay held until `owner` (the lane: an engine, a graph
    runner) is collected. RuntimeError if the pool has too few left even after collecting."""
    for _ in range(2):
        # a CUDA stream's handle is unique in the process, whatever its device (and `device`
        # may name no index: torch.device("cuda"))
        held = set(_held)
        drawn: list[torch.cuda.Stream] = []
        for _drawn in range(POOL):
            stream = torch.cuda.Stream(device)
            if stream.cuda_stream not in held:
                held.add(stream.cuda_stream)
                drawn.append(stream)
                if len(drawn) == count:
                    handles = [own.cuda_stream for own in drawn]
                    _held.update(handles)
                    weakref.finalize(owner, _held.difference_update, handles)
                    return drawn
        gc.collect()  # a dead engine, kept by a reference cycle until collected
    raise RuntimeError(
        f"no {count} CUDA streams of {device} left that no live engine holds "
        f"({len(held)} of torch's pool of {POOL} are held)"
    )

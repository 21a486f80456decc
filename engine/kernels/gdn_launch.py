"""How the Gated DeltaNet recurrence launches (engine/kernels/triton_gdn_recurrent.py): the grid
kernel's (`RecurrentLaunch`) and the persistent, pipelined one's (`PipelinedLaunch`,
`engine.gdn_decode: pipelined`). The engine runs the defaults; benchmarks/bench_gdn_kernels.py
--recurrent hands the CUDA ops others to time them in the engine's own op.

Plain Python: the benchmark's argument parsing imports it without triton.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kernels import SMS


@dataclass(frozen=True)
class RecurrentLaunch:
    """The recurrence's launch (a decode step's Gated DeltaNet, the leading one-token rows of a
    mixed step): value columns a program and warps a program; and the form of a token's
    update, shared by the pipelined kernel.

    64 columns x 4 warps: of the 16 launches `bench_gdn_kernels --recurrent` sweeps (one layer
    call, 0.8b, fp32 state) the fastest at 64 and 128 rows on the H200, where at batch 64 the
    recurrence reads its fp32 state at ~72% of the bandwidth; 1 warp a program spills at 64
    columns and more. `one_pass`: both of a token's sums over the state's key axis from the
    state as it came in, against the sum of the updated state; off, since one pass is slower
    on the H200 (about 15% at 64 rows)."""

    bv: int = 64
    warps: int = 4
    one_pass: bool = False


@dataclass(frozen=True)
class PipelinedLaunch:
    """`engine.gdn_decode: pipelined`'s launch: value columns a tile, warps and programs an SM,
    the pipeline's stages (2: one tile's state in flight ahead; the sm_90 compile at BV 64
    takes 167 registers, so 3 programs of 4 warps an SM, and 34 KB of shared memory), and the
    device's streaming multiprocessors the programs are counted from. Not yet timed against
    the grid on a GPU: `bench_gdn_kernels --recurrent` times it under each launch of its
    PIPELINED_SWEEP beside the grid's."""

    bv: int = 64
    warps: int = 4
    per_sm: int = 3
    stages: int = 2
    sms: int = SMS

    def programs(self, tiles: int) -> int:
        """The persistent grid: at most `per_sm` programs an SM, no more than the tiles."""
        return min(tiles, self.sms * self.per_sm)


RECURRENT_LAUNCH = RecurrentLaunch()
PIPELINED_LAUNCH = PipelinedLaunch()

"""How our Triton decode attention (engine/kernels/triton_decode.py, `engine.decode_attention:
triton`) launches: how many splits a row's tokens are cut into, and each head dim's tile,
warps and pipeline stages. Everything here comes from shapes alone (rows, heads, head dim),
never from the rows' lengths: a CUDA graph captured at a bucket replays one grid for every
step of that bucket (INVARIANTS 58).

Plain Python: the config tests and the benchmark's argument parsing import it without triton.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.kernels import SMS  # the engine passes its device's own count

# The decode attention of the models served on GPUs, (q_heads, kv_heads, head_dim): the
# shapes the compile test, the GPU tests and benchmarks/bench_decode_attention.py take
SHAPES = {"0.8b": (8, 2, 256), "3b": (24, 8, 128)}
PROGRAMS_PER_SM = 3  # what the split count aims a step's programs at
MAX_SPLITS = 16


def _power_of_two(value: int, low: int, high: int) -> bool:
    return low <= value <= high and not value & (value - 1)


def decode_splits(rows: int, kv_heads: int, sms: int = SMS) -> int:
    """The splits of each row's tokens for a decode step of `rows` rows: the smallest power of
    two that gives the step at least PROGRAMS_PER_SM programs an SM (rows x kv_heads x splits
    >= 3 x sms), at most MAX_SPLITS; 1 where rows x kv_heads already does.

    Why: a program reads one row's K/V for one KV head, so rows x kv_heads programs alone leave
    most SMs idle at small batches (0.8b's 2 KV heads at 64 rows: 128 programs on 132 SMs, one
    row's 512 tokens walked by one program); splitting each row's tokens gives every SM a few
    programs to switch between while its loads wait. Powers of two keep the compiled variants
    few (the split count is a constexpr: one compile each). The cap bounds the partials (the
    merge reads rows x splits x q_heads x head_dim fp32) and the empty programs of short rows:
    a split holds whole tiles, so a 256-token row of 64-token tiles fills at most 4 splits.

    At 132 SMs: 0.8b (2 KV heads) 16 splits up to 24 rows, 8 at 32-48, 4 at 64-96, 2 at
    128-192, 1 from 224; Orpheus 3b (8 KV heads) 16 at 1-4 rows, 8 at 8, 4 at 16-24, 2 at
    32-48, 1 from 64."""
    if rows < 1 or kv_heads < 1 or sms < 1:
        raise ValueError(f"decode_splits: rows {rows}, kv_heads {kv_heads}, sms {sms}")
    splits = 1
    while rows * kv_heads * splits < PROGRAMS_PER_SM * sms and splits < MAX_SPLITS:
        splits *= 2
    return splits


@dataclass(frozen=True)
class DecodeLaunch:
    """The first kernel's launch: `block_n` tokens a tile (a power of two, 16 to 256; at least
    tl.dot's 16), `warps`, `stages` (software pipelining of the tile loop's K and V loads)."""

    block_n: int
    warps: int = 4
    stages: int = 3

    def __post_init__(self) -> None:
        if not _power_of_two(self.block_n, 16, 256):
            raise ValueError(f"block_n must be a power of two in 16..256, got {self.block_n}")
        if self.warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"warps must be 1, 2, 4, 8 or 16, got {self.warps}")
        if not 1 <= self.stages <= 6:
            raise ValueError(f"stages must be in 1..6, got {self.stages}")


def launch_for(head_dim: int) -> DecodeLaunch:
    """The default launch for a head dim. A tile of K and V is 2 x block_n x head_dim x 2 bytes
    in bf16: 32 KiB at block_n 64 for 128 (Orpheus 3b) and at 32 for 256 (0.8b). 2 stages: one
    tile in flight while the program works on the last. On the H200 (`bench_decode_attention
    --sweep`, one layer call in graphs, equal lengths) 2 stages beat 3 at every serving shape,
    0.8b 64 rows x 512 tokens 33.8 -> 29.4 us, 128 x 512 55.5 -> 47.7; 3b 64 x 512 48.8 -> 43.5
    us; 4 stages were slower than 3. The sm_90
    compile (tests/test_triton_compile.py; scripts/kernel_registers.py) keeps it unspilled. 4
    warps: the score tile [16, block_n] and the fp32 output [16, head_dim] over 128 threads.
    block_n 64 at head dim 256 takes 138 KiB of shared memory at 3 stages (one program an SM)."""
    return DecodeLaunch(block_n=64 if head_dim <= 128 else 32, warps=4, stages=2)


def launch_sweep(head_dim: int) -> list[DecodeLaunch]:
    """The default launch, then each axis moved alone around it: block_n halved and doubled
    (up to 128), warps 2 and 8, the other stage counts of 1 to 4 (what the benchmark's --sweep
    tries)."""
    base = launch_for(head_dim)
    variants = [
        DecodeLaunch(n, base.warps, base.stages) for n in (base.block_n // 2, base.block_n * 2)
    ]
    variants += [DecodeLaunch(base.block_n, w, base.stages) for w in (2, 8)]
    variants += [
        DecodeLaunch(base.block_n, base.warps, s) for s in (1, 2, 3, 4) if s != base.stages
    ]
    return [base, *(v for v in variants if v.block_n <= 128)]

"""How our dense GEMM (engine/kernels/triton_gemm.py, `engine.dense_kernel: triton`) launches:
its tiles, K split, warps and stages from the shapes alone, so a CUDA graph replays the same
grid (`plan`), and which products can carry an epilogue or prologue.

Plain Python beside triton's `cdiv`: no kernel here.

The tiles (`plan`, from the shapes alone, so a CUDA graph replays the same grid):
- BLOCK_M = next power of two >= M, at least 16 (tl.dot's smallest); the rows past M are
  masked loads, never stores.
- BLOCK_K = 128 (64 at BLOCK_M 128, to keep the stages' shared memory at 128 KiB), 4 stages:
  a program keeps 4 x BLOCK_N x 128 x 2 = 64 KiB of weight in flight at BLOCK_N 64, over the
  29 KiB an SM needs; 4 x (64 + 64) x 128 x 2 = 128 KiB of shared memory at M = 64.
- BLOCK_N = max(64, BLOCK_M): every program rereads its K-slice of x from L2, BLOCK_M / BLOCK_N
  bytes of x for each byte of weight, so BLOCK_N below BLOCK_M would make L2, not HBM, the
  bound (L2 reads of x twice the weight's at M = 64 and BLOCK_N 32). An LM head (cdiv(N, 64)
  >= 4 x 132) takes BLOCK_N 128: half the programs, x's rereads halved.
- SPLIT_K: the N tiles alone must give at least half the SMs a program (66); below that the
  K axis is split in two, four, ... up to MAX_SPLIT (each split at least two BLOCK_K steps;
  a split rounded up to whole steps may leave fewer: 3584 in 7 of 512) and a second
  launch sums the fp32 partials in split order (deterministic) and rounds once.

Programs at 0.8b (hidden 1024, M = 64; packed projections as engine/kernels/cuda_ops.py packs
them) and the weight each streams:

    GEMM                      N x K           MB    N tiles  split  programs  KB a program
    Gated DeltaNet in-proj    8224 x 1024    16.8    129      1      129        128
    attention q|k|v           5120 x 1024    10.5     80      1       80        128
    MLP gate|up               7168 x 1024    14.7    112      1      112        128
    out_proj, o_proj          1024 x 2048     4.2     16      8      128         32
    down_proj                 1024 x 3584     7.3     16      7      112         64
    LM head (tied)          248320 x 1024   508.6   1940      1     1940        256

Orpheus 3b (hidden 3072): q|k|v 5120 x 3072 (80 programs, 384 KB each), gate|up 16384 x 3072
(256), o_proj 3072 x 3072 and down_proj 3072 x 8192 (48 tiles, split 2: 96), LM head
156940 x 3072 (1227 tiles of 128). The split's partials (split x M x N x 4 bytes: 2 MB at
0.8b's out_proj) stay in the 50 MB L2; its second launch is the price (cuBLAS pays one too,
24 a 0.8b decode step). A single launch whose last program per tile sums the partials (a
semaphore) would save it; not done until the GPU says the two-launch form pays.
"""

from __future__ import annotations

from typing import NamedTuple

import triton

from engine.kernels import SMS

MAX_SPLIT = 8  # partials of at most 8 x M x N fp32 (2 MB at M = 64, N = 1024)
LINE = 64  # 16-bit values in a 128-byte line
PREFETCH_BYTES = 128 * 1024  # of weight a program prefetches (PDL): 17 MB over 132 SMs

# The dense GEMMs of a decode step, (N, K), as the CUDA ops run them (packed where packed): the
# shapes the compile test, the GPU tests and benchmarks/bench_gemm.py take.
SHAPES = {
    "0.8b": {
        "gdn_in_proj": (8224, 1024), "attn_qkv": (5120, 1024), "mlp_gate_up": (7168, 1024),
        "out_proj": (1024, 2048), "down_proj": (1024, 3584), "lm_head": (248_320, 1024),
    },
    "3b": {
        "attn_qkv": (5120, 3072), "mlp_gate_up": (16_384, 3072), "o_proj": (3072, 3072),
        "down_proj": (3072, 8192), "lm_head": (156_940, 3072),
    },
}  # fmt: skip


class GemmPlan(NamedTuple):
    block_m: int
    block_n: int
    block_k: int
    k_per_split: int  # a multiple of block_k; K itself without a split
    split: int  # programs along K (1: no partials, no second launch)
    warps: int
    stages: int
    prefetch_lines: int = 1  # a power of two: lines of each weight row prefetched (PDL)

    def programs(self, n: int) -> int:
        return triton.cdiv(n, self.block_n) * self.split


def plan(m: int, n: int, k: int, split: int | None = None) -> GemmPlan:
    """The launch for x [m, k] @ W[n, k]^T; `split` forces the K split (a benchmark's arm)."""
    block_m = max(16, triton.next_power_of_2(m))
    block_n = max(64, block_m)
    if block_n == 64 and triton.cdiv(n, 64) >= 4 * SMS:
        block_n = 128
    block_k = 128 if block_m <= 64 else 64
    tiles = triton.cdiv(n, block_n)
    if split is None:
        split = 1
        while tiles * split < SMS // 2 and split < MAX_SPLIT and k >= 4 * block_k * split:
            split *= 2
    k_per_split = triton.cdiv(triton.cdiv(k, split), block_k) * block_k
    split = triton.cdiv(k, k_per_split)  # rounding k_per_split up may leave fewer splits
    warps = 4 if block_m * block_n <= 64 * 64 else 8
    lines = min(k_per_split // LINE, PREFETCH_BYTES // (2 * LINE * block_n))
    lines = 1 << (lines.bit_length() - 1)  # tl.arange's power of two, rounded down
    return GemmPlan(block_m, block_n, block_k, k_per_split, split, warps, 4, lines)


def fuses_conv(m: int, n: int, k: int, split: int | None = None) -> bool:
    """Whether x [m, k] @ W[n, k]^T can carry the conv epilogue: a product without a K split
    (each output element stored once, by the program that summed it)."""
    return plan(m, n, k, split).split == 1


def fuses_prologue(
    m: int, n: int, k: int, head: int, whole_head: bool, split: int | None = None
) -> bool:
    """Whether x [m, k] @ W[n, k]^T can read x through a prologue over heads of `head` columns
    (k whole heads): each K tile inside one head, and with `whole_head` (the gated norm, a sum
    over the head) exactly one."""
    block_k = plan(m, n, k, split).block_k
    fits = block_k == head if whole_head else head % block_k == 0
    return fits and k % head == 0

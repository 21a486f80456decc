"""Registers and spill bytes of each of the engine's Triton kernels on the H200 (sm_90), from
`ptxas -v`, without a GPU (engine/kernels/offline.py). A kernel that spills pays local-memory
traffic on every use of the spilled values: the first thing to read when a kernel is slower
than its arithmetic says.

    PYTHONPATH=.:<a directory with triton> python scripts/kernel_registers.py [--warps 4 8] [--only gdn]
    ... scripts/kernel_registers.py --split chunk=64,prepare_warps=8
        (the split kernel's launches under a SplitConfig, engine/kernels/gdn_config.py)
    ... scripts/kernel_registers.py --only _decode --specialise
        (with the JIT's divisibility hints, as the GPU compiles: aligned, pipelined loads)
"""

from __future__ import annotations

import argparse

import torch

from engine.config.gdn_split import parse_split_config
from engine.kernels import offline, offline_compile


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/kernel_registers.py")
    parser.add_argument(
        "--warps", type=int, nargs="+", default=[None], help="default: each launch's own"
    )
    parser.add_argument("--only", default="", help="kernels whose name contains this")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--split", default=None, help="the split kernel under this SplitConfig")
    parser.add_argument(
        "--specialise", action="store_true",
        help="with the JIT's divisibility hints, as the GPU compiles (offline_compile.compile_launch)",
    )  # fmt: skip
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    if args.split is None:
        launches = offline.record_launches(dtype)
    else:
        launches = offline.record_split_launches(parse_split_config(args.split), dtype)
    seen = set()
    for launch in launches:
        name = launch.kernel.fn.__name__
        named = ("C", "BV", "PERSISTENT", "HEAD_DIM", "BLOCK_N", "SPLITS")
        shown = {k: v for k, v in launch.constexprs.items() if k in named}
        shown |= {"SCORES": True} if "SCORES" in _given(launch) else {}
        if launch.key in seen or args.only not in name:
            continue
        seen.add(launch.key)
        for warps in args.warps:
            compiled = offline_compile.compile_launch(
                launch, num_warps=warps, specialise=args.specialise
            )
            text = ", ".join(f"{k}={v}" for k, v in shown.items())
            text += " fixed grid" if launch.fixed_grid else ""
            stages = launch.options.get("num_stages", 3)
            print(
                f"{name} {text} warps={compiled.metadata.num_warps} stages={stages}: "
                f"{offline_compile.ptxas_report(compiled)}, shared {compiled.metadata.shared} B"
            )


def _given(launch: offline.Launch) -> set[str]:
    """The kernel's parameters given a tensor at this launch."""
    names = [p.name for p in launch.kernel.params]
    return {n for n, a in zip(names, launch.args, strict=False) if a is not None}


if __name__ == "__main__":
    main()

"""Registers and spill bytes of each of the engine's Triton kernels on the H200 (sm_90), from
`ptxas -v`, without a GPU (engine/kernels/offline.py). A kernel that spills pays local-memory
traffic on every use of the spilled values: the first thing to read when a kernel is slower
than its arithmetic says.

    PYTHONPATH=.:<a directory with triton> python scripts/kernel_registers.py [--warps 4 8] [--only gdn]
"""

from __future__ import annotations

import argparse

import torch

from engine.kernels import offline


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/kernel_registers.py")
    parser.add_argument("--warps", type=int, nargs="+", default=[4])
    parser.add_argument("--only", default="", help="kernels whose name contains this")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    args = parser.parse_args()
    seen = set()
    for launch in offline.record_launches(getattr(torch, args.dtype)):
        kernel, launch_args, constexprs = launch.kernel, launch.args, launch.constexprs
        name = kernel.fn.__name__
        key = (name, tuple(sorted(constexprs.items())), launch.fixed_grid)
        if key in seen or args.only not in name:
            continue
        seen.add(key)
        for warps in args.warps:
            compiled = offline.compile_launch(kernel, launch_args, constexprs, num_warps=warps)
            shown = ", ".join(f"{k}={v}" for k, v in constexprs.items() if k in ("C", "BV"))
            shown += " fixed grid" if launch.fixed_grid else ""
            print(f"{name} {shown} warps={warps}: {offline.ptxas_report(compiled)}")


if __name__ == "__main__":
    main()

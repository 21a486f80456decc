"""Every Triton kernel of the engine compiles for the H200 (sm_90), with the arguments its
wrapper passes at Qwen3.5-0.8B's shapes (the SNAC codec's at 24 kHz), in bf16 and fp32,
without a GPU
(engine/kernels/offline.py: the launches recorded, then compiled down to a cubin).

Why: the interpreter (tests/test_triton_interpret.py) checks what a kernel computes, not
whether the compiler accepts it. A kernel it ran exactly was once refused by the H200's
compile ("constexpr cannot be reassigned" in an unrolled loop), which cost a device call.
Needs the `triton` package (skips where it is missing, as in CI)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from engine.kernels import offline, offline_compile, triton_gemm  # noqa: E402
from engine.kernels.gdn_config import SPLIT_DEFAULT, SPLIT_LEGACY, split_sweep  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_every_triton_kernel_compiles_for_sm90(dtype):
    compiled, fixed = set(), set()
    for launch in offline.record_launches(dtype):
        binary = offline_compile.compile_launch(launch)
        assert binary.asm["cubin"], launch.kernel.fn.__name__
        compiled.add(launch.kernel.fn.__name__)
        if launch.fixed_grid:
            fixed.add(launch.kernel.fn.__name__)
    wanted = {
        "_rms_norm_kernel", "_head_norm_rope_kernel", "_gated_norm_kernel", "_silu_mul_kernel",
        "_sigmoid_gate_kernel", "_store_kv_kernel", "_conv_kernel", "_conv_state_kernel",
        "_conv_decode_kernel",
        "_gdn_recurrent_kernel", "_gdn_decode_pipelined_kernel",
        "_gdn_chunked_kernel", "_gdn_prepare_kernel", "_gdn_states_kernel", "_gdn_outputs_kernel",
        "_snake_kernel", "_residual_snake_conv_kernel", "_shift_scale_kernel",
        "_argmax_parts_kernel", "_argmax_pick_kernel", "_decode_kernel", "_merge_kernel",
    }  # fmt: skip
    assert compiled == wanted
    # the capturable Gated DeltaNet op's launches (engine.piecewise_gdn), bounds on the device
    assert fixed == {
        "_conv_state_kernel", "_gdn_recurrent_kernel",
        "_gdn_prepare_kernel", "_gdn_states_kernel", "_gdn_outputs_kernel",
    }  # fmt: skip


def test_every_config_the_split_sweep_tries_compiles_for_sm90():
    """benchmarks/bench_gdn_kernels.py --sweep times the captured form of the split kernel
    under every config of `split_sweep`: each of its launches compiles for sm_90, and its
    blocks fit in the shared memory an H200 block may have (pipeline stages multiply a loop's
    tiles; a block over the limit fails at launch, not at compile). The configs' launches
    differ from the default's where they change a constexpr, an option or an argument's type
    (the scores scratch); those compile once each, in parallel."""
    configs = split_sweep()
    assert configs[:2] == [SPLIT_DEFAULT, SPLIT_LEGACY] and len(set(configs)) == len(configs)
    results = offline_compile.compile_split_configs(configs)
    kernels = {r.kernel for r in results}
    assert kernels == {
        "_gdn_recurrent_kernel", "_gdn_prepare_kernel", "_gdn_states_kernel",
        "_gdn_outputs_kernel",
    }  # fmt: skip
    for result in results:
        assert result.cubin, result
        assert result.shared <= offline_compile.H200_SHARED_BYTES, result
    assert len(results) > 3 * len(configs) // 4  # most configs change some kernel's compile


def test_skinny_gemm_compiles_for_sm90_at_every_real_shape():
    """engine.dense_kernel triton: the GEMM and its split sum at each dense GEMM of 0.8b and
    Orpheus 3b, rows 1, 16, 64 and 128 (triton_gemm.SHAPES), bf16 and fp16, each distinct
    launch compiled once with the JIT's divisibility hints (aligned loads: without them the
    loop is not pipelined); its loads pipelined (cp.async) and its blocks within an H200
    block's shared memory (the stages' tiles: 128 KiB at 64 rows, 192 KiB for an LM head's
    128-wide tiles). The grids are the plan's:
    0.8b's down_proj at 64 rows is 16 tiles x 7 splits, its LM head 1940 tiles of 128."""
    launches = offline.record_gemm_launches(torch.bfloat16)
    launches += offline.record_gemm_launches(torch.float16)
    assert {launch.kernel.fn.__name__ for launch in launches} == {
        "_skinny_gemm_kernel",
        "_split_sum_kernel",
        "_rms_norm_kernel",  # summing an output projection's partials (dense_epilogues)
    }
    distinct = {launch.variant: launch for launch in launches}
    for launch in distinct.values():
        # as the GPU's JIT compiles it
        binary = offline_compile.compile_launch(launch, specialise=True)
        assert binary.asm["cubin"], launch.key
        assert binary.metadata.shared <= offline_compile.H200_SHARED_BYTES, (
            launch.key,
            binary.metadata,
        )
        if launch.kernel.fn.__name__ == "_skinny_gemm_kernel":  # the weight's loads pipelined
            assert "cp.async" in binary.asm["ptx"], launch.key
    gemms = [launch for launch in launches if launch.kernel.fn.__name__ == "_skinny_gemm_kernel"]
    by_shape = {(launch.args[3], launch.args[4], launch.args[5]): launch.grid for launch in gemms}
    assert by_shape[(64, 1024, 3584)] == (16, 7)
    assert by_shape[(64, 248_320, 1024)] == (1940, 1)
    assert by_shape[(64, 8224, 1024)] == (129, 1)
    assert by_shape[(64, 3584, 1024)] == (112, 1)  # gate|up with SiLU-mul: 32 of each a tile
    fused = [g for g in gemms if g.constexprs.get("SILU_MUL")]
    assert len(fused) == 2 * 2 * len(offline.GEMM_ROWS)  # 0.8b and 3b, bf16 and fp16
    assert any(g.constexprs.get("PARTIAL") for g in fused)  # 128 rows: split, sum fused
    convs = [g for g in gemms if g.args[10] is not None]  # 0.8b's in-projection + its conv
    assert len(convs) == 2 * sum(triton_gemm.fuses_conv(m, 8224, 1024) for m in offline.GEMM_ROWS)
    assert {g.args[3] for g in convs} == {1, 16, 64}  # 128 rows split K in two: no epilogue
    # out_proj read through the gated norm at 1, 16, 64 rows (128 rows take BLOCK_K 64, half a
    # head: no norm), o_proj through the sigmoid gate at every row count; bf16 and fp16
    prologues = [(g.constexprs.get("PROLOGUE"), g.args[3]) for g in gemms]
    assert sorted(m for p, m in prologues if p == 1) == [1, 1, 16, 16, 64, 64]
    assert sorted(m for p, m in prologues if p == 2) == [1, 1, 16, 16, 64, 64, 128, 128]


def test_decode_attention_compiles_for_sm90_under_every_launch_the_sweep_tries():
    """engine.decode_attention triton at 0.8b's and Orpheus 3b's heads (decode_config.SHAPES),
    one split and four (the merge), under every launch of `launch_sweep` (the default first),
    each compiled with the JIT's divisibility hints: a cubin, within an H200 block's shared
    memory. The K and V tiles are pipelined (num_stages above 1): cp.async, and shared memory
    for num_stages - 1 tiles of both in flight (the page ids loaded a tile ahead; loaded in the iteration that
    reads them, the pipeliner kept one tile at any stage count below 5). The default launches
    spill nothing (ptxas)."""
    from engine.kernels.decode_config import DecodeLaunch, launch_for

    launches = offline.record_decode_launches(torch.bfloat16, sweep=True)
    distinct = {launch.variant: launch for launch in launches}
    checked = 0
    for launch in distinct.values():
        binary = offline_compile.compile_launch(launch, specialise=True)
        assert binary.asm["cubin"], launch.key
        assert binary.metadata.shared <= offline_compile.H200_SHARED_BYTES, (
            launch.key,
            binary.metadata,
        )
        if launch.kernel.fn.__name__ != "_decode_kernel":
            continue
        block_n, head_dim = launch.constexprs["BLOCK_N"], launch.constexprs["HEAD_DIM"]
        stages, warps = launch.options["num_stages"], launch.options["num_warps"]
        tile = 2 * block_n * head_dim * 2  # K and V, bf16
        if stages > 1:  # one stage: no pipelining
            assert "cp.async" in binary.asm["ptx"], launch.key
            assert binary.metadata.shared >= (stages - 1) * tile, (launch.key, binary.metadata)
        if launch_for(head_dim) == DecodeLaunch(block_n, warps, stages):
            assert " 0 bytes spill stores" in offline_compile.ptxas_report(binary), launch.key
            checked += 1
    assert checked == 4  # two shapes, one split and four


def test_the_codecs_approximate_sine_is_one_instruction_and_no_local_memory():
    """engine.codec_sine: the codec kernels' sines. "exact" is libdevice's sinf (a reduction
    with a local-memory array for huge arguments: a stack frame in every launch, and ~40
    instructions a sine); "approx" is the SFU's `sin.approx`, no local memory. The fused
    unit's kernel recomputes 7 sines an output (one a tap), so this is its instruction count."""
    launches = [
        launch
        for launch in offline.record_launches(torch.bfloat16)
        if launch.kernel.fn.__name__ in ("_snake_kernel", "_residual_snake_conv_kernel")
    ]
    forms = {False: [], True: []}
    for launch in launches:
        forms[launch.constexprs["APPROX"]].append(offline_compile.compile_launch(launch).asm["ptx"])
    assert forms[False] and forms[True]
    for ptx in forms[True]:
        assert "sin.approx" in ptx and ".local" not in ptx
    for ptx in forms[False]:
        assert "sin.approx" not in ptx and ".local" in ptx


# The kernels of a decode step, each launched programmatically under engine.pdl
PDL_KERNELS = {
    "_rms_norm_kernel", "_head_norm_rope_kernel", "_gated_norm_kernel", "_silu_mul_kernel",
    "_sigmoid_gate_kernel", "_store_kv_kernel", "_conv_decode_kernel", "_gdn_recurrent_kernel",
    "_argmax_parts_kernel",
    "_gdn_decode_pipelined_kernel",
    "_argmax_pick_kernel", "_decode_kernel", "_merge_kernel", "_skinny_gemm_kernel",
    "_split_sum_kernel",
}  # fmt: skip


def test_pdl_kernels_wait_before_anything_else_and_plain_ones_are_unchanged():
    """engine.pdl (engine/kernels/triton_pdl.py): every kernel of a decode step has the `PDL`
    parameter, and compiled with it each holds griddepcontrol.launch_dependents and
    griddepcontrol.wait, the wait before its first global load or store except the dense
    GEMM's L2 prefetch of its weight (prefetch.global.L2 and nothing else first); compiled
    without it (the default, every CPU run) none of the three instructions is there."""
    launches = offline.record_launches(torch.bfloat16) + offline.record_decode_launches()
    rows = {"_skinny_gemm_kernel": 3, "_split_sum_kernel": 2}  # M's place in the arguments
    gemms = offline.record_gemm_launches()  # at 64 rows: the decode step measured
    launches += [
        g for g in gemms  # and the norm summing a split's partials: a program a row
        if (g.args[rows[g.kernel.fn.__name__]] if g.kernel.fn.__name__ in rows else g.grid[0]) == 64
    ]  # fmt: skip
    with_param = {
        launch.kernel.fn.__name__ for launch in launches
        if "PDL" in [p.name for p in launch.kernel.params]
    }  # fmt: skip
    assert with_param == PDL_KERNELS
    distinct = {launch.variant: launch for launch in launches
                if launch.kernel.fn.__name__ in PDL_KERNELS}  # fmt: skip
    for launch in distinct.values():
        name = launch.kernel.fn.__name__
        plain = offline_compile.compile_launch(launch, specialise=True).asm["ptx"]
        assert "griddepcontrol" not in plain and "prefetch.global" not in plain, name
        pdl = launch._replace(constexprs={**launch.constexprs, "PDL": True},
                              options={**launch.options, "launch_pdl": True})  # fmt: skip
        ptx = offline_compile.compile_launch(pdl, specialise=True).asm["ptx"]
        body = ptx[ptx.index(".entry") :]
        wait = body.index("griddepcontrol.wait")
        assert body.index("griddepcontrol.launch_dependents") < wait, name
        first_access = min(
            (body.find(op) for op in ("ld.global", "st.global", "cp.async", "atom.global")
             if op in body), default=len(body),
        )  # fmt: skip
        assert wait < first_access, name
        if name == "_skinny_gemm_kernel":
            assert -1 < body.find("prefetch.global.L2") < wait, name


def test_the_pipelined_recurrence_streams_its_state_through_shared_memory():
    """engine.gdn_decode pipelined at 0.8b's heads (fp32 state, the default launch, with the
    JIT's hints): the state tile's loads are Triton-pipelined (cp.async into shared memory,
    at least one BV x 128 fp32 tile of it a stage ahead) and the block fits an H200 block's
    shared memory; the grid recurrence it replaces loads straight to registers (no cp.async,
    no such shared memory)."""
    from engine.kernels.gdn_launch import PIPELINED_LAUNCH

    launches = offline.record_launches(torch.bfloat16)
    by_name = {launch.kernel.fn.__name__: launch for launch in launches}
    pipelined = offline_compile.compile_launch(
        by_name["_gdn_decode_pipelined_kernel"], specialise=True
    )
    grid = offline_compile.compile_launch(by_name["_gdn_recurrent_kernel"], specialise=True)
    tile = 128 * PIPELINED_LAUNCH.bv * 4  # k_dim x BV fp32
    stages = PIPELINED_LAUNCH.stages
    assert "cp.async" in pipelined.asm["ptx"]
    assert (stages - 1) * tile <= pipelined.metadata.shared <= offline_compile.H200_SHARED_BYTES
    assert "cp.async" not in grid.asm["ptx"] and grid.metadata.shared < tile

"""`engine.dense_epilogues` in Triton's interpreter on the CPU: our dense GEMM with the MLP's
SiLU-and-multiply in its epilogue, and an output projection's K-split partials summed by the
RMS norm that reads them (engine/kernels/triton_gemm.py, triton_norms.rms_norm), each against
the unfused pair of kernels it replaces, bit for bit; and the CUDA ops routing a product to
them only where the setting and `dense_kernel: triton` say. On the GPU the same comparisons
are tests/test_gpu_kernels.py's.

Needs the `triton` package (skips without it, as in CI)."""

from __future__ import annotations

import pytest

from tests.test_triton_interpret import WIDENED_BF16_DOT, _interpret

pytest.importorskip("triton")

# The interpreter scripts' common head (tests/test_gemm_prologues.py's too): its report,
# filled in and printed as the last line
SCRIPT_HEAD = r"""
import json
from types import SimpleNamespace
import torch
from engine.config import KernelsConfig
from engine.kernels import triton_gemm, triton_norms
from engine.kernels.cuda_ops import CudaOps

torch.manual_seed(0)
report = {}


def refused(calls):
    # each call's ValueError message, or None where it ran
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = None
        except ValueError as exc:
            out[name] = str(exc)
    return out
"""

EPILOGUE_CHECK = r"""
from engine.layers.norm import RMSNorm
from engine.models.decoder import GatedMLP


def same(a, b):
    return bool(torch.equal(a, b))


for dtype in (torch.bfloat16, torch.float16):
    tag = str(dtype)[6:]
    # gate|up [2 NH, K] -> silu(gate) * up [M, NH]; NH not a multiple of the tile, K not of
    # BLOCK_K, x's rows strided; the split off, one, forced to 3
    for m, nh, k in ((7, 100, 384), (64, 72, 1024), (16, 40, 200)):
        wide = torch.randn(2 * m, k).to(dtype)
        x = wide[::2]
        w = (torch.randn(2 * nh, k) / k**0.5).to(dtype)
        gate, up = (x.float() @ w.float().T).split(nh, dim=1)
        exact = torch.nn.functional.silu(gate) * up
        for split in (None, 1, 3):
            fused = triton_gemm.skinny_linear(x, w, split=split, silu_mul=True)
            unfused = triton_norms.silu_mul(triton_gemm.skinny_linear(x, w, split=split))
            report[f"silu-{tag}-{m}x{nh}x{k}-split{split}"] = {
                "same": same(fused, unfused), "shape": list(fused.shape),
                "dtype": str(fused.dtype),
                "err": ((fused.float() - exact).abs() / (1 + exact.abs())).max().item(),
            }
    # an output projection into the post-attention norm: its partials summed by the norm
    for m, n, k in ((7, 72, 3584), (64, 136, 2048), (5, 96, 256)):
        x = torch.randn(m, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        residual = torch.randn(m, n).to(dtype)
        scale = 1 + 0.1 * torch.randn(n)
        product = triton_gemm.skinny_linear(x, w, partials=True)
        normed, summed = triton_norms.rms_norm(product, scale, 1e-6, residual)
        want_normed, want_summed = triton_norms.rms_norm(
            triton_gemm.skinny_linear(x, w), scale, 1e-6, residual
        )
        report[f"partials-{tag}-{m}x{n}x{k}"] = {
            "partials": isinstance(product, triton_gemm.Partials),
            "split": triton_gemm.plan(m, n, k).split,
            "same": same(normed, want_normed) and same(summed, want_summed),
            "dtype": str(normed.dtype),
        }

# the head's norm of each row's last token: the rows gathered in the norm's launch
for dtype in (torch.bfloat16, torch.float32):
    x, residual = torch.randn(2, 40, 128).to(dtype)
    rows, scale = torch.tensor([39, 0, 7, 7]), 1 + 0.1 * torch.randn(128)
    gathered = triton_norms.rms_norm(x, scale, 1e-6, residual, rows=rows)
    indexed = triton_norms.rms_norm(x[rows], scale, 1e-6, residual[rows])
    report[f"gather-{str(dtype)[6:]}"] = all(same(a, b) for a, b in zip(gathered, indexed))

# the CUDA ops: the fused kernels where dense_epilogues and dense_kernel triton say, else the
# unfused pair; the same bits either way
model = torch.nn.ModuleDict({"mlp": GatedMLP(128, 2048), "norm": RMSNorm(128)})
model.norm.weight.data.normal_(0, 0.1)
model = model.to(torch.bfloat16)
x, residual = torch.randn(2, 9, 128).bfloat16()
results, calls = {}, []
fused_kernel = triton_gemm._skinny_gemm_kernel
for dense, epilogues in (("triton", True), ("triton", False), ("torch", True)):
    config = KernelsConfig(dense_kernel=dense, dense_epilogues=epilogues)
    ops = CudaOps(model, torch.device("cpu"), 16, config=config)
    act = ops.swiglu(x, model.mlp.gate_proj, model.mlp.up_proj)
    down = ops.linear(model.mlp.down_proj, act, to_norm=True)
    kind = type(down).__name__
    results[(dense, epilogues)] = (act, *ops.norm(down, model.norm, residual), kind)
on, off, torch_ = (results[key] for key in (("triton", True), ("triton", False), ("torch", True)))
report["ops"] = {
    "kinds": [on[3], off[3], torch_[3]],
    "same": all(same(a, b) for a, b in zip(on[:3], off[:3])),
    "torch_close": max((a.float() - b.float()).abs().max().item()
                       for a, b in zip(on[:3], torch_[:3])),
}
# a layer's down_proj handed to the next layer's input norm unsummed (`to_norm`): three
# layers with an identity mixer, each output to the next; the last one summed
from engine.models.decoder import DecoderLayer


class Block(DecoderLayer):
    def mix(self, h, cos, sin, batch, cache):
        return h


blocks = torch.nn.ModuleList(Block(128, 2048, 1e-6) for _ in range(3))
for block in blocks:
    for norm in (block.input_layernorm, block.post_attention_layernorm):
        norm.weight.data.normal_(0, 0.1)
blocks = blocks.to(torch.bfloat16)
outs, kinds, start = {}, {}, torch.randn(9, 128).bfloat16()
for handed in (True, False):
    ops = CudaOps(blocks, torch.device("cpu"), 16, config=KernelsConfig(dense_kernel="triton"))
    batch = SimpleNamespace(ops=ops)
    h, res, seen = start, None, []
    for i, block in enumerate(blocks):
        h, res = block(h, res, None, None, batch, None, to_norm=handed and i < 2)
        seen.append(type(h).__name__)
    outs[handed], kinds[handed] = (h, res), seen
report["layers"] = {
    "kinds": kinds[True], "plain_kinds": kinds[False],
    "same": all(same(a, b) for a, b in zip(outs[True], outs[False])),
}

# a decode step's conv in the in-projection's epilogue: the conv's channels, then z|b|a columns
# (a tile straddles the boundary: 200 is no multiple of 64); slots permuted, one row uncached
from engine.kernels import triton_gdn
from engine.layers.gated_delta import torch_causal_conv1d_update
for dtype in (torch.bfloat16, torch.float16):
    tag = str(dtype)[6:]
    for m, channels, n, k in ((1, 200, 232, 128), (7, 200, 232, 384), (64, 128, 200, 256)):
        x = torch.randn(m, k).to(dtype)
        w = (torch.randn(n, k) / k**0.5).to(dtype)
        taps = (torch.randn(channels, 4) / 2).to(dtype)
        pool = torch.randn(m + 3, channels, 3).to(dtype)
        slots = torch.randperm(m + 3)[:m].int()
        cached = torch.ones(m, dtype=torch.int32)
        cached[m // 2] = 0  # its window reads as zeros
        fused_pool, plain_pool, ref_pool = pool.clone(), pool.clone(), pool.clone()
        epilogue = triton_gemm.ConvEpilogue(taps, fused_pool, slots, cached, channels)
        fused = triton_gemm.skinny_linear(x, w, conv=epilogue)
        product = triton_gemm.skinny_linear(x, w)
        meta = SimpleNamespace(is_decode=True, cached=cached, state_slots=slots, num_rows=m,
                               gdn_tables=None)
        plain = triton_gdn.causal_conv(product[:, :channels], taps, plain_pool, meta)
        ref_pool[slots.long()[cached == 0]] = 0
        ref = torch_causal_conv1d_update(product[:, :channels].float(), taps.float(),
                                         ref_pool, slots.long())
        others = torch.ones(m + 3, dtype=torch.bool)
        others[slots.long()] = False
        report[f"conv-{tag}-{m}x{n}x{k}"] = {
            "same": same(fused[:, :channels], plain) and same(fused[:, channels:],
                                                               product[:, channels:]),
            "windows_same": same(fused_pool, plain_pool),
            "others_untouched": same(fused_pool[others], pool[others]),
            "err": (fused[:, :channels].float() - ref).abs().max().item(),
            "window_err": (fused_pool.float() - ref_pool.float()).abs().max().item(),
        }

# which steps the CUDA ops fuse the conv into: decode steps on our GEMM, setting on, no bucket
from engine.layers.gated_delta import GatedDeltaNet
layer = torch.nn.ModuleDict({"gdn": GatedDeltaNet(64, 2, 2, 16, 16, 4, 1e-6)}).bfloat16()
xs = torch.zeros(4, 64).bfloat16()
decode = SimpleNamespace(is_decode=True, token_bucket=None, gdn_tables=None, num_rows=4)
fused_when = {}
for name, dense, epilogues, batch, rows in (
    ("decode", "triton", True, decode, 4),
    ("setting_off", "triton", False, decode, 4),
    ("cublas", "torch", True, decode, 4),
    ("prefill", "triton", True, SimpleNamespace(**{**vars(decode), "is_decode": False}), 4),
    ("piecewise", "triton", True, SimpleNamespace(**{**vars(decode), "token_bucket": 16}), 4),
    ("padded_tokens", "triton", True, decode, 16),
):
    config = KernelsConfig(dense_kernel=dense, dense_epilogues=epilogues)
    ops = CudaOps(layer, torch.device("cpu"), 16, config=config)
    fused_when[name] = ops._conv_fused(layer.gdn, torch.zeros(rows, 64).bfloat16(), batch)
report["conv_fused_when"] = fused_when

report["errors"] = refused({
    "odd": lambda: triton_gemm.skinny_linear(x, torch.zeros(7, 128).bfloat16(), silu_mul=True),
    "both": lambda: triton_gemm.skinny_linear(x, torch.zeros(8, 128).bfloat16(), silu_mul=True,
                                              partials=True),
    "no_residual": lambda: triton_norms.rms_norm(
        triton_gemm.skinny_linear(torch.zeros(4, 2048).bfloat16(),
                                  torch.zeros(64, 2048).bfloat16(), partials=True),
        torch.ones(64), 1e-6),
    "gather_partials": lambda: triton_norms.rms_norm(
        triton_gemm.skinny_linear(torch.zeros(4, 2048).bfloat16(),
                                  torch.zeros(64, 2048).bfloat16(), partials=True),
        torch.ones(64), 1e-6, torch.zeros(4, 64).bfloat16(), rows=torch.tensor([3])),
    "conv_split": lambda: triton_gemm.skinny_linear(
        torch.zeros(4, 2048).bfloat16(), torch.zeros(64, 2048).bfloat16(),
        conv=triton_gemm.ConvEpilogue(torch.zeros(32, 4).bfloat16(),
                                      torch.zeros(4, 32, 3).bfloat16(), torch.arange(4).int(),
                                      torch.ones(4, dtype=torch.int32), 32)),
})
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    return _interpret(WIDENED_BF16_DOT + SCRIPT_HEAD + EPILOGUE_CHECK)


def test_silu_mul_epilogue_equals_the_unfused_pair_bit_for_bit(report):
    """The fused GEMM (a program's tile half gate's rows, half up's, SiLU-mul in its epilogue
    or, split, in the sum's) stores what silu_mul of the plain product stores, at every split;
    both within one output ulp of fp32 math (plus the intermediate roundings)."""
    silu = {name: r for name, r in report.items() if name.startswith("silu-")}
    assert len(silu) == 2 * 3 * 3
    for name, result in silu.items():
        assert result["same"], (name, result)
        ulp = 2**-7 if "bfloat16" in name else 2**-10
        assert result["err"] <= 3 * ulp, (name, result)
        assert result["dtype"] == "torch." + name.split("-")[1], name
    assert report["silu-bfloat16-7x100x384-splitNone"]["shape"] == [7, 100]


def test_split_partials_summed_by_the_norm_equal_the_gemms_own_sum(report):
    """A split product comes back unsummed and the residual norm sums it in split order,
    rounding where the GEMM's sum launch rounds: the same normed output and residual; an
    unsplit product comes back summed (a plain tensor)."""
    partials = {name: r for name, r in report.items() if name.startswith("partials-")}
    assert len(partials) == 2 * 3
    for name, result in partials.items():
        assert result["same"], (name, result)
        assert result["partials"] == (result["split"] > 1), (name, result)
    assert report["partials-bfloat16-7x72x3584"]["split"] == 7  # 0.8b's down_proj's split
    assert report["partials-bfloat16-5x96x256"]["split"] == 1


def test_cuda_ops_fuse_only_on_our_gemm_with_the_setting_on(report):
    """dense_epilogues with dense_kernel triton: the MLP's down_proj (K 2048, split 8) comes
    back as partials the norm sums; off, a summed tensor; on torch's GEMM, a tensor (the
    setting ignored). Our two paths agree bit for bit, torch's to bf16 rounding."""
    ops = report["ops"]
    assert ops["kinds"] == ["Partials", "Tensor", "Tensor"]
    assert ops["same"]
    assert ops["torch_close"] <= 0.1


def test_a_layers_split_down_proj_is_summed_by_the_next_layers_input_norm(report):
    """With `to_norm`, each layer's down_proj (K 2048: split) comes back as partials, which the
    next layer's input norm sums; the last layer's is summed (its rows are indexed). The
    stack's output and residual are the summed path's, bit for bit."""
    layers = report["layers"]
    assert layers["kinds"] == ["Partials", "Partials", "Tensor"]
    assert layers["plain_kinds"] == ["Tensor"] * 3
    assert layers["same"]


def test_conv_epilogue_equals_the_projection_then_the_decode_conv_bit_for_bit(report):
    """A decode step's in-projection with the causal conv in its epilogue stores what the plain
    product then triton_gdn.causal_conv store: the conv channels' silu(conv), the other columns
    as they are, and every row's shifted window (a row with nothing cached from zeros); other
    slots untouched; within rounding of the torch reference."""
    conv = {name: r for name, r in report.items() if name.startswith("conv-")}
    assert len(conv) == 2 * 3
    for name, result in conv.items():
        assert result["same"] and result["windows_same"], (name, result)
        assert result["others_untouched"], name
        ulp = 2**-7 if "bfloat16" in name else 2**-10
        assert result["err"] <= 8 * ulp and result["window_err"] == 0.0, (name, result)


def test_the_conv_is_fused_only_into_a_decode_steps_projection_on_our_gemm(report):
    """The in-projection and linear_attention both ask `_conv_fused`: yes for a decode step
    on our GEMM with the setting on; no with it off, on cuBLAS, for a prefill step, for the
    piecewise runner's bucket (its pieces replay on other steps) or for padded tokens."""
    assert report["conv_fused_when"] == {
        "decode": True, "setting_off": False, "cublas": False, "prefill": False,
        "piecewise": False, "padded_tokens": False,
    }  # fmt: skip


def test_fused_calls_refuse_what_they_cannot_compute(report):
    errors = report["errors"]
    assert "silu_mul=True" in errors["odd"] and "partials=True" in errors["both"]
    assert "conv=True" in errors["conv_split"]  # a K split would store each output twice
    assert errors["no_residual"] == "rms_norm of a split product's partials needs the residual"
    assert "gathers rows of a summed product" in errors["gather_partials"]


def test_the_heads_norm_gathers_its_rows_in_its_launch(report):
    """rms_norm(x, ..., residual, rows=...) (the head's last tokens, a row twice): what the
    norm of x[rows] and residual[rows] stores, bit for bit, bf16 and fp32."""
    assert report["gather-bfloat16"] and report["gather-float32"]

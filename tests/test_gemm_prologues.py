"""`engine.dense_epilogues`' prologues in Triton's interpreter on the CPU: our dense GEMM
reading its input through Gated DeltaNet's gated norm (out_proj) or gated attention's sigmoid
gate (o_proj) on each K tile (engine/kernels/triton_gemm_fused.py), against the standalone
kernel then the plain GEMM, bit for bit; and the CUDA ops (cuda_dense.py) taking the prologue
only where the setting, our GEMM and the tiles allow. On the GPU: tests/test_gpu_kernels.py.

The interpreter rounds fp32 to bf16 toward zero (the GPU to nearest), so against the torch
reference the bf16 checks allow a few ulps; fused against unfused is exact either way.
Needs the `triton` package (skips without it, as in CI)."""

from __future__ import annotations

import pytest

from tests.test_gemm_epilogues import SCRIPT_HEAD
from tests.test_triton_interpret import WIDENED_BF16_DOT, _interpret

pytest.importorskip("triton")

PROLOGUE_CHECK = r"""
from engine.kernels.torch_ops import TorchOps
from engine.layers.gated_delta import GatedDeltaNet


def same(a, b):
    if isinstance(a, triton_gemm.Partials):
        return isinstance(b, triton_gemm.Partials) and bool(torch.equal(a.sums, b.sums))
    return type(a) is type(b) and bool(torch.equal(a, b))


def err(a, b):
    return ((a.float() - b.float()).abs() / (1 + b.float().abs())).max().item()


for dtype in (torch.bfloat16, torch.float16):
    tag = str(dtype)[6:]
    # the gated norm: heads of 128, z a strided view; K 2048 into 96 columns splits K (8),
    # K 512 into 200 does not; one row's values large (the norm's sum spans many binades)
    for m, heads, n in ((1, 16, 96), (7, 4, 200), (64, 16, 96)):
        core = torch.randn(m, heads, 128).to(dtype)
        core[0] *= 40
        z = torch.randn(m, 3 * heads * 128).to(dtype)[:, heads * 128 : 2 * heads * 128]
        w = 1 + 0.1 * torch.randn(128)
        weight = (torch.randn(n, heads * 128) / 40).to(dtype)
        for partials in (False, True):
            prologue = triton_gemm.GatedNorm(z, w, 1e-6)
            fused = triton_gemm.skinny_linear(core.view(m, -1), weight, partials=partials,
                                              prologue=prologue)
            plain = triton_gemm.skinny_linear(triton_norms.gated_norm(core, z, w, 1e-6), weight,
                                              partials=partials)
            report[f"norm-{tag}-{m}x{heads}x{n}-{partials}"] = {"same": same(fused, plain)}
        normed = triton_norms.gated_norm(core, z, w, 1e-6)
        x, g = core.float(), z.float().view(m, heads, 128)
        want = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w * torch.nn.functional.silu(g))
        report[f"norm-{tag}-{m}x{heads}x{n}-False"]["err"] = err(normed, want.view(m, -1))
    # the sigmoid gate: heads of 256 (a tile is half a head), the gate a view of [query|gate];
    # 128 rows take BLOCK_K 64
    for m in (1, 7, 64, 128):
        out = torch.randn(m, 8 * 256).to(dtype)
        gate = torch.randn(m, 8, 512).to(dtype)[..., 256:]
        weight = (torch.randn(1024, 8 * 256) / 40).to(dtype)
        gated = triton_norms.sigmoid_gate(out, gate)
        for partials in (False, True):
            fused = triton_gemm.skinny_linear(out, weight, partials=partials,
                                              prologue=triton_gemm.SigmoidGate(gate))
            plain = triton_gemm.skinny_linear(gated, weight, partials=partials)
            report[f"gate-{tag}-{m}-{partials}"] = {"same": same(fused, plain)}
        want = out * torch.sigmoid(gate.float()).to(dtype).flatten(1)
        report[f"gate-{tag}-{m}-False"]["err"] = err(gated, want)

# the CUDA ops: which steps read out_proj's input through the gated norm, o_proj's through
# the gate (a launch fewer), and the same bits as the unfused ops either way
calls = {"gated_norm": 0, "sigmoid_gate": 0}
for name in calls:
    def counted(*args, _name=name, _fn=getattr(triton_norms, name)):
        calls[_name] += 1
        return _fn(*args)
    setattr(triton_norms, name, counted)

gdn = GatedDeltaNet(64, 2, 4, 16, 128, 4, 1e-6)
gdn.norm.weight.data.normal_(1, 0.1)
o_proj = torch.nn.Linear(8 * 256, 64, bias=False)
model = torch.nn.ModuleDict({"gdn": gdn, "o_proj": o_proj}).bfloat16()
attention = SimpleNamespace(o_proj=model.o_proj, head_dim=256)
routes, outputs = {}, {}
for name, dense, epilogues, rows in (
    ("fused", "triton", True, 16), ("setting_off", "triton", False, 16),
    ("cublas", "torch", True, 16), ("rows_128", "triton", True, 128),
):
    config = KernelsConfig(dense_kernel=dense, dense_epilogues=epilogues, dense_rows=128)
    ops = CudaOps(model, torch.device("cpu"), 16, config=config)
    torch.manual_seed(1)
    core = torch.randn(rows, 4, 128).bfloat16()
    z = torch.randn(rows, 2 * 4 * 128).bfloat16()[:, 4 * 128:]
    out = torch.randn(rows, 8, 256).bfloat16()
    gate = torch.randn(rows, 8, 512).bfloat16()[..., 256:]
    before = dict(calls)
    results = (ops.gdn_output(model.gdn, core, z), ops.attention_output(attention, out, gate))
    outputs[name] = results
    routes[name] = {key: calls[key] - before[key] for key in calls}
    if name in ("fused", "cublas"):
        reference = (TorchOps().gdn_output(model.gdn, core, z),
                     TorchOps().attention_output(attention, out, gate))
        routes[name]["err"] = max(err(a.sums.sum(0) if isinstance(a, triton_gemm.Partials) else a, b)
                                  for a, b in zip(results, reference))
# as the post-attention norm reads them: partials summed in split order, rounded once
residual, scale = torch.randn(16, 64).bfloat16(), 1 + 0.1 * torch.randn(64)
normed = {key: [triton_norms.rms_norm(o, scale, 1e-6, residual) for o in outputs[key]]
          for key in ("fused", "setting_off")}
routes["kinds"] = [type(o).__name__ for o in outputs["fused"] + outputs["setting_off"]]
routes["same"] = all(same(a[0], b[0]) and same(a[1], b[1])
                     for a, b in zip(normed["fused"], normed["setting_off"]))
report["routes"] = routes

report["errors"] = refused({
    "half_head": lambda: triton_gemm.skinny_linear(
        torch.zeros(4, 512).bfloat16(), torch.zeros(64, 512).bfloat16(),
        prologue=triton_gemm.GatedNorm(torch.zeros(4, 512).bfloat16(), torch.ones(64), 1e-6)),
    "with_silu": lambda: triton_gemm.skinny_linear(
        torch.zeros(4, 512).bfloat16(), torch.zeros(64, 512).bfloat16(), silu_mul=True,
        prologue=triton_gemm.SigmoidGate(torch.zeros(4, 2, 256).bfloat16())),
})
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def report() -> dict:
    return _interpret(WIDENED_BF16_DOT + SCRIPT_HEAD + PROLOGUE_CHECK)


def test_the_gated_norm_prologue_equals_the_norm_kernel_then_the_gemm_bit_for_bit(report):
    """out_proj reading the recurrence's output through the gated norm stores (or, split,
    hands the norm) what the standalone gated norm then the plain GEMM store, at 1, 7 and 64
    rows, split and not, with one row's values 40x the rest; the norm within rounding of
    fp32 torch (the interpreter's bf16 rounding toward zero allows two bf16 ulps)."""
    _bit_for_bit_and_near(report, "norm-", 2 * 3 * 2)


def test_the_sigmoid_gate_prologue_equals_the_gate_kernel_then_the_gemm_bit_for_bit(report):
    """o_proj reading attention's output through the sigmoid gate (heads of 256, the gate a
    strided view of the packed q, tiles of 128 and at 128 rows of 64) stores what the gate
    kernel then the plain GEMM store; the gate kernel within the interpreter's rounding of
    torch's out * sigmoid(gate), which rounds the sigmoid first."""
    _bit_for_bit_and_near(report, "gate-", 2 * 4 * 2)


def _bit_for_bit_and_near(report: dict, prefix: str, count: int) -> None:
    """The `count` results named `prefix...`: each fused equal to unfused, and where the
    standalone kernel was held to torch, within two output ulps (bf16 2^-7, fp16 2^-10)."""
    results = {name: r for name, r in report.items() if name.startswith(prefix)}
    assert len(results) == count
    for name, result in results.items():
        assert result["same"], (name, result)
        if "err" in result:
            ulp = 2**-7 if "bfloat16" in name else 2**-10
            assert result["err"] <= 2 * ulp, (name, result)


def test_cuda_ops_take_the_prologues_only_on_our_gemm_with_the_setting_on(report):
    """gdn_output and attention_output: with dense_epilogues on our GEMM neither standalone
    kernel launches; off, both do (the gate kernel in place of torch's sigmoid and product);
    on cuBLAS both do; at 128 rows (BLOCK_K 64, half a head) the gated norm launches and the
    gate still fuses. Fused and unfused agree bit for bit as the next norm reads them (the
    fused products split, handed on as partials), both within bf16 of the torch ops."""
    routes = report["routes"]
    assert routes["fused"]["gated_norm"] == 0 and routes["fused"]["sigmoid_gate"] == 0
    assert routes["setting_off"] == {"gated_norm": 1, "sigmoid_gate": 1}
    assert routes["cublas"]["gated_norm"] == 1 and routes["cublas"]["sigmoid_gate"] == 1
    assert routes["rows_128"] == {"gated_norm": 1, "sigmoid_gate": 0}
    assert routes["kinds"] == ["Partials", "Partials", "Tensor", "Tensor"]  # K 512, 2048: split
    assert routes["same"]
    assert routes["fused"]["err"] <= 0.05 and routes["cublas"]["err"] <= 0.05


def test_a_prologue_that_cannot_be_computed_is_refused(report):
    errors = report["errors"]
    assert "prologue=GatedNorm" in errors["half_head"]  # a 64-wide head: the tile holds two
    assert "prologue=SigmoidGate" in errors["with_silu"]

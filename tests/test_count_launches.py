"""benchmarks/count_launches.py: one 0.8b decode step's launches through the CUDA ops on a CPU
(Triton's launches recorded, not run): each layer kind's kernels in order, with
`engine.dense_epilogues` on (every fusion: the conv after the in-projection, the gated norm
and the sigmoid gate before the output projections, SiLU-mul, the splits' sums in the norms)
and off, and the decode step's K/V stored in the rotary's launch either way; the rotary's cos
and sin gathered from its table. Needs the
`triton` package (skips without it, as in CI)."""

from __future__ import annotations

import pytest

pytest.importorskip("triton")

from benchmarks.count_launches import count  # noqa: E402

FUSED_GDN = [
    "rms_norm", "skinny_gemm(conv)", "gdn_recurrent", "skinny_gemm(partial=True, prologue=1)",
    "rms_norm", "skinny_gemm(silu_mul=True)", "skinny_gemm(partial=True)",
]  # fmt: skip
FUSED_ATTENTION = [
    "rms_norm", "skinny_gemm", "head_norm_rope(store=True)", "decode", "merge",
    "skinny_gemm(partial=True, prologue=2)", "rms_norm", "skinny_gemm(silu_mul=True)",
    "skinny_gemm(partial=True)",
]  # fmt: skip
# the unfused kernels that take their place (a split GEMM's partials summed by its own launch)
PLAIN_GDN = [
    "rms_norm", "skinny_gemm", "conv_decode", "gdn_recurrent", "gated_norm",
    "skinny_gemm(partial=True)", "split_sum", "rms_norm", "skinny_gemm", "silu_mul",
    "skinny_gemm(partial=True)", "split_sum",
]  # fmt: skip
PLAIN_ATTENTION = [
    "rms_norm", "skinny_gemm", "head_norm_rope(store=True)", "decode", "merge", "sigmoid_gate",
    "skinny_gemm(partial=True)", "split_sum", "rms_norm", "skinny_gemm", "silu_mul",
    "skinny_gemm(partial=True)", "split_sum",
]  # fmt: skip


@pytest.mark.parametrize(
    ("settings", "gdn", "attention"),
    [
        ("", FUSED_GDN, FUSED_ATTENTION),
        ("engine.dense_epilogues=false", PLAIN_GDN, PLAIN_ATTENTION),
    ],
    ids=["epilogues", "plain"],
)
def test_a_08b_decode_steps_layers_launch_these_kernels(settings, gdn, attention):
    result = count("qwen35", "0.8b", rows=64, context=512, settings=settings)
    parts = result["parts"]
    assert parts["layer 0 linear_attention"] == gdn
    assert parts["layer 3 full_attention"] == attention
    # the last layer's down_proj is summed for the head's indexed rows
    assert parts["layer 7 full_attention"][: len(attention)] == attention
    assert parts["layer 7 full_attention"][len(attention) :] in ([], ["split_sum"])
    assert not any(name.startswith("torch") for label, names in parts.items()
                   if label.startswith("layer") for name in names)  # fmt: skip
    # the embedding, then cos and sin gathered from the rotary's table (the engine's on CUDA)
    assert parts["body"] == ["torch embedding", "torch index", "torch index"]
    # the final norm gathers each row's last token in its launch
    assert parts["head"] == ["rms_norm", "skinny_gemm", "argmax_parts", "argmax_pick"]
    # 18 Gated DeltaNet layers, 6 attention layers (the last one as it ran), body and head
    others = len(parts["body"]) + len(parts["head"])
    want = 18 * len(gdn) + 5 * len(attention) + len(parts["layer 7 full_attention"]) + others
    assert result["layers"] == 24 and result["total"] == want

"""The CUDA ops' dense projections (`CudaOps`' base): every product of a step on torch's GEMM
(cuBLAS) or, with `engine.dense_kernel: triton`, ours (triton_gemm.py) for steps of up to
`dense_rows` rows in bf16/fp16; and with `engine.dense_epilogues` what our GEMM fuses in
(triton_gemm_fused.py): the MLP's SiLU-mul, a split's sum handed to the next norm, a decode
step's conv after Gated DeltaNet's in-projection, and before its out-projection the gated norm
(before gated attention's o_proj, the sigmoid gate). Fused or not, the same bits (INVARIANTS
89). The attributes these read are set by CudaOps.__init__: `packed`, `weights`, `head`,
`dense_kernel`, `dense_rows`, `dense_epilogues`.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.kernels import triton_gemm, triton_norms
from engine.layers.attention import GatedAttention
from engine.layers.gated_delta import GatedDeltaNet
from engine.layers.norm import GatedRMSNorm


class DenseOps:
    def _dense(self, x: torch.Tensor, weight: torch.Tensor, head: bool = False) -> torch.Tensor:
        """x [T, K] @ weight[N, K]^T on `dense_kernel`'s GEMM (torch's past our row bound);
        `head`: the product is the LM head's."""
        if self._ours(x, head):
            return triton_gemm.skinny_linear(x, weight)
        return torch.nn.functional.linear(x, weight)

    def _ours(self, x: torch.Tensor, head: bool = False) -> bool:
        """Whether our GEMM computes x's product (`dense_kernel`, `dense_rows`)."""
        return x.shape[0] <= self.dense_rows and triton_gemm.takes(self.dense_kernel, head, x)

    def project(self, x: torch.Tensor, linears) -> list[torch.Tensor]:
        weight, sizes = self.packed[linears]
        return list(self._dense(x, weight).split(sizes, dim=-1))

    def gdn_project(self, layer: GatedDeltaNet, x, conv_state, batch) -> list[torch.Tensor]:
        """The in-projection [mixed, z, b, a]. Where `_conv_fused`, our GEMM's epilogue runs the
        conv: `mixed` comes back convolved and its windows shifted (linear_attention knows)."""
        weight, sizes = self.packed[layer.projections]
        if not self._conv_fused(layer, x, batch):
            return self.project(x, layer.projections)
        conv = triton_gemm.ConvEpilogue(
            layer.conv1d.weight[:, 0, :], conv_state, batch.state_slots, batch.cached,
            layer.conv_dim,
        )  # fmt: skip
        return list(triton_gemm.skinny_linear(x, weight, conv=conv).split(sizes, dim=-1))

    def _conv_fused(self, layer: GatedDeltaNet, x: torch.Tensor, batch) -> bool:
        """Whether a step's conv runs in its in-projection's epilogue (`dense_epilogues`): a
        decode step (one token a row, no token bucket: the piecewise runner's pieces are
        captured on another step) whose product is ours and has no K split. The in-projection
        and linear_attention ask it of the same layer, rows and step, and agree."""
        weight, _ = self.packed[layer.projections]
        return (
            self.dense_epilogues and batch.is_decode and batch.token_bucket is None
            and batch.gdn_tables is None and x.shape[0] == batch.num_rows and self._ours(x)
            and triton_gemm.fuses_conv(x.shape[0], *weight.shape)
        )  # fmt: skip

    def linear(self, layer: nn.Module, x: torch.Tensor, to_norm: bool = False):
        """x @ layer.weight^T. `to_norm`: the product's only reader is the next `norm`, so with
        `dense_epilogues` a split product of our GEMM comes back unsummed
        (triton_gemm.Partials) and that norm sums it."""
        head = layer is self.head
        if to_norm and self.dense_epilogues and self._ours(x, head):
            return triton_gemm.skinny_linear(x, layer.weight, partials=True)
        return self._dense(x, layer.weight, head=head)

    def swiglu(self, x, gate: nn.Linear, up: nn.Linear) -> torch.Tensor:
        weight, _ = self.packed[(gate, up)]
        if self.dense_epilogues and self._ours(x):
            return triton_gemm.skinny_linear(x, weight, silu_mul=True)
        return triton_norms.silu_mul(self._dense(x, weight))

    def gated_norm(self, core, z, norm: GatedRMSNorm) -> torch.Tensor:
        return triton_norms.gated_norm(core, z, self.weights[norm], norm.eps)

    def gdn_output(self, layer: GatedDeltaNet, core, z):
        """out_proj(gated_norm(core, z)) for the post-attention norm (`linear`'s `to_norm`).
        With `dense_epilogues` on our GEMM, the gated norm is its prologue: one launch."""
        tokens = core.shape[0]
        weight, flat = layer.out_proj.weight, core.view(tokens, -1)
        if self._prologue(flat, weight, layer.v_dim, whole_head=True):
            fused = triton_gemm.GatedNorm(z, self.weights[layer.norm], layer.norm.eps)
            return triton_gemm.skinny_linear(flat, weight, partials=True, prologue=fused)
        return self.linear(layer.out_proj, self.gated_norm(core, z, layer.norm), to_norm=True)

    def attention_output(self, layer: GatedAttention, out, gate):
        """o_proj(out * sigmoid(gate)) for the post-attention norm: out [T, heads, dim], gate
        [T, heads, dim] (a view of the packed q projection). With `dense_epilogues` on our
        GEMM, the gate is its prologue: one launch; else our gate kernel, then o_proj."""
        tokens = out.shape[0]
        weight, flat = layer.o_proj.weight, out.reshape(tokens, -1)
        if self._prologue(flat, weight, layer.head_dim, whole_head=False):
            fused = triton_gemm.SigmoidGate(gate)
            return triton_gemm.skinny_linear(flat, weight, partials=True, prologue=fused)
        return self.linear(layer.o_proj, triton_norms.sigmoid_gate(flat, gate), to_norm=True)

    def _prologue(self, x, weight, head: int, whole_head: bool) -> bool:
        """Whether our GEMM reads x through a prologue (`dense_epilogues`, its K tiles fit the
        heads: gemm_config.fuses_prologue)."""
        return (
            self.dense_epilogues and self._ours(x)
            and triton_gemm.fuses_prologue(x.shape[0], *weight.shape, head, whole_head)
        )  # fmt: skip

"""The reference backend: every op of a step in plain torch (engine/layers), on any device.

A model's cached forward calls its ops through `batch.ops`; this class is what CPUs run and
what every CUDA kernel is held to. Stateless: one instance serves every step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.attention import torch_paged_attention
from engine.layers.gated_delta import GatedDeltaNet, torch_linear_attention
from engine.layers.norm import GatedRMSNorm, RMSNorm
from engine.layers.rotary import apply_rotary
from engine.layers.sampler import sample


class TorchOps:
    name = "torch"

    reads_page_table = True
    attention_backend = None  # no planned attention: nothing to capture in a graph

    def begin_step(self, batch, bucket: int | None = None) -> int:
        """Nothing to plan: the reference ops read the batch's fields directly."""
        return 0

    def project(self, x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> list[torch.Tensor]:
        return [F.linear(x, linear.weight) for linear in linears]

    def gdn_project(self, layer: GatedDeltaNet, x, conv_state, batch) -> list[torch.Tensor]:
        """Gated DeltaNet's in-projection [mixed, z, b, a]; the conv is `linear_attention`'s."""
        return self.project(x, layer.projections)

    def linear(self, layer: nn.Module, x: torch.Tensor, to_norm: bool = False) -> torch.Tensor:
        """x @ layer.weight^T: a bias-free Linear, or a tied LM head's embedding. `to_norm`
        (the product's only reader is the next `norm`) changes nothing here."""
        return F.linear(x, layer.weight)

    def norm(
        self, x: torch.Tensor, norm: RMSNorm, residual: torch.Tensor | None = None,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        """(norm(x + residual), x + residual); without a residual, (norm(x), x). `rows`: of
        x[rows] and residual[rows] (the head's last tokens; the CUDA ops' in one launch)."""
        if rows is not None:
            x, residual = x[rows], residual[rows]
        if residual is not None:
            x = x + residual
        return norm(x), x

    def qk_rope(self, q, k, cos, sin, norms: tuple[RMSNorm, RMSNorm] | None = None, kv=None):
        """An attention layer's q and k [T, heads, D]: each head normed (`norms`: (q_norm,
        k_norm), Qwen3.5's) then rotated; without norms, rotated alone (Llama's). `kv` (v and
        the caches) changes nothing here: `attention` stores K and V."""
        if norms is not None:
            q, k = norms[0](q), norms[1](k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def attention(self, q, k, v, k_cache, v_cache, batch, scale: float) -> torch.Tensor:
        return torch_paged_attention(q, k, v, k_cache, v_cache, batch, scale)

    def linear_attention(self, layer: GatedDeltaNet, mixed, a, b, conv_state, ssm_state, batch):
        return torch_linear_attention(layer, mixed, a, b, conv_state, ssm_state, batch)

    def gated_norm(self, core: torch.Tensor, z: torch.Tensor, norm: GatedRMSNorm) -> torch.Tensor:
        return norm(core, z.reshape(core.shape)).reshape(core.shape[0], -1)

    def gdn_output(self, layer: GatedDeltaNet, core: torch.Tensor, z: torch.Tensor):
        """Gated DeltaNet's output: out_proj(gated_norm(core, z)), for the next norm."""
        return self.linear(layer.out_proj, self.gated_norm(core, z, layer.norm), to_norm=True)

    def attention_output(self, layer: nn.Module, out: torch.Tensor, gate: torch.Tensor):
        """Gated attention's output: o_proj(out * sigmoid(gate)), out and gate [T, heads, dim]
        (gate a view of the packed q projection), for the next norm."""
        gated = out.reshape(out.shape[0], -1) * torch.sigmoid(gate).flatten(1)
        return self.linear(layer.o_proj, gated, to_norm=True)

    def swiglu(self, x: torch.Tensor, gate: nn.Linear, up: nn.Linear) -> torch.Tensor:
        return F.silu(gate(x)) * up(x)

    sample = staticmethod(sample)

    @staticmethod
    def argmax(logits: torch.Tensor) -> torch.Tensor:
        """Each row's greedy choice (the first maximum), [R] int64."""
        return logits.argmax(-1)


TORCH_OPS = TorchOps()

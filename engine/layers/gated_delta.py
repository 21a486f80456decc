"""Gated DeltaNet: the linear-attention layer of Qwen3.5, and its CPU reference ops.

Per value head the layer keeps a matrix state S [k_dim, v_dim] and, per token,
    S = S * exp(g);  S += k (beta * (v - S^T k))^T;  o = S^T q
with q, k l2-normalised and q scaled by 1/sqrt(k_dim), g = -exp(A_log) * softplus(a + dt_bias)
and beta = sigmoid(b). q, k and v first pass a causal depthwise conv (kernel 4) + SiLU whose
last kernel-1 inputs are the layer's conv state.

The ops are plain functions with flash-linear-attention's layouts (q/k [B, T, Hk, K],
v [B, T, Hv, V], g/beta [B, T, Hv], state [B, Hv, K, V] fp32) so a registry can swap in
`chunk_gated_delta_rule` / `fused_recurrent_gated_delta_rule`. They return a new state and
never modify the one passed in.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.layers.norm import GatedRMSNorm


def torch_causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor):
    """One row's new tokens x [T, C], kernel [C, K], state [C, K-1] (the previous K-1 inputs).
    Returns (silu(conv) [T, C], new state [C, K-1])."""
    padded = torch.cat((state.to(x.dtype), x.t()), dim=1)  # [C, K-1+T]
    out = F.conv1d(padded[None], weight[:, None, :].to(x.dtype), groups=x.shape[1])[0]
    return F.silu(out).t(), padded[:, padded.shape[1] - state.shape[1] :]


def torch_causal_conv1d_update(
    x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor, slots: torch.Tensor
) -> torch.Tensor:
    """One token per row, all rows at once: x [R, C]; conv_state [slots, C, K-1] updated in place."""
    window = torch.cat((conv_state[slots], x[:, :, None].to(conv_state.dtype)), dim=-1)
    conv_state.index_copy_(0, slots, window[:, :, 1:])
    return F.silu((window * weight.to(window.dtype)).sum(-1)).to(x.dtype)


def gdn_gates(a, b, A_log, dt_bias) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) in fp32 from the a/b projections [T, Hv]; g <= 0 is the log decay per token."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.float().sigmoid()


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _heads_first(q, k, v, g, beta):
    """fp32, q/k normalised (q scaled), q/k heads repeated up to the value heads, [B, H, T, ...]."""
    value_heads = v.shape[2]
    if q.shape[2] != value_heads:  # each q/k head serves consecutive value heads
        q, k = (t.repeat_interleave(value_heads // t.shape[2], dim=2) for t in (q, k))
    q = _l2norm(q.float()) * q.shape[-1] ** -0.5
    k = _l2norm(k.float())
    return [t.float().transpose(1, 2) for t in (q, k, v, g, beta)]


def torch_gated_delta_rule_recurrent(q, k, v, g, beta, initial_state: torch.Tensor):
    """Token by token. Returns (o [B, T, Hv, V] in v's dtype, final state fp32)."""
    out_dtype = v.dtype
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    state = initial_state.float()
    out = torch.empty_like(v)
    for t in range(v.shape[2]):
        state = state * g[:, :, t, None, None].exp()
        predicted = torch.einsum("bhkv,bhk->bhv", state, k[:, :, t])
        delta = beta[:, :, t, None] * (v[:, :, t] - predicted)
        state = state + k[:, :, t, :, None] * delta[:, :, None, :]
        out[:, :, t] = torch.einsum("bhkv,bhk->bhv", state, q[:, :, t])
    return out.transpose(1, 2).to(out_dtype), state


def torch_gated_delta_rule_chunked(q, k, v, g, beta, initial_state: torch.Tensor, chunk: int = 64):
    """Same result as the recurrent form, a chunk of tokens at a time (WY form).

    Within a chunk with cumulative log decay G_t, the delta-rule corrections u solve the unit
    lower-triangular system (I + A) u = beta*v - (beta*k*exp(G)) S0, with
    A[t, s] = beta_t (k_t . k_s) exp(G_t - G_s) for s < t; then
    o_t = exp(G_t) S0^T q_t + sum_{s<=t} exp(G_t - G_s) (q_t . k_s) u_s.
    """
    out_dtype = v.dtype
    q, k, v, g, beta = _heads_first(q, k, v, g, beta)
    batch, heads, length, _ = k.shape
    pad = (-length) % chunk  # padded tokens: g = 0 keeps the state, beta = 0 writes nothing
    q, k, v = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, v))
    g, beta = (F.pad(t, (0, pad)) for t in (g, beta))
    q, k, v = (t.reshape(batch, heads, -1, chunk, t.shape[-1]) for t in (q, k, v))
    g, beta = (t.reshape(batch, heads, -1, chunk) for t in (g, beta))

    cum = g.cumsum(-1)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    k_beta = k * beta[..., None]
    unit = (k_beta @ k.transpose(-1, -2) * decay).tril(-1) + torch.eye(chunk, device=q.device)
    u_values = torch.linalg.solve_triangular(unit, v * beta[..., None], upper=False)
    u_state = torch.linalg.solve_triangular(unit, k_beta * cum.exp()[..., None], upper=False)
    intra = q @ k.transpose(-1, -2) * decay
    q_decayed = q * cum.exp()[..., None]
    k_to_end = k * (cum[..., -1:] - cum).exp()[..., None]

    state = initial_state.float()
    out = torch.empty_like(v)
    for i in range(v.shape[2]):
        u = u_values[:, :, i] - u_state[:, :, i] @ state
        out[:, :, i] = q_decayed[:, :, i] @ state + intra[:, :, i] @ u
        state = state * cum[:, :, i, -1, None, None].exp() + k_to_end[:, :, i].transpose(-1, -2) @ u
    out = out.reshape(batch, heads, -1, v.shape[-1])[:, :, :length]
    return out.transpose(1, 2).to(out_dtype), state


class GatedDeltaNet(nn.Module):
    """The linear-attention mixer. Parameter names follow Hugging Face's Qwen3.5 (in_proj_qkv
    feeds the conv with [q | k | v] channels; conv_dim = 2 * k_heads * k_dim + v_heads * v_dim)."""

    def __init__(
        self,
        hidden: int,
        k_heads: int,
        v_heads: int,
        k_dim: int,
        v_dim: int,
        kernel: int,
        eps: float,
    ):
        super().__init__()
        if v_heads % k_heads:
            raise ValueError(f"value heads ({v_heads}) must be a multiple of key heads ({k_heads})")
        self.k_heads, self.v_heads, self.k_dim, self.v_dim = k_heads, v_heads, k_dim, v_dim
        self.conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
        self.in_proj_qkv = nn.Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, v_heads * v_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, v_heads, bias=False)
        self.conv1d = nn.Conv1d(
            self.conv_dim, self.conv_dim, kernel, groups=self.conv_dim, bias=False
        )
        self.A_log = nn.Parameter(torch.zeros(v_heads))
        self.dt_bias = nn.Parameter(torch.ones(v_heads))
        self.norm = GatedRMSNorm(v_dim, eps)
        self.out_proj = nn.Linear(v_heads * v_dim, hidden, bias=False)
        # the Linears of the layer's input, in the order `gdn_project` returns their products
        self.projections = (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)

    def _split(self, mixed: torch.Tensor):
        tokens, key_dim = mixed.shape[0], self.k_heads * self.k_dim
        parts = mixed.split((key_dim, key_dim, self.v_heads * self.v_dim), dim=-1)
        shapes = (
            (self.k_heads, self.k_dim),
            (self.k_heads, self.k_dim),
            (self.v_heads, self.v_dim),
        )
        return [part.reshape(tokens, *shape) for part, shape in zip(parts, shapes, strict=True)]

    def _output(self, core: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        z = self.in_proj_z(x).view(x.shape[0], self.v_heads, self.v_dim)
        return self.out_proj(self.norm(core, z).reshape(x.shape[0], -1))

    def forward(self, x, batch: ForwardBatch, conv_state, ssm_state) -> torch.Tensor:
        """x [T, hidden] of the step's rows; reads and updates each row's state slot through
        the step's ops (the torch reference or the CUDA kernels)."""
        ops = batch.ops
        mixed, z, b, a = ops.gdn_project(self, x, conv_state, batch)
        core = ops.linear_attention(self, mixed, a, b, conv_state, ssm_state, batch)
        return ops.gdn_output(self, core, z)  # out_proj(gated_norm(core, z))

    def _prefill(self, mixed, g, beta, weight, batch: ForwardBatch, conv_state, ssm_state):
        """Row by row; a row with nothing cached starts from zeros whatever its slot holds,
        a chunked-prefill row (num_cached > 0) continues from its slot."""
        core = mixed.new_empty(mixed.shape[0], self.v_heads, self.v_dim)
        start, state_slots = 0, batch.state_slots.long()
        for row, (cached, new) in enumerate(zip(batch.num_cached, batch.num_new, strict=True)):
            tokens, slot = slice(start, start + new), state_slots[row : row + 1]
            conv0, state0 = conv_state[slot], ssm_state[slot]
            if cached == 0:
                conv0, state0 = torch.zeros_like(conv0), torch.zeros_like(state0)
            conv_out, conv1 = torch_causal_conv1d(mixed[tokens], weight, conv0[0])
            conv_state.index_copy_(0, slot, conv1[None].to(conv_state.dtype))
            q, k, v = self._split(conv_out)
            out, state1 = torch_gated_delta_rule_chunked(
                q[None], k[None], v[None], g[None, tokens], beta[None, tokens], state0
            )
            ssm_state.index_copy_(0, slot, state1.to(ssm_state.dtype))
            core[tokens] = out[0]
            start += new
        return core

    def forward_full(self, x: torch.Tensor) -> torch.Tensor:
        """One whole sequence from a zero state, no cache: the reference the cached path must equal."""
        kernel = self.conv1d.weight.shape[-1]
        mixed = self.in_proj_qkv(x).t()[None]  # [1, C, T]
        conv = F.silu(
            F.conv1d(F.pad(mixed, (kernel - 1, 0)), self.conv1d.weight, groups=self.conv_dim)
        )
        q, k, v = self._split(conv[0].t())
        g, beta = gdn_gates(self.in_proj_a(x), self.in_proj_b(x), self.A_log, self.dt_bias)
        state = x.new_zeros(1, self.v_heads, self.k_dim, self.v_dim, dtype=torch.float32)
        core, _ = torch_gated_delta_rule_recurrent(
            q[None], k[None], v[None], g[None], beta[None], state
        )
        return self._output(core[0], x)


def torch_linear_attention(
    layer: GatedDeltaNet, mixed, a, b, conv_state, ssm_state, batch: ForwardBatch
) -> torch.Tensor:
    """The reference of a step's Gated DeltaNet core: conv, gates and delta rule over the
    projections mixed [T, conv_dim], a and b [T, Hv]; returns [T, Hv, V] and updates the slots.
    Decode rows are one vectorised recurrence; prefill rows run one at a time."""
    g, beta = gdn_gates(a, b, layer.A_log, layer.dt_bias)
    weight = layer.conv1d.weight[:, 0, :]
    if not batch.is_decode:
        return layer._prefill(mixed, g, beta, weight, batch, conv_state, ssm_state)
    slots = batch.state_slots.long()
    q, k, v = layer._split(torch_causal_conv1d_update(mixed, weight, conv_state, slots))
    # Rows become the batch axis of a one-token recurrence.
    core, state = torch_gated_delta_rule_recurrent(
        q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], ssm_state[slots]
    )
    ssm_state.index_copy_(0, slots, state.to(ssm_state.dtype))
    return core[:, 0]

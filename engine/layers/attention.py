"""Full attention over the paged KV cache (CPU reference ops) and Qwen3.5's gated attention layer.

`torch_paged_attention` and `torch_causal_attention` are plain functions with the tensor
layouts of the FlashInfer wrappers, so a backend registry can swap them per device.
Layouts: q [T, q_heads, head_dim], k/v [T, kv_heads, head_dim] (T = the step's flat tokens),
cache [num_pages, page_size, kv_heads, head_dim].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.batch import ForwardBatch
from engine.layers.norm import RMSNorm
from engine.layers.rotary import apply_rotary


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store each new token's K/V at its slot (page * page_size + offset); a negative slot
    (a padding row's token) stores nothing. Slots past k's tokens (a step padded to a token
    bucket) are the padding's: ignored."""
    slot_mapping = slot_mapping[: k.shape[0]]
    keep = slot_mapping >= 0
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping[keep], k[keep])
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping[keep], v[keep])


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float):
    """q [B, Hq, Lq, D], k/v [B, Hkv, Lk, D], boolean mask (True = attend); GQA by head groups."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def torch_paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    batch: ForwardBatch,
    scale: float,
) -> torch.Tensor:
    """Write the step's K/V into the cache, then attend each row's queries causally over its
    cached and new keys. Returns [T, q_heads, head_dim]."""
    write_kv(k_cache, v_cache, k, v, batch.slot_mapping.long())
    if batch.is_decode:
        return _paged_decode(q, k_cache, v_cache, batch, scale)
    return _paged_prefill(q, k_cache, v_cache, batch, scale)


def _paged_decode(q, k_cache, v_cache, batch: ForwardBatch, scale: float) -> torch.Tensor:
    """One query per row, all rows at once: gather pages padded to the longest row, mask."""
    page_size = k_cache.shape[1]
    seq_lens = batch.seq_lens
    num_pages = -(-max(seq_lens) // page_size)
    # -1 pads become page 0; the length mask hides whatever that page holds.
    pages = batch.page_table[:, :num_pages].long().clamp_min(0)
    keys = k_cache[pages].flatten(1, 2).transpose(1, 2)  # [R, kv_heads, L, D]
    values = v_cache[pages].flatten(1, 2).transpose(1, 2)
    lens = torch.tensor(seq_lens, device=q.device)
    mask = torch.arange(keys.shape[2], device=q.device)[None, :] < lens[:, None]
    out = _sdpa(q[:, :, None, :], keys, values, mask[:, None, None, :], scale)
    return out[:, :, 0, :]


def _paged_prefill(q, k_cache, v_cache, batch: ForwardBatch, scale: float) -> torch.Tensor:
    """Rows of any length, one at a time: query i of a row sits at position num_cached + i."""
    page_size = k_cache.shape[1]
    out = torch.empty_like(q)
    start = 0
    for row, (cached, new) in enumerate(zip(batch.num_cached, batch.num_new, strict=True)):
        total = cached + new
        pages = batch.page_table[row, : -(-total // page_size)].long()
        keys = k_cache[pages].flatten(0, 1)[:total].transpose(0, 1)[None]
        values = v_cache[pages].flatten(0, 1)[:total].transpose(0, 1)[None]
        query_pos = cached + torch.arange(new, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= query_pos[:, None]
        rows_q = q[start : start + new].transpose(0, 1)[None]
        out[start : start + new] = _sdpa(rows_q, keys, values, mask, scale)[0].transpose(0, 1)
        start += new
    return out


def torch_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Plain causal attention of one sequence, no cache: the reference the paged path must equal."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        is_causal=True,
        scale=scale,
        enable_gqa=True,
    )
    return out.transpose(0, 1)


class GatedAttention(nn.Module):
    """GQA with per-head q/k RMSNorm, partial rotary, and a sigmoid output gate from q_proj.

    q_proj emits, per head, [query | gate] (2 * head_dim): the published checkpoints' layout.
    Parameter names follow Hugging Face's Qwen3.5 so checkpoints load without renaming.
    """

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, eps: float):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.q_proj = nn.Linear(hidden, heads * head_dim * 2, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def _project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        tokens = x.shape[0]
        query, gate = self.q_proj(x).view(tokens, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = apply_rotary(self.q_norm(query), cos, sin)
        k = self.k_norm(self.k_proj(x).view(tokens, self.kv_heads, self.head_dim))
        v = self.v_proj(x).view(tokens, self.kv_heads, self.head_dim)
        return q, apply_rotary(k, cos, sin), v, gate.reshape(tokens, -1)

    def _output(self, out: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return self.o_proj(out.reshape(out.shape[0], -1) * torch.sigmoid(gate))

    def forward(self, x, cos, sin, batch: ForwardBatch, k_cache, v_cache) -> torch.Tensor:
        """The cached path, through the step's ops (the torch reference or the CUDA kernels)."""
        ops, tokens, dim = batch.ops, x.shape[0], self.head_dim
        packed, k, v = ops.project(x, (self.q_proj, self.k_proj, self.v_proj))
        query_gate = packed.view(tokens, self.heads, 2 * dim)
        v = v.view(tokens, self.kv_heads, dim)
        q, k = ops.qk_rope(query_gate[..., :dim], k.view(tokens, self.kv_heads, dim), cos, sin,
                           (self.q_norm, self.k_norm), kv=(v, k_cache, v_cache, batch))  # fmt: skip
        out = ops.attention(q, k, v, k_cache, v_cache, batch, self.scale)
        return ops.attention_output(self, out, query_gate[..., dim:])  # o_proj(out * sigmoid)

    def forward_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        q, k, v, gate = self._project(x, cos, sin)
        return self._output(torch_causal_attention(q, k, v, self.scale), gate)


class Attention(nn.Module):
    """Plain GQA with rotary positions (Llama): no q/k norm, no output gate. Parameter names
    follow Hugging Face's Llama."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.scale = head_dim**-0.5
        self.q_proj = nn.Linear(hidden, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, batch: ForwardBatch, k_cache, v_cache) -> torch.Tensor:
        """The cached path, through the step's ops."""
        ops, tokens, dim = batch.ops, x.shape[0], self.head_dim
        q, k, v = ops.project(x, (self.q_proj, self.k_proj, self.v_proj))
        v = v.view(tokens, self.kv_heads, dim)
        q, k = ops.qk_rope(q.view(tokens, self.heads, dim), k.view(tokens, self.kv_heads, dim),
                           cos, sin, kv=(v, k_cache, v_cache, batch))  # fmt: skip
        out = ops.attention(q, k, v, k_cache, v_cache, batch, self.scale)
        return ops.linear(self.o_proj, out.reshape(tokens, -1), to_norm=True)

    def forward_full(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        tokens, dim = x.shape[0], self.head_dim
        q = apply_rotary(self.q_proj(x).view(tokens, self.heads, dim), cos, sin)
        k = apply_rotary(self.k_proj(x).view(tokens, self.kv_heads, dim), cos, sin)
        v = self.v_proj(x).view(tokens, self.kv_heads, dim)
        return self.o_proj(torch_causal_attention(q, k, v, self.scale).reshape(tokens, -1))

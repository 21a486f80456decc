"""The CPU reference ops of engine/layers agree with their plain, uncached definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.batch import ForwardBatch
from engine.kernels.torch_ops import TORCH_OPS
from engine.layers.attention import torch_causal_attention, torch_paged_attention
from engine.layers.gated_delta import (
    gdn_gates,
    torch_causal_conv1d,
    torch_causal_conv1d_update,
    torch_gated_delta_rule_chunked,
    torch_gated_delta_rule_recurrent,
)
from engine.layers.norm import GatedRMSNorm, RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_rotary


def _delta_inputs(batch=2, length=37, k_heads=2, v_heads=4, k_dim=16, v_dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, length, k_heads, k_dim, generator=gen)
    k = torch.randn(batch, length, k_heads, k_dim, generator=gen)
    v = torch.randn(batch, length, v_heads, v_dim, generator=gen)
    a, b = torch.randn(2, batch, length, v_heads, generator=gen)
    a_log = torch.empty(v_heads).uniform_(0, 2.5, generator=gen)
    g, beta = gdn_gates(a, b, a_log, torch.randn(v_heads, generator=gen))
    state = torch.randn(batch, v_heads, k_dim, v_dim, generator=gen)
    return q, k, v, g, beta, state


def test_chunked_delta_rule_equals_recurrent():
    q, k, v, g, beta, state = _delta_inputs()
    ref_out, ref_state = torch_gated_delta_rule_recurrent(q, k, v, g, beta, state)
    for chunk in (8, 64):  # several chunks with a padded tail; one padded chunk
        out, final = torch_gated_delta_rule_chunked(q, k, v, g, beta, state, chunk=chunk)
        torch.testing.assert_close(out, ref_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(final, ref_state, atol=1e-4, rtol=1e-4)


def test_delta_rule_continues_from_state_across_pieces():
    q, k, v, g, beta, state = _delta_inputs(length=20)
    whole, whole_state = torch_gated_delta_rule_recurrent(q, k, v, g, beta, state)
    first, mid = torch_gated_delta_rule_chunked(*(t[:, :13] for t in (q, k, v, g, beta)), state)
    second, end = torch_gated_delta_rule_chunked(*(t[:, 13:] for t in (q, k, v, g, beta)), mid)
    torch.testing.assert_close(torch.cat((first, second), dim=1), whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(end, whole_state, atol=1e-4, rtol=1e-4)


def test_conv1d_with_state_equals_full_conv():
    gen = torch.Generator().manual_seed(1)
    channels, kernel, length = 6, 4, 12
    x = torch.randn(length, channels, generator=gen)
    weight = torch.randn(channels, kernel, generator=gen)
    padded = F.pad(x.t()[None], (kernel - 1, 0))
    expected = F.silu(F.conv1d(padded, weight[:, None, :], groups=channels))[0].t()

    state, outs = torch.zeros(channels, kernel - 1), []
    for piece in (x[:2], x[2:3], x[3:8]):  # a piece shorter than the window, one token, more
        out, state = torch_causal_conv1d(piece, weight, state)
        outs.append(out)
    # The rest one token at a time through the vectorised decode update, from slot 1.
    conv_state = torch.zeros(3, channels, kernel - 1)
    conv_state[1] = state
    for t in range(8, length):
        outs.append(torch_causal_conv1d_update(x[t : t + 1], weight, conv_state, torch.tensor([1])))
    torch.testing.assert_close(torch.cat(outs), expected, atol=1e-5, rtol=1e-5)
    assert conv_state[0].abs().sum() == 0 and conv_state[2].abs().sum() == 0


def _paged_batch(rows: list[tuple[int, int]], pages: list[list[int]], page_size: int, decode: bool):
    """A step of rows (num_cached, num_new) whose sequences live on the given pages."""
    slots, positions = [], []
    for (cached, new), row_pages in zip(rows, pages, strict=True):
        for pos in range(cached, cached + new):
            slots.append(row_pages[pos // page_size] * page_size + pos % page_size)
            positions.append(pos)
    width = max(len(p) for p in pages)
    table = torch.tensor([p + [-1] * (width - len(p)) for p in pages], dtype=torch.int32)
    new = [n for _, n in rows]
    return ForwardBatch(
        input_ids=torch.zeros(len(slots), dtype=torch.int64),
        positions=torch.tensor(positions),
        cu_seqlens=torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()]),
        num_cached=[c for c, _ in rows],
        num_new=new,
        page_table=table,
        slot_mapping=torch.tensor(slots),
        state_slots=torch.arange(len(rows)),
        is_decode=decode,
        ops=TORCH_OPS,
    )


def test_paged_attention_equals_causal_sdpa():
    gen = torch.Generator().manual_seed(2)
    page_size, kv_heads, q_heads, dim = 4, 2, 6, 8
    lengths = [5, 14, 9]
    q = [torch.randn(n, q_heads, dim, generator=gen) for n in lengths]
    k = [torch.randn(n, kv_heads, dim, generator=gen) for n in lengths]
    v = [torch.randn(n, kv_heads, dim, generator=gen) for n in lengths]
    scale = dim**-0.5
    expected = [torch_causal_attention(*qkv, scale) for qkv in zip(q, k, v, strict=True)]
    # Non-contiguous pages, interleaved between the sequences.
    free = torch.randperm(16, generator=gen).tolist()
    pages = [[free.pop() for _ in range(-(-n // page_size))] for n in lengths]
    k_cache = torch.zeros(16, page_size, kv_heads, dim)
    v_cache = torch.zeros_like(k_cache)

    # Prefill in chunks (the second step continues cached rows), then two vectorised decodes.
    steps = [[(0, 3), (0, 6), (0, 8)], [(3, 1), (6, 7), (8, 0)], [(4, 1), (13, 1), (8, 1)]]
    for step in steps:
        rows = [(i, c, n) for i, (c, n) in enumerate(step) if n]
        decode = all(n == 1 and c > 0 for _, c, n in rows)
        batch = _paged_batch(
            [(c, n) for _, c, n in rows], [pages[i] for i, _, _ in rows], page_size, decode
        )
        pick = [(i, slice(c, c + n)) for i, c, n in rows]
        out = torch_paged_attention(
            torch.cat([q[i][s] for i, s in pick]), torch.cat([k[i][s] for i, s in pick]),
            torch.cat([v[i][s] for i, s in pick]), k_cache, v_cache, batch, scale,
        )  # fmt: skip
        torch.testing.assert_close(
            out, torch.cat([expected[i][s] for i, s in pick]), atol=1e-5, rtol=1e-5
        )


def test_rms_norms():
    x, z = torch.randn(2, 5, 16).unbind(0)
    norm, gated = RMSNorm(16), GatedRMSNorm(16)
    with torch.no_grad():
        norm.weight.normal_()
        gated.weight.normal_()
    unit = x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    torch.testing.assert_close(norm(x), unit * (1 + norm.weight))
    torch.testing.assert_close(gated(x, z), unit * gated.weight * F.silu(z))
    torch.testing.assert_close(RMSNorm(16)(x), unit)  # zero-initialised weight is the identity


@pytest.mark.parametrize(("rotary_dim", "theta"), [(64, 1e7), (128, 5e5), (8, 1e7), (6, 1e4)])
def test_a_tabulated_rotary_gathers_the_values_it_computes(rotary_dim, theta):
    """`tabulate` (the engine's, on CUDA): a step's cos and sin gathered from the table equal
    those computed for its positions, bit for bit (0.8b's and Orpheus 3b's widths, a tiny
    one); the table answers its own device alone, and the no-cache reference computes."""
    rotary = RotaryEmbedding(rotary_dim, theta)
    positions = torch.randint(0, 4096, (333,), generator=torch.Generator().manual_seed(0))
    computed = rotary(positions)
    rotary.tabulate(4096, torch.device("cpu"))
    assert rotary.table[0].shape == (4096, rotary_dim // 2)
    gathered = rotary(positions)
    assert all(torch.equal(a, b) for a, b in zip(gathered, computed, strict=True))
    rotary.tabulate(100, torch.device("cpu"))  # a second engine's shorter bound: kept whole
    assert rotary.table[0].shape[0] == 4096
    rotary.table = tuple(t.to("meta") for t in rotary.table)  # on another device: not used
    assert all(torch.equal(a, b) for a, b in zip(rotary(positions), computed, strict=True))


def test_partial_rotary_rotates_the_first_dims_by_relative_position():
    rotary = RotaryEmbedding(rotary_dim=8, theta=10_000_000.0)
    q, k = torch.randn(2, 1, 1, 32).unbind(0)
    positions = torch.tensor([3, 10, 103, 110])
    cos, sin = rotary(positions)
    q_rot = apply_rotary(q.expand(4, 1, 32), cos, sin)
    k_rot = apply_rotary(k.expand(4, 1, 32), cos, sin)
    torch.testing.assert_close(q_rot[..., 8:], q.expand(4, 1, 32)[..., 8:])  # pass-through dims
    torch.testing.assert_close(q_rot.norm(dim=-1), q.expand(4, 1, 32).norm(dim=-1))
    # Scores depend on the distance only: (10 - 3) == (110 - 103).
    torch.testing.assert_close(
        (q_rot[1] * k_rot[0]).sum(), (q_rot[3] * k_rot[2]).sum(), atol=1e-5, rtol=1e-5
    )

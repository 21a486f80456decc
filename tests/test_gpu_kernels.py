"""Each CUDA kernel path against the torch reference on the same inputs (pytest -m gpu).

Tolerances: fp32 kernels agree with the reference to float rounding (1e-5); bf16 kernels to
a few bf16 ulps of O(1) values (2e-2 absolute), the precision of the stored activations.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.batch import ForwardBatch, HostLayout
from engine.config import KernelsConfig
from engine.layers.attention import GatedAttention, torch_paged_attention
from engine.layers.gated_delta import GatedDeltaNet, torch_linear_attention
from engine.layers.norm import GatedRMSNorm, RMSNorm
from engine.layers.rotary import RotaryEmbedding
from engine.layers.sampler import SamplingParams, window_logits

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_quick]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from engine.kernels import triton_norms, triton_rope  # noqa: E402  (imports triton: CUDA only)
from engine.kernels.cuda_ops import CudaOps  # noqa: E402
from engine.kernels.gpu_sampler import sample_on_gpu  # noqa: E402
from engine.kernels.torch_ops import TORCH_OPS  # noqa: E402

CUDA = torch.device("cuda")
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _batch(cached: list[int], new: list[int], slots: list[int], pages: list[list[int]], ps: int):
    """A step's ForwardBatch with both the reference fields and the kernels' fields."""
    token_row, positions, slot_map = [], [], []
    for row, (c, n) in enumerate(zip(cached, new, strict=True)):
        token_row += [row] * n
        positions += range(c, c + n)
        slot_map += [pages[row][p // ps] * ps + p % ps for p in range(c, c + n)]
    cu = [0]
    for n in new:
        cu.append(cu[-1] + n)
    width = max(map(len, pages))
    indptr = [0]
    for p in pages:
        indptr.append(indptr[-1] + len(p))
    seq = [c + n for c, n in zip(cached, new, strict=True)]
    i32 = {"dtype": torch.int32}
    host = HostLayout(
        torch.tensor(indptr, **i32),
        torch.tensor([s - (len(p) - 1) * ps for s, p in zip(seq, pages, strict=True)], **i32),
        torch.tensor(cu, **i32),
        torch.tensor(cu).numpy(),
        max(new),
    )
    return ForwardBatch(
        input_ids=torch.zeros(len(slot_map), device=CUDA, **i32),
        positions=torch.tensor(positions, device=CUDA, **i32),
        cu_seqlens=torch.tensor(cu, device=CUDA, **i32),
        num_cached=cached,
        num_new=new,
        page_table=torch.tensor([p + [-1] * (width - len(p)) for p in pages], device=CUDA, **i32),
        slot_mapping=torch.tensor(slot_map, device=CUDA, **i32),
        state_slots=torch.tensor(slots, device=CUDA, **i32),
        is_decode=all(n == 1 for n in new) and all(c > 0 for c in cached),
        ops=TORCH_OPS,
        token_row=torch.tensor(token_row, device=CUDA, **i32),
        cached=torch.tensor(cached, device=CUDA, **i32),
        kv_indices=torch.tensor([x for p in pages for x in p], device=CUDA, **i32),
        kv_indptr=host.kv_indptr.to(CUDA),
        kv_last_page_len=host.kv_last_page_len.to(CUDA),
        host=host,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_kernels_equal_the_reference(dtype):
    gen = torch.Generator(device=CUDA).manual_seed(0)
    x, r = torch.randn(2, 7, 1024, device=CUDA, dtype=dtype, generator=gen).unbind(0)
    norm = RMSNorm(1024).to(CUDA, dtype)
    with torch.no_grad():
        norm.weight.normal_(0, 0.1, generator=gen)
    out, s = triton_norms.rms_norm(x, 1 + norm.weight.float(), norm.eps, r)
    rows = torch.tensor([6, 0, 3, 3], device=CUDA)  # the head's: rows gathered in the launch
    gathered = triton_norms.rms_norm(x, 1 + norm.weight.float(), norm.eps, r, rows)
    assert torch.equal(gathered[0], out[rows]) and torch.equal(gathered[1], s[rows])
    ref_out, ref_s = TORCH_OPS.norm(x, norm, r)
    torch.testing.assert_close(s, ref_s, atol=TOL[dtype], rtol=0)
    torch.testing.assert_close(out, ref_out, atol=TOL[dtype], rtol=TOL[dtype])

    heads = torch.randn(7, 8, 512, device=CUDA, dtype=dtype, generator=gen)  # [query | gate]
    cos, sin = RotaryEmbedding(64, 1e7)(torch.tensor([0, 1, 5, 99, 511, 2000, 4095], device=CUDA))
    head_norm = RMSNorm(256).to(CUDA, dtype)
    got = triton_rope.head_norm_rope(heads[..., :256], 1 + head_norm.weight.float(), cos, sin, 1e-6)
    want = TORCH_OPS.qk_rope(heads[..., :256], heads[:, :2, :256], cos, sin,
                             (head_norm, head_norm))[0]  # fmt: skip
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])
    # Llama's rotary alone (full head of 128) on q viewed out of a packed q | k | v
    positions = torch.tensor([0, 1, 5, 99, 511, 2000, 4095], device=CUDA)
    cos, sin = RotaryEmbedding(128, 5e5)(positions)
    packed = torch.randn(7, (24 + 2 * 8) * 128, device=CUDA, dtype=dtype, generator=gen)
    q = packed[:, : 24 * 128].view(7, 24, 128)
    k = packed[:, 24 * 128 : 32 * 128].view(7, 8, 128)
    got, got_k = triton_rope.qk_rope(q, k, None, None, cos, sin)  # one launch, as the layer's
    want, want_k = TORCH_OPS.qk_rope(q, k, cos, sin)
    torch.testing.assert_close(got, want, atol=TOL[dtype], rtol=TOL[dtype])
    torch.testing.assert_close(got_k, want_k, atol=TOL[dtype], rtol=TOL[dtype])
    assert torch.equal(got, triton_rope.rope(q, cos, sin))  # each head's bits as alone

    core = torch.randn(7, 16, 128, device=CUDA, dtype=dtype, generator=gen)
    z = torch.randn(7, 3000, device=CUDA, dtype=dtype, generator=gen)[:, : 16 * 128]
    gated = GatedRMSNorm(128).to(CUDA, dtype)
    got = triton_norms.gated_norm(core, z, gated.weight.float(), gated.eps)
    torch.testing.assert_close(got, TORCH_OPS.gated_norm(core, z, gated), atol=TOL[dtype], rtol=0)

    gate_up = torch.randn(7, 2 * 3584, device=CUDA, dtype=dtype, generator=gen)
    want = torch.nn.functional.silu(gate_up[:, :3584]) * gate_up[:, 3584:]
    torch.testing.assert_close(triton_norms.silu_mul(gate_up), want, atol=TOL[dtype], rtol=0)


def test_kept_launches_compute_what_tritons_own_launches_do():
    """INVARIANTS 56 on the GPU: the norm-family kernels on aligned inputs and on views 2
    bytes off a 16-byte boundary, launched three times each with `engine.triton_launch: bound`
    (Triton's launch first, then the kept kernel's runner), equal Triton's own launches
    bit for bit."""
    from engine.kernels import triton_launch

    gen = torch.Generator(device=CUDA).manual_seed(0)
    buffer = torch.randn(7 * 1024 + 1, device=CUDA, dtype=torch.bfloat16, generator=gen)
    weight = torch.rand(1024, device=CUDA, generator=gen) + 0.5
    gate_up = torch.randn(7, 2 * 3584 + 1, device=CUDA, dtype=torch.bfloat16, generator=gen)

    def run() -> list[torch.Tensor]:
        out = []
        for x in (buffer[:-1].view(7, 1024), buffer[1:].view(7, 1024)):  # aligned, then not
            out += triton_norms.rms_norm(x, weight, 1e-6, x.flip(0).contiguous())
            out.append(triton_norms.rms_norm(x, weight, 1e-6)[0])
        for g in (gate_up[:, :-1], gate_up[:, 1:]):
            out.append(triton_norms.silu_mul(g))
        return out

    want = run()
    try:
        triton_launch.set_launch("bound")
        for _ in range(3):
            for got, ref in zip(run(), want, strict=True):
                assert torch.equal(got, ref)
        assert triton_norms._rms_norm_kernel.kept  # the kept kernels were used
    finally:
        triton_launch.set_launch("jit")


@pytest.mark.parametrize("rows", [1, 64, 130])
def test_argmax_kernel_picks_torchs_first_maximum(rows):
    """engine/kernels/triton_argmax.py at a decode graph's shape (0.8b's 248,320 ids, bf16),
    ties across parts and within a block planted: torch.argmax's choice, every row."""
    from engine.kernels import triton_argmax

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    x = torch.randn(rows, 248_320, device=CUDA, dtype=torch.bfloat16, generator=gen)
    x[0, 100_000] = x[0, 200_000] = 9.0
    x[-1, 5] = x[-1, 9] = 9.0
    assert torch.equal(triton_argmax.argmax(x), x.argmax(-1))


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.cpu().float() - want).abs() / (1 + want.abs())).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_snac_kernels_equal_the_reference(dtype):
    """engine/kernels/triton_snac.py on CUDA against the torch modules they replace, computed
    in fp32 on the CPU from the same (rounded) values: a Snake and a residual unit's Snake ->
    depthwise conv -> Snake (dilations 1, 3, 9) at SNAC 24 kHz's shapes (1024 channels x 16
    steps to 64 x 8192, batches of 2 and 3 windows) and at odd ones (5 x 37), alpha 0 and
    below 0 in some channels. Error |got - want| / (1 + |want|): fp32 within float rounding
    (1e-5); bf16, computed in fp32 and rounded once to nearest, within half a bf16 ulp
    (2^-8 relative) plus float rounding."""
    from engine.kernels import triton_snac
    from engine.models import snac_layers

    bound = 1e-5 if dtype == torch.float32 else 2**-8 + 1e-4
    gen = torch.Generator().manual_seed(0)
    worst = {"snake": 0.0, "unit": 0.0}
    for b, c, t in ((2, 1024, 16), (3, 512, 128), (2, 64, 8192), (2, 5, 37)):
        alpha = torch.empty(1, c, 1).uniform_(0.2, 2.5, generator=gen)
        alpha[0, 1 % c], alpha[0, 2 % c] = 0.0, -0.7
        alpha = alpha.to(dtype)
        x = (torch.randn(b, c, t, generator=gen) * 2).to(dtype)
        want = snac_layers.snake(x.float(), alpha.float())
        got = triton_snac.snake(x.to(CUDA), alpha.to(CUDA))
        assert got.dtype == dtype and got.shape == x.shape
        worst["snake"] = max(worst["snake"], _relative_error(got, want))
        for d in (1, 3, 9):
            unit = snac_layers.ResidualUnit(c, d, groups=c)
            with torch.no_grad():
                unit.block[0].alpha.copy_(alpha.float())
                unit.block[2].alpha.copy_(alpha.float().flip(1))
                unit.block[1].weight.normal_(0, 0.4, generator=gen)
                unit.block[1].bias.normal_(0, 0.2, generator=gen)
            unit = unit.to(dtype).float()  # the parameters as the model's dtype rounds them
            snake1, conv, snake2, _ = unit.block
            with torch.no_grad():
                want = unit.block[:3](x.float())
            params = (snake1.alpha, conv.weight, conv.bias, snake2.alpha)
            got = triton_snac.residual_snake_conv(
                x.to(CUDA), *(p.detach().to(CUDA, dtype) for p in params), d
            )
            assert got.dtype == dtype and got.shape == x.shape
            worst["unit"] = max(worst["unit"], _relative_error(got, want))
    print(dtype, "max |error| / (1 + |reference|):", worst)
    assert max(worst.values()) <= bound, worst


def _gdn_layer(dtype, heads=16, dim=128):
    torch.manual_seed(0)
    layer = GatedDeltaNet(1024, heads, heads, dim, dim, 4, 1e-6)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, p.shape[-1] ** -0.5)
        layer.A_log.uniform_(0, 2.7)
    return layer.to(CUDA, dtype)


@pytest.mark.parametrize("gdn_prefill", ["fla", "triton", "triton_split", "auto"])
@pytest.mark.parametrize(
    ("dtype", "state_dtype"),
    [(torch.float32, torch.float32), (torch.bfloat16, torch.float32),
     (torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.float16)],
    ids=["fp32", "bf16", "bf16-state-bf16", "bf16-state-fp16"],
)  # fmt: skip
def test_gated_deltanet_prefill_then_decode_equals_the_reference(dtype, state_dtype, gdn_prefill):
    """Prefill rows of mixed lengths (one continuing a chunked prefill), a mixed step (two
    one-token rows, then a 40-token chunk: our kernels run the leading one-token rows on the
    recurrence and the rest chunked), then a decode step, each continuing the last one's
    state: outputs and both state pools agree. bf16 prefill runs fla's chunked kernel or ours
    (`gdn_prefill`); fp32 runs our recurrence either way. The state pool in fp32 or in bf16
    (`engine.state_dtype`), the reference's likewise."""
    layer = _gdn_layer(dtype)
    model = torch.nn.ModuleDict({"l": layer})
    ops = CudaOps(model, CUDA, page_size=16, config=KernelsConfig(gdn_prefill=gdn_prefill))
    slots_n, conv_dim = 8, layer.conv_dim
    pools = {
        name: (
            torch.randn(slots_n, conv_dim, 3, device=CUDA, dtype=dtype),
            (torch.randn(slots_n, 16, 128, 128, device=CUDA) * 0.1).to(state_dtype),
        )
        for name in ("ref", "ker")
    }
    pools["ker"] = tuple(t.clone() for t in pools["ref"])
    slots = [5, 2, 7]
    steps = [([0, 40, 0], [130, 9, 1]), ([130, 49, 1], [1, 1, 40]), ([131, 50, 41], [1, 1, 1])]
    for cached, new in steps:
        batch = _batch(cached, new, slots, [list(range(10))] * 3, 16)
        x = torch.randn(sum(new), 1024, device=CUDA, dtype=dtype)
        linears = (layer.in_proj_qkv, layer.in_proj_z, layer.in_proj_b, layer.in_proj_a)
        mixed, _, b, a = TORCH_OPS.project(x, linears)
        ops.begin_step(batch)
        got = ops.linear_attention(layer, mixed, a, b, *pools["ker"], batch)
        want = torch_linear_attention(layer, mixed, a, b, *pools["ref"], batch)
        tol = TOL[dtype] * (5 if dtype == torch.bfloat16 else 10)
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)
        for got_pool, want_pool in zip(pools["ker"], pools["ref"], strict=True):
            torch.testing.assert_close(got_pool.float(), want_pool.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize(
    ("tensor_cores", "decode_attention"),
    [(False, "flashinfer"), (True, "flashinfer"), (False, "triton")],
    ids=["cuda_cores", "tensor_cores", "triton"],
)
def test_flashinfer_attention_prefill_and_decode_equal_the_reference(
    tensor_cores, decode_attention
):
    """A prefill then two decode steps on FlashInfer against the torch paged attention; the
    decode steps on its CUDA-core kernel or its tensor-core one (`decode_tensor_cores`), or
    on our Triton kernel (`decode_attention: triton`; the prefill still FlashInfer's). The
    decode steps' K/V stored by qk_rope, the prefill's by attention: the same caches."""
    dtype, ps, q_heads, kv_heads, dim = torch.bfloat16, 16, 8, 2, 256
    model = torch.nn.ModuleDict({"a": GatedAttention(1024, q_heads, kv_heads, dim, 1e-6)})
    ops = CudaOps(
        model.to(CUDA, dtype), CUDA, page_size=ps,
        config=KernelsConfig(decode_tensor_cores=tensor_cores, decode_attention=decode_attention),
    )  # fmt: skip
    assert ops.attention_backend.tensor_cores == tensor_cores
    assert ops.attention_backend.decode_kernel == decode_attention
    gen = torch.Generator(device=CUDA).manual_seed(3)
    caches = {k: torch.zeros(64, ps, kv_heads, dim, device=CUDA, dtype=dtype) for k in "kv"}
    ref_caches = {k: c.clone() for k, c in caches.items()}
    pages = [[3, 9, 40, 41, 12], [0], [7, 8, 20]]
    steps = [([0, 0, 0], [70, 5, 33]), ([70, 5, 33], [1, 1, 1]), ([71, 6, 34], [1, 1, 1])]
    for cached, new in steps:
        batch = _batch(cached, new, [0, 1, 2], pages, ps)
        q = torch.randn(sum(new), q_heads, dim, device=CUDA, dtype=dtype, generator=gen)
        k, v = torch.randn(2, sum(new), kv_heads, dim, device=CUDA, dtype=dtype, generator=gen)
        ops.begin_step(batch)
        # as the layer calls them: qk_rope (an identity rotary here: the same q and k) stores a
        # decode step's K/V in its launch (INVARIANTS 91), then attention attends
        half = torch.ones(sum(new), dim // 2, device=CUDA)
        kv = (v, caches["k"], caches["v"], batch)
        q, k = ops.qk_rope(q, k, half, 0 * half, kv=kv)
        got = ops.attention(q, k, v, caches["k"], caches["v"], batch, dim**-0.5)
        want = torch_paged_attention(q, k, v, ref_caches["k"], ref_caches["v"], batch, dim**-0.5)
        torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(caches["k"], ref_caches["k"], atol=0, rtol=0)


def _decode_layout(lengths: list[int], page: int, pages: int, gen: torch.Generator):
    """Rows of `lengths` tokens on scattered pages of a pool of `pages` (the last kept for
    padding rows): the page lists and the (indices, indptr, last-page lengths) on the GPU."""
    free = torch.randperm(pages - 1, generator=gen).tolist()
    lists = [[free.pop() for _ in range(-(-n // page))] for n in lengths]
    indptr = np.cumsum([0] + [len(p) for p in lists]).tolist()
    last = [n - (len(p) - 1) * page for n, p in zip(lengths, lists, strict=True)]
    flat = [x for p in lists for x in p]
    return lists, tuple(
        torch.tensor(x, dtype=torch.int32, device=CUDA) for x in (flat, indptr, last)
    )


def _decode_reference(q, k_cache, v_cache, lengths, lists, page, scale) -> torch.Tensor:
    """The torch reference's decode attention (`_paged_decode`) in fp32 on the same values."""
    from engine.layers.attention import _paged_decode

    rows = len(lengths)
    batch = _batch([n - 1 for n in lengths], [1] * rows, list(range(rows)), lists, page)
    return _paged_decode(q.float(), k_cache.float(), v_cache.float(), batch, scale)


@pytest.mark.parametrize("model", ["0.8b", "3b"])
def test_triton_decode_equals_the_reference_at_the_served_shapes(model):
    """engine.decode_attention triton (engine/kernels/triton_decode.py) at 0.8b's heads (8 over
    2, head dim 256) and Orpheus 3b's (24 over 8, 128), bf16: 1, 7, 64 and 128 rows of mixed
    lengths up to 2,000 (1, page boundaries, one past), with the split count of the rows and
    forced to 1, 3 and 16, against the torch reference in fp32 on the same values, to bf16
    rounding of O(1) outputs."""
    from engine.kernels import triton_decode
    from engine.kernels.decode_config import SHAPES, decode_splits

    q_heads, kv_heads, dim = SHAPES[model]
    page, pages, scale = 16, 128 * 126, dim**-0.5
    gen = torch.Generator().manual_seed(5)
    cuda_gen = torch.Generator(device=CUDA).manual_seed(5)
    k_cache, v_cache = torch.randn(
        2, pages, page, kv_heads, dim, device=CUDA, dtype=torch.bfloat16, generator=cuda_gen
    )  # fmt: skip
    for rows in (1, 7, 64, 128):
        lengths = torch.randint(1, 2001, (rows,), generator=gen).tolist()
        lengths[: min(rows, 4)] = [1, 16, 17, 2000][: min(rows, 4)]
        lists, layout = _decode_layout(lengths, page, pages, gen)
        q = torch.randn(rows, q_heads, dim, device=CUDA, dtype=torch.bfloat16, generator=cuda_gen)
        want = _decode_reference(q, k_cache, v_cache, lengths, lists, page, scale)
        for splits in (None, 1, 3, 16):
            got = triton_decode.paged_decode(q, k_cache, v_cache, *layout, scale, splits=splits)
            assert got.dtype == torch.bfloat16 and got.shape == q.shape
            torch.testing.assert_close(
                got.float(),
                want,
                atol=2e-2,
                rtol=2e-2,
                msg=f"{rows} rows, splits {splits or decode_splits(rows, kv_heads)}",
            )


def test_triton_decode_replays_in_a_cuda_graph_as_it_runs_eagerly():
    """INVARIANTS 58 on the GPU: the Triton decode captured at a bucket of 16 rows (3b's heads:
    4 splits, the merge too) on fixed buffers of q and the page layout, then replayed after
    other lengths and pages are written into those buffers (the step inputs' way), equals
    the eager call on the same buffers, bit for bit, and the reference."""
    from engine.kernels import triton_decode

    q_heads, kv_heads, dim, page, pages, rows = 24, 8, 128, 16, 16 * 130, 16
    gen = torch.Generator().manual_seed(7)
    cuda_gen = torch.Generator(device=CUDA).manual_seed(7)
    k_cache, v_cache = torch.randn(
        2, pages, page, kv_heads, dim, device=CUDA, dtype=torch.bfloat16, generator=cuda_gen
    )  # fmt: skip
    q = torch.zeros(rows, q_heads, dim, device=CUDA, dtype=torch.bfloat16)
    i32 = {"dtype": torch.int32, "device": CUDA}
    indices = torch.zeros(pages, **i32)  # each at a fixed address, as the step inputs' views
    indptr = torch.zeros(rows + 1, **i32)
    last = torch.zeros(rows, **i32)

    def write(lengths):
        lists, (flat, ptr, tail) = _decode_layout(lengths, page, pages, gen)
        indices[: len(flat)].copy_(flat)
        indptr.copy_(ptr)
        last.copy_(tail)
        q.normal_(generator=cuda_gen)
        return lists

    def call():
        return triton_decode.paged_decode(q, k_cache, v_cache, indices, indptr, last, dim**-0.5)

    write([1] * rows)  # as a graph is captured: every row a padding row
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # compile off the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    for lengths in ([300, 1, 16, 17] * 4, torch.randint(1, 2001, (rows,), generator=gen).tolist()):
        lists = write(lengths)
        graph.replay()
        eager = call()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        want = _decode_reference(q, k_cache, v_cache, lengths, lists, page, dim**-0.5)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_gpu_sampling_greedy_exact_seeded_reproducible_and_batch_independent():
    gen = torch.Generator(device=CUDA).manual_seed(1)
    logits = torch.randn(6, 151_936, device=CUDA, generator=gen) * 3
    greedy = [SamplingParams(temperature=0)] * 6
    tokens, logprobs = sample_on_gpu(logits, greedy, [0] * 6)
    assert torch.equal(tokens, logits.argmax(-1)) and logprobs is None
    seeded = [SamplingParams(temperature=0.8, top_k=50, top_p=0.9, seed=7, logprobs=True)] * 6
    a, lp = sample_on_gpu(logits, seeded, list(range(6)))
    b, _ = sample_on_gpu(logits, seeded, list(range(6)))
    assert torch.equal(a, b)
    alone, _ = sample_on_gpu(logits[3:4], seeded[:1], [3])  # batch-independent
    assert alone.item() == a[3].item()
    ranks = (logits > logits.gather(1, a[:, None])).sum(-1)
    assert (ranks < 50).all()  # top-k respected
    want = torch.log_softmax(logits / 0.8, -1).gather(1, a[:, None])[:, 0]
    torch.testing.assert_close(lp, want)
    top1 = [SamplingParams(temperature=1.0, top_k=1)] * 6
    assert torch.equal(sample_on_gpu(logits, top1, [0] * 6)[0], logits.argmax(-1))
    # Unseeded draws follow the distribution: a 3-token vocabulary, 20,000 draws.
    small = torch.log(torch.tensor([[0.5, 0.3, 0.2]], device=CUDA)).expand(20_000, 3).contiguous()
    drawn, _ = sample_on_gpu(small, [SamplingParams(temperature=1.0)] * 20_000, [0] * 20_000)
    freq = torch.bincount(drawn, minlength=3).float() / 20_000
    torch.testing.assert_close(freq.cpu(), torch.tensor([0.5, 0.3, 0.2]), atol=0.02, rtol=0)


def test_sampling_and_the_logit_window_do_not_wait_for_queued_gpu_work():
    """INVARIANTS 46: the sampler's per-row values (temperatures, top-k, top-p, row indices) and
    a node's logit window go up without blocking, so sampling a step the overlapped loop has
    just launched returns while that step still runs. Here ~1 s of GPU spin is queued first: a
    blocking copy anywhere would wait it out, and the spin's event would have completed."""
    logits = torch.randn(8, 4096, device=CUDA)
    params = [
        SamplingParams(temperature=0.7, top_k=50, top_p=0.9),
        SamplingParams(temperature=1.0, seed=3, logprobs=True),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.2),
    ] * 2
    low = np.arange(8, dtype=np.int64) * 100

    def sample():
        window, offsets = window_logits(logits, low, 1024)
        tokens, _ = sample_on_gpu(window, params, list(range(8)))
        return tokens + offsets

    sample()  # warm up: kernels, pinned blocks
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of cycles on the stream
    spin = torch.cuda.Event()
    spin.record()
    tokens = sample()
    assert not spin.query(), "a copy in the sampler waited for the queued work"
    torch.cuda.synchronize()
    assert (
        (tokens >= torch.from_numpy(low).to(CUDA))
        & (tokens < 1024 + torch.from_numpy(low).to(CUDA))
    ).all()


def test_taking_a_steps_rows_does_not_wait_for_queued_gpu_work():
    """INVARIANTS 46 for the engine's row choices (`take_rows`: the sampled rows of a step
    with prompt chunks, a split mixed step's sampled prompt rows): a run of rows is a view,
    any other choice an index from pinned memory, so neither waits out ~1 s of queued spin."""
    from engine.layers.sampler import take_rows

    logits = torch.randn(8, 4096, device=CUDA)
    take_rows(logits, [1, 4, 6])  # warm up: the pinned block, the gather kernel
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of cycles on the stream
    spin = torch.cuda.Event()
    spin.record()
    picked, run = take_rows(logits, [1, 4, 6]), take_rows(logits, [2, 3, 4])
    assert not spin.query(), "taking the rows waited for the queued work"
    torch.cuda.synchronize()
    assert torch.equal(picked, logits[[1, 4, 6]]) and torch.equal(run, logits[2:5])


def test_ops_objects_are_interchangeable():
    """The CUDA ops keep the reference's interface: a missing method would fail at run time."""
    public = {n for n in dir(TORCH_OPS) if not n.startswith("_")}
    model = torch.nn.ModuleDict({"a": GatedAttention(64, 4, 2, 16, 1e-6)}).to(CUDA)
    assert public <= {n for n in dir(CudaOps(model, CUDA, page_size=16)) if not n.startswith("_")}


@pytest.mark.parametrize("rows", [1, 7, 16, 64, 128])
@pytest.mark.parametrize("model", ["0.8b", "3b"])
def test_skinny_gemm_equals_fp32_math_at_every_real_shape(model, rows):
    """engine.dense_kernel triton (engine/kernels/triton_gemm.py) at each dense GEMM of 0.8b and
    Orpheus 3b (triton_gemm.SHAPES), bf16, x a strided view: within one bf16 ulp (2^-7
    relative to 1 + |want|) of x.float() @ w.float().T, as torch's GEMM is; fp32 accumulation,
    one rounding (the split's partials summed in fp32 too)."""
    from engine.kernels import triton_gemm

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    for name, (n, k) in triton_gemm.SHAPES[model].items():
        wide = torch.randn(rows, 2 * k, device=CUDA, generator=gen).bfloat16()
        x = wide[:, :k]  # rows strided
        w = (torch.randn(n, k, device=CUDA, generator=gen) / k**0.5).bfloat16()
        want = x.float() @ w.float().T
        got = triton_gemm.skinny_linear(x, w)
        ours = ((got.float() - want).abs() / (1 + want.abs())).max().item()
        cublas = (torch.nn.functional.linear(x, w).float() - want).abs() / (1 + want.abs())
        print(f"{model} {name} M={rows}: ours {ours:.2e}, torch {cublas.max().item():.2e}")
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n), name
        assert ours <= 2**-7, (name, ours)
        del w, want, got


@pytest.mark.parametrize("rows", [1, 64, 128])
@pytest.mark.parametrize("model", ["0.8b", "3b"])
def test_gemm_epilogues_equal_the_unfused_kernels(model, rows):
    """engine.dense_epilogues at the real shapes: gate|up with SiLU-mul in the GEMM's epilogue
    (in its split sum at 128 rows) stores what silu_mul of the plain product does, and an
    output projection's partials summed by the residual norm give the plain sum's normed
    output and residual, bit for bit (the same fp32 sums in the same order, rounded where the
    unfused kernels round)."""
    from engine.kernels import triton_gemm

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    shapes = triton_gemm.SHAPES[model]
    outs = [name for name in ("out_proj", "o_proj", "down_proj") if name in shapes]
    for name in ("mlp_gate_up", *outs):
        n, k = shapes[name]
        x = torch.randn(rows, k, device=CUDA, generator=gen).bfloat16()
        w = (torch.randn(n, k, device=CUDA, generator=gen) / k**0.5).bfloat16()
        if name == "mlp_gate_up":
            fused = triton_gemm.skinny_linear(x, w, silu_mul=True)
            assert torch.equal(fused, triton_norms.silu_mul(triton_gemm.skinny_linear(x, w)))
            continue
        residual = torch.randn(rows, n, device=CUDA, generator=gen).bfloat16()
        scale = 1 + 0.1 * torch.randn(n, device=CUDA, generator=gen)
        product = triton_gemm.skinny_linear(x, w, partials=True)
        assert isinstance(product, triton_gemm.Partials) == (triton_gemm.plan(rows, n, k).split > 1)
        got = triton_norms.rms_norm(product, scale, 1e-6, residual)
        want = triton_norms.rms_norm(triton_gemm.skinny_linear(x, w), scale, 1e-6, residual)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (name, rows)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_conv_epilogue_equals_the_projection_then_the_decode_conv(rows):
    """0.8b's Gated DeltaNet in-projection (8224 x 1024: 6144 conv channels, then z|b|a) with
    the decode step's causal conv in the GEMM's epilogue stores what the plain product and
    the decode conv kernel store, and shifts the same windows, bit for bit: both sum the
    taps in one order from the product rounded to bf16 (triton_gdn_conv.conv_decode_step)."""
    from types import SimpleNamespace

    from engine.kernels import triton_gdn, triton_gemm

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    n, k = triton_gemm.SHAPES["0.8b"]["gdn_in_proj"]
    channels = 6144
    assert triton_gemm.fuses_conv(rows, n, k)
    x = torch.randn(rows, k, device=CUDA, generator=gen).bfloat16()
    w = (torch.randn(n, k, device=CUDA, generator=gen) / k**0.5).bfloat16()
    taps = (torch.randn(channels, 4, device=CUDA, generator=gen) / 2).bfloat16()
    pool = torch.randn(rows + 8, channels, 3, device=CUDA, generator=gen).bfloat16()
    slots = torch.randperm(rows + 8, device=CUDA, generator=gen)[:rows].int()
    cached = torch.ones(rows, dtype=torch.int32, device=CUDA)
    fused_pool, plain_pool = pool.clone(), pool.clone()
    epilogue = triton_gemm.ConvEpilogue(taps, fused_pool, slots, cached, channels)
    fused = triton_gemm.skinny_linear(x, w, conv=epilogue)
    product = triton_gemm.skinny_linear(x, w)
    meta = SimpleNamespace(is_decode=True, cached=cached, state_slots=slots, num_rows=rows,
                           gdn_tables=None)  # fmt: skip
    plain = triton_gdn.causal_conv(product[:, :channels], taps, plain_pool, meta)
    assert torch.equal(fused[:, channels:], product[:, channels:])
    assert torch.equal(fused[:, :channels], plain), (fused[:, :channels] - plain).abs().max()
    assert torch.equal(fused_pool, plain_pool)


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_prologues_equal_the_standalone_kernel_then_the_gemm(rows):
    """0.8b's output projections (1024 x 2048, K split 8) reading their input through a
    prologue: Gated DeltaNet's out_proj through the gated norm (16 heads of 128, z a view of
    the in-projection), gated attention's o_proj through the sigmoid gate (8 heads of 256, a
    view of the packed q): the partials the fused GEMM hands on equal the standalone kernel's
    then the plain GEMM's, bit for bit (the norm's sum of squares in fp64: exact whatever
    order each kernel's layout sums in; the gate elementwise, one helper for both)."""
    from engine.kernels import triton_gemm

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    n, k = triton_gemm.SHAPES["0.8b"]["out_proj"]
    w = (torch.randn(n, k, device=CUDA, generator=gen) / k**0.5).bfloat16()
    core = torch.randn(rows, 16, 128, device=CUDA, generator=gen).bfloat16()
    z = torch.randn(rows, 8224, device=CUDA, generator=gen).bfloat16()[:, 4096:6144]
    scale = 1 + 0.1 * torch.randn(128, device=CUDA, generator=gen)
    out = torch.randn(rows, k, device=CUDA, generator=gen).bfloat16()
    gate = torch.randn(rows, 8, 512, device=CUDA, generator=gen).bfloat16()[..., 256:]
    cases = {
        "gated_norm": (core.view(rows, -1), triton_gemm.GatedNorm(z, scale, 1e-6),
                       triton_norms.gated_norm(core, z, scale, 1e-6)),
        "sigmoid_gate": (out, triton_gemm.SigmoidGate(gate), triton_norms.sigmoid_gate(out, gate)),
    }  # fmt: skip
    for name, (x, prologue, unfused_input) in cases.items():
        fused = triton_gemm.skinny_linear(x, w, partials=True, prologue=prologue)
        plain = triton_gemm.skinny_linear(unfused_input, w, partials=True)
        assert isinstance(fused, triton_gemm.Partials), name
        assert torch.equal(fused.sums, plain.sums), (name, (fused.sums - plain.sums).abs().max())
    want = out * torch.sigmoid(gate).flatten(1)  # torch's: the sigmoid rounded, then the product
    got = triton_norms.sigmoid_gate(out, gate)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)  # a bf16 ulp


def test_skinny_gemm_replays_in_a_cuda_graph():
    """Captured once (its split launch too: 0.8b's down_proj at 64 rows), replayed on new
    inputs: the same output as an eager call on them."""
    from engine.kernels import triton_gemm

    x = torch.randn(64, 3584, device=CUDA).bfloat16()
    w = (torch.randn(1024, 3584, device=CUDA) / 60).bfloat16()
    assert triton_gemm.plan(64, 1024, 3584).split > 1
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        triton_gemm.skinny_linear(x, w)  # compile before capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = triton_gemm.skinny_linear(x, w)
    x.copy_(torch.randn_like(x.float()).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, triton_gemm.skinny_linear(x, w))


# --- programmatic dependent launch (engine.pdl) ----------------------------------------------
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_wait  # noqa: E402

from engine.kernels.triton_pdl import pdl_start  # noqa: E402


@triton.jit
def _slow_write_kernel(OUT, spins, PDL: tl.constexpr):
    """Lets its dependents launch at once (pdl_start), then spins ~milliseconds before it
    writes 2.0 (the fixed point of a -> a / 2 + 1) over OUT's 1024 zeros."""
    pdl_start(PDL)
    acc = tl.zeros([1024], tl.float32)
    for _ in range(spins):
        acc = acc * 0.5 + 1.0
    tl.store(OUT + tl.arange(0, 1024), acc)


@triton.jit
def _copy_kernel(X, OUT, WAIT: tl.constexpr):
    if WAIT:
        gdc_wait()
    offs = tl.arange(0, 1024)
    tl.store(OUT + offs, tl.load(X + offs))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_pdl_launches_overlap_and_the_wait_orders_them(graph):
    """engine.pdl's mechanism on this GPU and driver, eagerly and in a CUDA graph (where the
    launch attribute becomes a programmatic edge): a kernel launched with `launch_pdl` after
    one that called pdl_start runs while that one still spins, so without `griddepcontrol.wait`
    it reads the zeros not yet overwritten (the overlap is real: without it, PDL would measure
    nothing); with the wait it reads every 2.0. The second half is what every PDL kernel of the
    engine relies on (pdl_start before any access)."""
    results = {}
    for wait in (False, True):
        x = torch.zeros(1024, device=CUDA)
        out = torch.full((1024,), -1.0, device=CUDA)

        def pair(x=x, out=out, wait=wait):
            _slow_write_kernel[(1,)](x, 2_000_000, PDL=True, launch_pdl=True)
            _copy_kernel[(1,)](x, out, WAIT=wait, launch_pdl=True)

        pair()  # compiles both
        torch.cuda.synchronize()
        x.zero_()
        out.fill_(-1.0)
        if graph:
            cuda_graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(cuda_graph):
                pair()
            x.zero_()
            out.fill_(-1.0)
            torch.cuda.synchronize()
            cuda_graph.replay()
        else:
            pair()
        torch.cuda.synchronize()
        assert (x == 2.0).all()
        results[wait] = out.clone()
    assert (results[True] == 2.0).all()
    assert (results[False] == 0.0).any(), "no overlap: the second launch waited for the first"


@pytest.mark.parametrize("dense_kernel", ["torch", "triton"])
def test_pdl_kernels_compute_what_plain_launches_do(dense_kernel):
    """engine.pdl at 0.8b's shapes: each PDL kernel of a decode step launched programmatically
    after the one before (eagerly and replayed in a CUDA graph) gives exactly the plain
    launches' result: a norm, the packed GEMMs (ours: their weight prefetch too),
    SiLU-mul, the split GEMM's sum and the argmax, run as one chain."""
    from engine.kernels import triton_argmax, triton_gemm, triton_launch

    gen = torch.Generator(device=CUDA).manual_seed(0)
    rows, hidden = 64, 1024
    x = torch.randn(rows, hidden, device=CUDA, generator=gen).bfloat16()
    w_norm = torch.rand(hidden, device=CUDA, generator=gen) + 0.5
    gate_up = (torch.randn(7168, hidden, device=CUDA, generator=gen) / 32).bfloat16()
    down = (torch.randn(hidden, 3584, device=CUDA, generator=gen) / 60).bfloat16()
    head = (torch.randn(248_320, hidden, device=CUDA, generator=gen) / 32).bfloat16()
    assert triton_gemm.plan(rows, hidden, 3584).split > 1  # the split sum's launch too

    def dense(a, w):
        if dense_kernel == "triton":
            return triton_gemm.skinny_linear(a, w)
        return torch.nn.functional.linear(a, w)

    def chain():
        normed, _ = triton_norms.rms_norm(x, w_norm, 1e-6)
        act = triton_norms.silu_mul(dense(normed, gate_up))
        out, _ = triton_norms.rms_norm(dense(act, down), w_norm, 1e-6)
        logits = dense(out, head)
        return act, logits, triton_argmax.argmax(logits)

    try:
        triton_launch.set_launch("jit", pdl=False)
        plain = chain()
        triton_launch.set_launch("jit", pdl=True)
        eager = chain()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = chain()
        for buffer in captured:
            buffer.zero_()
        graph.replay()
        torch.cuda.synchronize()
    finally:
        triton_launch.set_launch("jit")
    for a, b, c in zip(plain, eager, captured, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("rows", [1, 64, 128])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_the_pipelined_decode_recurrence_equals_the_grid_one(rows, state_dtype):
    """engine.gdn_decode pipelined at 0.8b's heads: a decode step of `rows` rows (one fresh,
    slots shuffled) on the persistent, pipelined kernel against the grid recurrence on the
    same inputs: outputs and the rows' states within float rounding (the same per-tile
    arithmetic: printed whether bit for bit), the other slots untouched; under every launch
    of bench_gdn_kernels' PIPELINED_SWEEP too, and replayed in a CUDA graph."""
    from benchmarks.bench_gdn_kernels import PIPELINED_SWEEP
    from engine.kernels import triton_gdn
    from engine.kernels.gdn_launch import PipelinedLaunch

    gen = torch.Generator(device=CUDA).manual_seed(rows)
    hk, hv, dk, dv, slots_n = 16, 16, 128, 128, rows + 9
    qkv = torch.randn(rows, 2 * hk * dk + hv * dv, device=CUDA, generator=gen).bfloat16()
    a = torch.randn(rows, hv, device=CUDA, generator=gen).bfloat16()
    b = torch.randn(rows, hv, device=CUDA, generator=gen).bfloat16()
    A_log = torch.rand(hv, device=CUDA, generator=gen) * 2 - 1
    dt_bias = torch.randn(hv, device=CUDA, generator=gen) * 0.5
    state0 = (torch.randn(slots_n, hv, dk, dv, device=CUDA, generator=gen) * 0.1).to(state_dtype)
    slots = torch.randperm(slots_n, device=CUDA, generator=gen)[:rows].int()
    cached = torch.ones(rows, dtype=torch.int32, device=CUDA)
    cached[rows // 2] = 0
    meta = SimpleNamespace(
        num_rows=rows, cu_seqlens=torch.arange(rows + 1, dtype=torch.int32, device=CUDA),
        cached=cached, state_slots=slots,
    )  # fmt: skip
    grid_state = state0.clone()
    want = triton_gdn.gated_delta_recurrent(qkv, a, b, A_log, dt_bias, grid_state, meta, hk,
                                            dk, dv)  # fmt: skip
    others = torch.ones(slots_n, dtype=torch.bool, device=CUDA)
    others[slots.long()] = False
    for launch in PIPELINED_SWEEP:
        state = state0.clone()
        got = triton_gdn.gated_delta_recurrent(qkv, a, b, A_log, dt_bias, state, meta, hk, dk, dv,
                                               pipelined=True,
                                               pipelined_launch=PipelinedLaunch(*launch))  # fmt: skip
        exact = torch.equal(got, want) and torch.equal(state, grid_state)
        print(f"rows {rows} {state_dtype} launch {launch}: bit for bit {exact}")
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(state.float(), grid_state.float(), atol=1e-3, rtol=1e-3)
        assert torch.equal(state[others], state0[others])
    state = state0.clone()
    out = torch.empty_like(want)
    args = (qkv, a, b, A_log, dt_bias, state, meta, hk, dk, dv)
    triton_gdn.gated_delta_recurrent(*args, out=out, pipelined=True)  # compiled first
    state.copy_(state0)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        triton_gdn.gated_delta_recurrent(*args, out=out, pipelined=True)
    state.copy_(state0)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), want.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(state.float(), grid_state.float(), atol=1e-3, rtol=1e-3)

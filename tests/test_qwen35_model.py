"""Qwen3.5: the cached engine path equals the plain uncached forward; init and loading."""

from __future__ import annotations

import copy
import dataclasses
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from engine.batch import ForwardBatch
from engine.cache import KVCache
from engine.config import KernelsConfig
from engine.kernels import build_ops
from engine.kernels.torch_ops import TORCH_OPS, TorchOps
from engine.models import build_model
from engine.models.qwen35 import PRESETS, CheckpointError, Qwen35ForCausalLM
from tests.fresh_python import fresh_python


@pytest.fixture(scope="module")
def tiny() -> Qwen35ForCausalLM:
    return build_model("qwen35", "tiny", seed=0, dtype="float32", device="cpu")


class Requests:
    """Test-side scheduler bookkeeping: pages and a state slot per request, one step's batch."""

    def __init__(self, model: Qwen35ForCausalLM, page_size: int = 4, state_dtype=torch.float32):
        shapes = model.cache_shapes()
        self.cache = KVCache(shapes, 128, page_size, 8, torch.float32, "cpu", state_dtype)
        self.pages: dict[int, list[int]] = {}
        self.slot: dict[int, int] = {}
        self.cached: dict[int, int] = {}

    def step(self, new_tokens: dict[int, list[int]]) -> ForwardBatch:
        ids, positions, slots, table = [], [], [], []
        for rid, tokens in new_tokens.items():
            if rid not in self.slot:
                self.slot[rid] = self.cache.slots.take(1)[0]
                # A used slot's leftovers, poisoned: a row with nothing cached must not read
                # them (INVARIANTS 44), or NaN reaches its logits.
                for conv, rec in zip(self.cache.conv_state, self.cache.ssm_state, strict=True):
                    conv[self.slot[rid]] = float("nan")
                    rec[self.slot[rid]] = float("nan")
                self.pages[rid], self.cached[rid] = [], 0
            start, pages = self.cached[rid], self.pages[rid]
            pages += self.cache.pages.take(self.cache.pages_for(start + len(tokens)) - len(pages))
            size = self.cache.page_size
            ids += tokens
            positions += range(start, start + len(tokens))
            slots += [pages[p // size] * size + p % size for p in range(start, start + len(tokens))]
            table.append(pages)
        width = max(map(len, table))
        num_new = [len(t) for t in new_tokens.values()]
        num_cached = [self.cached[rid] for rid in new_tokens]
        for rid, tokens in new_tokens.items():
            self.cached[rid] += len(tokens)
        return ForwardBatch(
            input_ids=torch.tensor(ids),
            positions=torch.tensor(positions),
            cu_seqlens=torch.tensor([0, *torch.tensor(num_new).cumsum(0).tolist()]),
            num_cached=num_cached,
            num_new=num_new,
            page_table=torch.tensor(
                [p + [-1] * (width - len(p)) for p in table], dtype=torch.int32
            ),
            slot_mapping=torch.tensor(slots),
            state_slots=torch.tensor([self.slot[rid] for rid in new_tokens]),
            is_decode=all(n == 1 for n in num_new) and all(c > 0 for c in num_cached),
            ops=TORCH_OPS,
        )


def _prompts(lengths: list[int], vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(42)
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def test_cached_path_equals_forward_full(tiny):
    """Chunked prefill, a mixed step, then vectorised greedy decode: the logits of every row's
    last token match forward_full of its whole sequence, and so do the greedy tokens."""
    seqs = _prompts([3, 11, 26, 7], tiny.config.vocab_size)
    prompt_chunks = {0: [3], 1: [5, 6], 2: [9, 11, 6], 3: [7]}
    engine = Requests(tiny)
    schedule = [{0: 0, 1: 0, 2: 0}, {1: 1, 2: 1}, {2: 2}]  # request -> prompt chunk index
    schedule += [{0: None, 1: None, 2: None}] * 2 + [{0: None, 3: 0, 1: None}]  # 3 joins mixed
    schedule += [{0: None, 1: None, 2: None, 3: None}] * 4
    done = {rid: 0 for rid in range(len(seqs))}
    checked = decode_steps = 0
    for step in schedule:
        new = {}
        for rid, chunk in step.items():
            if chunk is None:  # decode: the greedy token of the previous step
                new[rid] = [seqs[rid][-1]]
            else:
                size = prompt_chunks[rid][chunk]
                new[rid] = seqs[rid][done[rid] : done[rid] + size]
                done[rid] += size
        batch = engine.step(new)
        logits = tiny(batch, engine.cache)
        decode_steps += batch.is_decode
        for row, rid in enumerate(new):
            length = engine.cached[rid]
            ref = tiny.forward_full(torch.tensor(seqs[rid][:length]))[-1]
            torch.testing.assert_close(logits[row], ref, atol=1e-3, rtol=1e-4)  # logits std ~3
            assert logits[row].argmax().item() == ref.argmax().item()
            checked += 1
            if length >= len(seqs[rid]):  # prompt consumed: extend greedily
                seqs[rid].append(int(logits[row].argmax()))
    assert checked == 31 and decode_steps == 6


class _ModuleCalls(TorchOps):
    """The reference ops as the layers ran before `ops.linear`: each out_proj, o_proj and
    down_proj the Linear's own call, the LM head F.linear on its weight."""

    def linear(self, layer, x, to_norm=False):
        return layer(x) if isinstance(layer, torch.nn.Linear) else F.linear(x, layer.weight)


def test_reference_linear_equals_the_module_calls_bit_for_bit(tiny):
    """`ops.linear` on the torch reference (what a CPU engine runs, engine.dense_kernel
    whatever it says) changes no bit of a step's logits: prefill, mixed and decode steps
    against the layers' former module calls; and build_ops gives a CPU engine the reference
    with dense_kernel triton too."""
    cpu, triton_gemm = torch.device("cpu"), KernelsConfig(dense_kernel="triton")
    assert build_ops(triton_gemm, tiny, cpu, 4) is TORCH_OPS
    seqs = _prompts([9, 4, 13], tiny.config.vocab_size)
    runs = {}
    for name, ops in (("reference", TORCH_OPS), ("module calls", _ModuleCalls())):
        engine, logits = Requests(tiny), []
        steps = [{0: seqs[0], 1: seqs[1]}, {0: [5], 1: [6], 2: seqs[2]}, {0: [7], 1: [8], 2: [9]}]
        for new in steps:
            batch = dataclasses.replace(engine.step(new), ops=ops)
            logits.append(tiny(batch, engine.cache))
        runs[name] = logits
    for got, want in zip(runs["reference"], runs["module calls"], strict=True):
        assert torch.equal(got, want)


def _state_rounding(tiny, state_dtype: torch.dtype) -> tuple[float, int]:
    """A prefill and 6 decode steps with the recurrent states stored in `state_dtype`, fed the
    fp32 reference's greedy tokens: the largest |logit - reference's|, and at how many
    (step, row) the greedy choice differed from the reference's."""
    seqs = _prompts([9, 21], tiny.config.vocab_size)
    engine = Requests(tiny, state_dtype=state_dtype)
    assert all(pool.dtype == state_dtype for pool in engine.cache.ssm_state)
    new, worst, flips = {rid: list(seq) for rid, seq in enumerate(seqs)}, 0.0, 0
    for _ in range(6):
        logits = tiny(engine.step(new), engine.cache)
        for row, rid in enumerate(new):
            ref = tiny.forward_full(torch.tensor(seqs[rid]))[-1]
            worst = max(worst, (logits[row] - ref).abs().max().item())
            flips += logits[row].argmax().item() != ref.argmax().item()
            seqs[rid].append(int(ref.argmax()))
        new = {rid: [seqs[rid][-1]] for rid in new}
    return worst, flips


def test_bf16_state_slots_round_only_the_storage(tiny):
    """engine.state_dtype=bfloat16: the recurrent states are stored in bf16 (the math stays
    fp32), so a prefill then decode steps stay within bf16 rounding of the fp32 reference:
    the same greedy tokens, logits within 0.5 (std ~3; measured 0.17 over these 6 steps, where
    bf16 weights and activations at 0.8b give ~1), and not bit-equal (the rounding is real).
    A state 10% off flips the greedy tokens."""
    worst, flips = _state_rounding(tiny, torch.bfloat16)
    assert flips == 0
    assert 0.0 < worst < 0.5, worst


def test_fp16_state_slots_round_less_than_bf16_ones(tiny):
    """engine.state_dtype=float16: the states' storage rounds to 11 significant bits, bf16's
    to 8, so fp16 slots stay closer to the fp32 reference than bf16 ones, and are still not
    exact (the rounding is real)."""
    (fp16, _), (bf16, _) = (_state_rounding(tiny, d) for d in (torch.float16, torch.bfloat16))
    assert 0.0 < fp16 < bf16 / 2, (fp16, bf16)


def test_row_logits_do_not_depend_on_the_batch(tiny):
    target, *others = _prompts([9, 4, 17], tiny.config.vocab_size)
    alone, mixed = Requests(tiny), Requests(tiny)
    out_alone = [tiny(alone.step({0: target}), alone.cache)[0]]
    out_mixed = [tiny(mixed.step({1: others[0], 0: target, 2: others[1]}), mixed.cache)[1]]
    for token in (5, 77, 1000):
        out_alone.append(tiny(alone.step({0: [token]}), alone.cache)[0])
        out_mixed.append(tiny(mixed.step({2: [token], 1: [token], 0: [token]}), mixed.cache)[2])
    torch.testing.assert_close(torch.stack(out_mixed), torch.stack(out_alone), atol=1e-4, rtol=1e-5)


def test_seeded_init_is_reproducible():
    a, b = (build_model("qwen35", "tiny", seed=7, dtype="float32", device="cpu") for _ in range(2))
    c = build_model("qwen35", "tiny", seed=8, dtype="float32", device="cpu")
    for (name, pa), pb, pc in zip(
        a.named_parameters(), b.parameters(), c.parameters(), strict=True
    ):
        assert torch.equal(pa, pb), name
        if pa.std() > 0:  # norms and gates start at constants; random tensors differ by seed
            assert not torch.equal(pa, pc), name
    assert 1e6 < a.num_parameters() < 1e7


def test_building_the_models_does_not_import_torch_dynamo_or_sympy():
    """The meta-device build skips the modules' initialisers: nn.Embedding's normal_ on the
    meta device imported torch._dynamo, a second of every worker's start on 2 cores; and it
    allocates with torch.empty: Module.to_empty's empty_like of a meta tensor imported sympy,
    ~0.4 s more."""
    code = (
        "import sys; from engine.models import build_model, build_streams; "
        "build_model('qwen35', 'tiny', 0, 'float32', 'cpu'); "
        "build_model('orpheus', 'tiny', 0, 'float32', 'cpu'); "
        "build_streams('orpheus', 'tiny', 0, 'float32', 'cpu', 'torch'); "
        "print('torch._dynamo' in sys.modules, 'sympy' in sys.modules)"
    )
    assert fresh_python(code) == "False False"


def test_08b_shapes_keep_activations_finite():
    model = build_model("qwen35", "0.8b", seed=0, dtype="float32", device="cpu")
    assert 0.7e9 < model.num_parameters() < 0.8e9  # text part of Qwen3.5-0.8B, tied embeddings
    rms = []  # the residual stream entering each post-attention norm and the final norm

    def record(_module, args):
        rms.append(args[0].pow(2).mean().sqrt().item())

    norms = [layer.post_attention_layernorm for layer in model.model.layers]
    for norm in [*norms, model.model.norm]:
        norm.register_forward_pre_hook(record)
    logits = model.forward_full(torch.tensor([11, 248_000, 42]))
    assert logits.shape == (3, 248_320) and torch.isfinite(logits).all()
    assert len(rms) == 25 and all(1e-3 < r < 10 for r in rms), rms
    assert 0.05 < logits.std().item() < 10


def _hf_config(model: Qwen35ForCausalLM, multimodal: bool) -> dict:
    c = model.config
    text = {
        k: v for k, v in dataclasses.asdict(c).items() if k not in ("eos_token_ids", "rope_theta")
    }
    # As published: config.json names <|endoftext|>, generation_config.json adds <|im_end|>.
    text.update(layer_types=list(c.layer_types), eos_token_id=c.eos_token_ids[1])
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": c.rope_theta,
                               "partial_rotary_factor": c.partial_rotary_factor}  # fmt: skip
    if not multimodal:
        return text
    return {
        "model_type": "qwen3_5",
        "tie_word_embeddings": c.tie_word_embeddings,
        "text_config": text,
    }


def _write_checkpoint(path, model: Qwen35ForCausalLM, multimodal: bool, edit=lambda t: t) -> None:
    prefix = "model.language_model." if multimodal else "model."
    tensors = {prefix + k.removeprefix("model."): v for k, v in model.state_dict().items()}
    if multimodal:  # towers the text model does not use are skipped
        tensors["model.visual.blocks.0.attn.qkv.weight"] = torch.zeros(2, 2)
        tensors["mtp.fc.weight"] = torch.zeros(2, 2)
    tensors = edit(tensors)
    names = sorted(tensors)
    for shard, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        save_file(
            {n: tensors[n].contiguous() for n in part}, str(path / f"model-{shard}.safetensors")
        )
    (path / "config.json").write_text(json.dumps(_hf_config(model, multimodal)))
    (path / "generation_config.json").write_text(
        json.dumps({"eos_token_id": list(model.eos_token_ids)})
    )


@pytest.mark.parametrize("multimodal", [True, False])
def test_hf_checkpoint_roundtrip(tiny, tmp_path, multimodal):
    _write_checkpoint(tmp_path, tiny, multimodal)
    loaded = build_model(
        "qwen35", "unused", seed=1, dtype="float32", device="cpu", path=str(tmp_path)
    )
    assert loaded.config == tiny.config and loaded.eos_token_ids == tiny.eos_token_ids
    ids = torch.tensor(_prompts([12], tiny.config.vocab_size)[0])
    assert torch.equal(loaded.forward_full(ids), tiny.forward_full(ids))


def test_hf_checkpoint_missing_or_unknown_tensor_is_an_error(tiny, tmp_path):
    gone = "model.language_model.layers.2.linear_attn.A_log"
    (tmp_path / "a").mkdir()
    _write_checkpoint(
        tmp_path / "a", tiny, True, lambda t: {k: v for k, v in t.items() if k != gone}
    )
    with pytest.raises(CheckpointError, match="missing.*layers.2.linear_attn.A_log"):
        Qwen35ForCausalLM.from_pretrained(tmp_path / "a", torch.float32, "cpu")
    (tmp_path / "b").mkdir()
    extra = "model.language_model.layers.0.mlp.extra.weight"
    _write_checkpoint(tmp_path / "b", tiny, True, lambda t: {**t, extra: torch.zeros(1)})
    with pytest.raises(CheckpointError, match=f"unknown.*{extra}"):
        Qwen35ForCausalLM.from_pretrained(tmp_path / "b", torch.float32, "cpu")


def test_matches_the_transformers_reference():
    """Our layout and math equal Hugging Face's Qwen3.5 (untied head, 2 value heads per key head)."""
    transformers = pytest.importorskip("transformers", reason="transformers is an optional check")
    config = dataclasses.replace(
        PRESETS["tiny"],
        linear_num_value_heads=8,
        linear_value_head_dim=16,
        tie_word_embeddings=False,
    )
    ours = Qwen35ForCausalLM.random(config, seed=3, dtype=torch.float32, device="cpu")
    hf_config = transformers.Qwen3_5TextConfig(**_hf_config(ours, multimodal=False))
    reference = transformers.Qwen3_5ForCausalLM(hf_config).eval()
    reference.load_state_dict(ours.state_dict(), strict=True)
    ids = torch.tensor(_prompts([70], config.vocab_size)[0])
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    torch.testing.assert_close(ours.forward_full(ids), expected, atol=1e-4, rtol=1e-5)


def test_dense_kernel_head_puts_the_lm_head_alone_on_ours(tiny, monkeypatch):
    """engine.dense_kernel "head": our GEMM for the LM head's product only (the tied
    embeddings' weight), "triton" for every product, "torch" for none; never past MAX_ROWS
    rows (a prefill step) nor in fp32. The CUDA ops know which module is the head."""
    triton_gemm = pytest.importorskip("engine.kernels.triton_gemm")
    from engine.kernels.cuda_ops import CudaOps

    x = torch.zeros(64, 8, dtype=torch.bfloat16)
    assert triton_gemm.takes("head", True, x) and not triton_gemm.takes("head", False, x)
    assert triton_gemm.takes("triton", False, x) and not triton_gemm.takes("torch", True, x)
    assert not triton_gemm.takes("head", True, torch.zeros(129, 8, dtype=torch.bfloat16))
    assert not triton_gemm.takes("triton", True, x.float())
    asked = []
    monkeypatch.setattr(triton_gemm, "takes", lambda kind, head, x: asked.append(head) or False)
    ops = CudaOps(tiny, torch.device("cpu"), 4, config=KernelsConfig(dense_kernel="head"))
    h = torch.randn(3, tiny.config.hidden_size)
    ops.linear(tiny.head, h)
    ops.linear(tiny.model.layers[0].mlp.down_proj, torch.randn(3, tiny.config.intermediate_size))
    assert asked == [True, False]


def test_dense_rows_bounds_the_steps_our_gemm_and_its_epilogues_take(tiny, monkeypatch):
    """engine.dense_rows with dense_kernel triton: a product of up to that many rows on ours
    (the MLP's with SiLU-mul fused, an output projection's as partials for its norm, with
    dense_epilogues), more rows on torch's; dense_epilogues off: ours, unfused."""
    triton_gemm = pytest.importorskip("engine.kernels.triton_gemm")
    from engine.kernels import cuda_ops
    from engine.kernels.cuda_ops import CudaOps

    calls = []

    def ours(x, weight, **fused):
        calls.append((x.shape[0], sorted(k for k, on in fused.items() if on)))
        return torch.zeros(x.shape[0], weight.shape[0] // (1 + bool(fused.get("silu_mul"))))

    monkeypatch.setattr(triton_gemm, "skinny_linear", ours)
    from engine.kernels import triton_norms  # the unfused SiLU-mul: not run on a CPU tensor

    monkeypatch.setattr(triton_norms, "silu_mul", lambda x: x[:, : x.shape[1] // 2])
    monkeypatch.setattr(cuda_ops, "FlashInferAttention", lambda *args, **kw: None)  # bf16
    model = copy.deepcopy(tiny).to(torch.bfloat16)
    mlp, hidden = model.model.layers[0].mlp, model.config.hidden_size
    for epilogues in (True, False):
        config = KernelsConfig(dense_kernel="triton", dense_rows=64, dense_epilogues=epilogues)
        ops = CudaOps(model, torch.device("cpu"), 4, config=config)
        for rows in (64, 65):
            x = torch.zeros(rows, hidden, dtype=torch.bfloat16)
            calls.clear()
            ops.swiglu(x, mlp.gate_proj, mlp.up_proj)
            ops.linear(mlp.down_proj, torch.zeros(rows, mlp.down_proj.in_features).bfloat16(),
                       to_norm=True)  # fmt: skip
            fused = [["silu_mul"], ["partials"]] if epilogues else [[], []]
            assert calls == ([(64, fused[0]), (64, fused[1])] if rows == 64 else []), calls


def test_a_second_ops_object_of_a_model_shares_its_packed_weights(tiny):
    """engine.prefill_stream builds a second CUDA ops object for the prefill lane: its packed
    projections are the first one's buffers (no second copy of ~0.7 GB at 0.8b), and each
    Linear's weight stays a view of its rows in them."""
    pytest.importorskip("engine.kernels.triton_gemm")
    from engine.kernels.cuda_ops import CudaOps

    model = copy.deepcopy(tiny)
    want = {key: torch.cat([linear.weight.detach() for linear in key]) for key in
            CudaOps(model, torch.device("cpu"), 4).packed}  # fmt: skip
    first = CudaOps(model, torch.device("cpu"), 4)
    second = CudaOps(model, torch.device("cpu"), 4)
    assert len(first.packed) == len(want) > 0
    for key, (packed, sizes) in first.packed.items():
        again, again_sizes = second.packed[key]
        assert again.data_ptr() == packed.data_ptr() and again_sizes == sizes
        assert torch.equal(again, want[key])
        start = 0
        for linear, rows in zip(key, sizes, strict=True):
            assert linear.weight.data_ptr() == packed[start].data_ptr()
            start += rows


@pytest.mark.parametrize("setting", ["grid", "pipelined"])
def test_gdn_decode_routes_decode_rows_alone_to_the_pipelined_kernel(tiny, monkeypatch, setting):
    """engine.gdn_decode: with `pipelined`, the CUDA ops run a decode step's recurrence (every
    row one token) and a mixed step's leading decode rows on the pipelined kernel; an fp32
    step with prompt rows (the recurrence over many tokens a row) stays on the grid; with
    `grid` nothing does."""
    triton_gdn = pytest.importorskip("engine.kernels.triton_gdn")
    from engine.kernels.cuda_ops import CudaOps

    calls = []
    monkeypatch.setattr(
        triton_gdn,
        "gated_delta_recurrent",
        lambda *a, **kw: calls.append(("recurrent", kw["pipelined"])),
    )
    monkeypatch.setattr(triton_gdn, "gated_delta_prefill",
                        lambda *a, **kw: calls.append(("prefill", kw["pipelined"])))  # fmt: skip
    ops = CudaOps(tiny, torch.device("cpu"), 4, config=KernelsConfig(gdn_decode=setting))
    layer = next(m for m in tiny.modules() if type(m).__name__ == "GatedDeltaNet")
    on = setting == "pipelined"
    for is_decode, chunked, want in ((True, False, ("recurrent", on)),
                                     (False, False, ("recurrent", False)),
                                     (False, True, ("prefill", on))):  # fmt: skip
        ops._chunked = chunked  # a bf16 prefill or mixed step (begin_step sets it)
        batch = SimpleNamespace(is_decode=is_decode, gdn_tables=None)
        ops.delta_rule(layer, None, None, None, None, batch)
        assert calls[-1] == want, (is_decode, chunked)

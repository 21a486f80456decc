"""The capturable Gated DeltaNet op (engine.piecewise_gdn, docs/KERNELS.md): its row and chunk
tables staged by the step inputs equal the kernels' own, every launch of a step padded to a
bucket is the same launch for any other step of that bucket (grids, arguments, addresses: one
CUDA graph serves both, INVARIANTS 47), and the piecewise runner captures the op inside its
pieces where the ops declare it capturable.

What the kernels compute on those grids: tests/test_triton_interpret.py
(test_fixed_grid_gated_deltanet_op_on_a_padded_step_equals_the_reference)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine.config import ConfigError
from engine.kernels import gdn_tables
from engine.kernels.gdn_config import SPLIT_DEFAULT, SplitConfig
from engine.worker.step_inputs import StepInputs
from harness.scenario import load_scenario

STEPS = {  # (new tokens, cached tokens, state slot) per row
    "mixed": ([1, 1, 1, 40, 5, 1, 20], [4, 9, 2, 0, 6, 3, 0], [3, 0, 7, 5, 2, 8, 6]),
    "other-mixed": ([1, 33, 1, 17], [5, 0, 2, 8], [2, 4, 6, 1]),
    "prefill": ([64, 2], [0, 30], [1, 3]),
    "one-token-rows": ([1, 1, 1], [3, 0, 2], [3, 0, 7]),
    "no-prefix": ([40, 1, 7], [0, 3, 5], [5, 3, 2]),
}


def _stage(inputs: StepInputs, name: str, bucket: int | None = 96, tables: bool = True):
    """One of STEPS staged as the piecewise runner stages it (padded to `bucket`)."""
    lengths, cached, slots = STEPS[name]
    rows = [
        SimpleNamespace(num_new=n, walk="prefill", request=SimpleNamespace(
            num_cached=c, pages=list(range(8 * i, 8 * i + 8)), tokens=[1] * (c + n), slot=s,
            rid=i,
        ))
        for i, (n, c, s) in enumerate(zip(lengths, cached, slots, strict=True))
    ]  # fmt: skip
    cache = SimpleNamespace(page_size=16, sink_page=200, sink_slot=9)
    ops = SimpleNamespace(reads_page_table=False)
    return inputs.stage(rows, cache, ops, pad_tokens_to=bucket, gdn_tables=tables)


@pytest.mark.parametrize("name", sorted(STEPS))
def test_staged_tables_equal_the_split_kernels_torch_tables(name):
    """The tables the step inputs stage at fixed offsets equal what the split kernel's eager
    path sends (`_chunk_tables`; both built by engine/kernels/gdn_tables.py), from the same
    leading one-token rows; the staged fields sit at the same addresses for every step."""
    triton_gdn = pytest.importorskip("engine.kernels.triton_gdn")
    from engine.kernels.triton_gdn_split import _chunk_tables

    inputs = StepInputs(96, 16, 8, torch.device("cpu"), slots=1)
    batch = _stage(inputs, name)
    lengths = STEPS[name][0]
    single = triton_gdn._one_token_rows(batch)
    assert single == gdn_tables.one_token_prefix(np.array(lengths))
    count, chunk_row, chunk_start, first = _chunk_tables(batch, 32, single)
    staged = batch.gdn_tables
    assert staged.counts.tolist() == [0, single, len(lengths), count]
    assert staged.chunk_row[:count].tolist() == chunk_row.tolist()
    assert staged.chunk_start[:count].tolist() == chunk_start.tolist()
    assert staged.first_chunk[: len(lengths)].tolist() == first.tolist()
    assert len(staged.chunk_row) == gdn_tables.max_chunks(96, 16) == 19
    other = _stage(inputs, "mixed" if name != "mixed" else "prefill").gdn_tables
    for field in ("counts", "chunk_row", "chunk_start", "first_chunk"):
        a, b = getattr(staged, field), getattr(other, field)
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape, field


def test_a_step_staged_without_the_tables_has_none():
    inputs = StepInputs(96, 16, 8, torch.device("cpu"), slots=1)
    assert _stage(inputs, "mixed", tables=False).gdn_tables is None


def test_max_chunks_bounds_every_step():
    """No step of T tokens in R rows has more chunks than max_chunks(T, R)."""
    rng = np.random.default_rng(0)
    for _ in range(500):
        rows = int(rng.integers(1, 40))
        lengths = rng.integers(1, 100, rows)
        chunk_row, _, _ = gdn_tables.chunk_tables(lengths, 0)
        assert len(chunk_row) <= gdn_tables.max_chunks(int(lengths.sum()), rows)


HK, HV, DK, DV, KW = 16, 16, 128, 128, 4  # 0.8b's Gated DeltaNet


def _layer_tensors(tokens: int) -> tuple:
    """A 0.8b Gated DeltaNet layer's inputs for `tokens` tokens: the projection's mixed [T, C]
    and a/b [T, Hv], the conv weight, the conv and state pools (10 slots), the two gates."""
    channels = 2 * HK * DK + HV * DV
    return (
        torch.zeros(tokens, channels, dtype=torch.bfloat16),
        torch.zeros(tokens, HV, dtype=torch.bfloat16),
        torch.zeros(channels, KW, dtype=torch.bfloat16),
        torch.zeros(10, channels, KW - 1, dtype=torch.bfloat16),
        torch.zeros(10, HV, DK, DV),
        (torch.zeros(HV), torch.zeros(HV)),
    )


def _launches(op, steps: list[str], bucket: int | None) -> list[list[tuple]]:
    """Per step, the op's recorded launches (engine/kernels/offline.py) as comparable tuples:
    kernel, grid, constexprs, and per argument its value, or for a tensor made outside the op
    (the step inputs' buffer, the caller's tensors) its address and dtype (a kernel gets a
    typed pointer), for one the op allocates its shape, strides and dtype: on a CPU it has no
    fixed address; under a CUDA graph it gets the captured one, if its size agrees."""
    offline = pytest.importorskip("engine.kernels.offline")
    inputs = StepInputs(96, 16, 8, torch.device("cpu"), slots=1)  # one host buffer: on a GPU
    # the device buffer is one whatever the host slots
    mixed, ab, weight, conv, state, gates = _layer_tensors(bucket or 96)
    outside = {t.untyped_storage().data_ptr() for t in (mixed, ab, weight, conv, state, *gates)}
    outside.add(inputs.hosts[0].untyped_storage().data_ptr())

    def described(value):
        if not isinstance(value, torch.Tensor):
            return value
        if value.untyped_storage().data_ptr() in outside:  # a kernel sees a typed pointer
            return ("at", value.data_ptr(), value.dtype)
        return ("new", tuple(value.shape), value.stride(), value.dtype)

    seen = []
    for name in steps:
        batch = _stage(inputs, name, bucket)
        launches: list = []
        with offline.recording(launches):
            op(mixed[: batch.host.cu_seqlens[-1]] if bucket is None else mixed, ab, weight, conv,
               state, gates, batch)  # fmt: skip
        seen.append([
            (launch.kernel.fn.__name__, launch.grid, launch.constexprs,
             tuple(described(arg) for arg in launch.args))
            for launch in launches
        ])  # fmt: skip
    return seen


def _fixed_grid_op(mixed, ab, weight, conv, state, gates, batch, split=SPLIT_DEFAULT):
    """CudaOps.linear_attention on a step that staged its tables."""
    from engine.kernels import triton_gdn

    qkv = triton_gdn.causal_conv(mixed, weight, conv, batch)
    triton_gdn.gated_delta_fixed_grid(qkv, ab, ab, *gates, state, batch, HK, DK, DV, split=split)


def _dispatch_op(mixed, ab, weight, conv, state, gates, batch):
    """The eager op of a prefill or mixed step (CudaOps.linear_attention, `triton_split`)."""
    from engine.kernels import triton_gdn

    qkv = triton_gdn.causal_conv(mixed, weight, conv, batch)
    args = (qkv, ab[: len(qkv)], ab[: len(qkv)], *gates, state, batch, HK, DK, DV)
    triton_gdn.gated_delta_prefill("triton_split", *args)


def _variants(op, steps: list[str]) -> dict[str, set]:
    """Per kernel, the Triton variants (offline.Launch.variant) its launches need over `steps`."""
    offline = pytest.importorskip("engine.kernels.offline")
    inputs = StepInputs(96, 16, 8, torch.device("cpu"), slots=1)
    mixed, ab, weight, conv, state, gates = _layer_tensors(96)
    variants: dict[str, set] = {}
    for name in steps:
        batch = _stage(inputs, name, bucket=None)
        launches: list = []
        with offline.recording(launches):
            op(mixed[: batch.host.cu_seqlens[-1]], ab, weight, conv, state, gates, batch)
        for launch in launches:
            variants.setdefault(launch.kernel.fn.__name__, set()).add(launch.variant)
    return variants


@pytest.mark.parametrize("kind", ["triton", "triton_split"])
def test_every_eager_step_shape_reuses_one_compiled_kernel(kind):
    """The eager prefill and mixed steps' launches are one Triton variant per kernel whatever
    the step's rows: a mixed step's first chunked row (0, 1, 3 leading decode rows here) is not
    specialised, and the split kernel's chunk tables start 16-byte aligned whatever their
    lengths. Else each step shape compiles the kernels anew (seconds each) inside a
    server's first minutes (as on the H200, where a first server ran at a few hundred tok/s)."""
    triton_gdn = pytest.importorskip("engine.kernels.triton_gdn")

    def op(mixed, ab, weight, conv, state, gates, batch):
        qkv = triton_gdn.causal_conv(mixed, weight, conv, batch)
        args = (qkv, ab[: len(qkv)], ab[: len(qkv)], *gates, state, batch, HK, DK, DV)
        triton_gdn.gated_delta_prefill(kind, *args)

    variants = _variants(op, ["mixed", "other-mixed", "prefill", "no-prefix"])
    chunked = {"triton": {"_gdn_chunked_kernel"}, "triton_split": {
        "_gdn_prepare_kernel", "_gdn_states_kernel", "_gdn_outputs_kernel"}}[kind]  # fmt: skip
    assert chunked | {"_conv_kernel", "_gdn_recurrent_kernel"} <= set(variants)
    for kernel, seen in variants.items():
        assert len(seen) == 1, (kernel, seen)


def test_one_graph_serves_every_step_of_a_bucket():
    """INVARIANTS 47: the fixed-grid op's launches for steps of different rows in one bucket
    have the same grids, the same non-tensor arguments, and their tensors at the same
    addresses (or, allocated by the op, of the same shapes): what a captured graph replays is
    right for each. The eager dispatch's launches differ from step to step (grids sized from
    the rows), which is why it is a split op."""
    names = ["mixed", "other-mixed", "prefill", "one-token-rows", "no-prefix"]
    fixed = _launches(_fixed_grid_op, names, bucket=96)
    assert [launch[0] for launch in fixed[0]] == [
        "_conv_kernel", "_conv_state_kernel", "_gdn_recurrent_kernel",
        "_gdn_prepare_kernel", "_gdn_states_kernel", "_gdn_outputs_kernel",
    ]  # fmt: skip
    for name, launches in zip(names[1:], fixed[1:], strict=True):
        assert launches == fixed[0], name
    # so too with fewer programs than the bucket's bound, striding (SplitConfig's fixed_*
    # counts), and the scores scratch
    split = SplitConfig(fixed_recurrent_rows=2, fixed_states_rows=1, fixed_chunks=4,
                        scores_in_prepare=True)  # fmt: skip
    strided = _launches(lambda *args: _fixed_grid_op(*args, split=split), names, bucket=96)
    assert [launch[1][0] for launch in strided[0][2:]] == [2, 4, 1, 4]  # the capped axes
    for name, launches in zip(names[1:], strided[1:], strict=True):
        assert launches == strided[0], name
    eager = _launches(_dispatch_op, ["mixed", "other-mixed"], bucket=None)
    assert eager[0] != eager[1]
    grids = [[launch[1] for launch in step] for step in eager]
    assert grids[0] != grids[1]


def test_the_piecewise_runner_captures_a_capturable_linear_attention_in_its_pieces():
    """Where the ops declare linear_attention capturable, attention alone ends a piece
    (`split_ops`), and the padded step through the pieces (the eager twin of a replay, on ops
    that run the torch reference's Gated DeltaNet on the bucket's tokens inside the piece)
    equals the plain step."""
    from engine.kernels.torch_ops import TORCH_OPS
    from engine.messages import AddRequest
    from engine.models import build_model
    from engine.worker.engine import Engine
    from engine.worker.piecewise import CapturedBody, split_ops, trace_body

    class CapturableTorchOps:
        linear_attention_capturable = True

        def __getattr__(self, name):
            return getattr(TORCH_OPS, name)

        def linear_attention(self, layer, mixed, a, b, conv_state, ssm_state, batch):
            real = int(batch.host.cu_seqlens[-1])  # the reference runs on the real tokens
            core = TORCH_OPS.linear_attention(
                layer, mixed[:real], a[:real], b[:real], conv_state, ssm_state, batch
            )
            return torch.cat([core, core.new_zeros((len(mixed) - real, *core.shape[1:]))])

    ops = CapturableTorchOps()
    assert split_ops(TORCH_OPS) == ("attention", "linear_attention")
    assert split_ops(ops) == ("attention",)
    config = replace(load_scenario("qwen35", "tiny").engine, kv_pages=256, max_rows=16)
    engine = Engine(build_model("qwen35", "tiny", 0, "float32", "cpu"), config)
    for rid, n in enumerate([5, 19, 11, 23]):
        prompt = [(5 * rid + j) % 4000 + 1 for j in range(n)]
        msg = AddRequest(rid, prompt, 8, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid  # the handle a worker's runtime would give
        if rid == 1:  # the first two decode, the others join them (a mixed step)
            while any(not r.prefill_done for r in engine.requests.values()):
                engine.step_finished(engine.launch(engine.scheduler.schedule()).to_host())
            engine.config = replace(engine.config, mixing=True)
            engine.scheduler.config = engine.config.parts.scheduler
    rows = engine.scheduler.schedule()
    assert [r.walk for r in rows] == ["decode", "decode", "prefill", "prefill"]
    cache = engine.cache
    tensors = (*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state)
    before = [t.clone() for t in tensors]
    with torch.inference_mode():
        plain = engine.model(engine.inputs.stage(rows, cache, TORCH_OPS), cache)
        for t, saved in zip(tensors, before, strict=True):
            t.copy_(saved)
        batch = engine.inputs.stage(rows, cache, ops, pad_tokens_to=64, gdn_tables=True)
        assert batch.gdn_tables.counts.tolist() == [0, 2, 4, 1 + 1]
        body = trace_body(engine.model, cache, ops, batch, 36, CapturedBody())
        padded = engine.model.logits_at(body.hidden, body.residual, batch.last_token_index, ops)
    assert {s.name for s in body.splits} == {"attention"}
    assert len(body.splits) == len(cache.k)
    torch.testing.assert_close(padded, plain, atol=1e-4, rtol=1e-4)


def test_piecewise_gdn_needs_the_piecewise_graphs():
    """Refused where the config is made (a bad arm fails before any server starts), the fix
    named."""
    with pytest.raises(ConfigError, match="it needs engine.piecewise_graphs: true"):
        replace(load_scenario("qwen35", "tiny").engine, piecewise_gdn=True, piecewise_graphs=False)

"""Our Triton decode attention's launch rules on the CPU (engine/kernels/decode_config.py): the
split count from the rows and heads alone, the launches by head dim; and, where triton is
installed (not in CI), the Triton decode path of FlashInferAttention on a stand-in FlashInfer
(tests/fake_flashinfer.py): decode steps plan no FlashInfer decode wrapper, other steps still
plan its prefill, and every step of a graph bucket launches the same kernels on the same grid
and addresses whatever its lengths (INVARIANTS 58).

What the kernels compute: tests/test_triton_interpret.py; on the GPU tests/test_gpu_kernels.py.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from engine.kernels.decode_config import (
    MAX_SPLITS,
    PROGRAMS_PER_SM,
    SHAPES,
    SMS,
    DecodeLaunch,
    decode_splits,
    launch_for,
    launch_sweep,
)
from engine.worker.graphs import BUCKETS
from tests import fake_flashinfer


def test_split_counts_of_the_served_models_at_each_graph_bucket():
    """The docstring's table: 0.8b (2 KV heads) and Orpheus 3b (8) on an H200's 132 SMs."""
    want = {
        "0.8b": [16, 16, 16, 16, 16, 16, 8, 8, 4, 4, 2, 2, 2, 1, 1],
        "3b": [16, 16, 16, 8, 4, 4, 2, 2, 1, 1, 1, 1, 1, 1, 1],
    }
    for model, (_, kv_heads, _) in SHAPES.items():
        assert [decode_splits(rows, kv_heads) for rows in BUCKETS] == want[model], model


def test_the_split_count_is_the_smallest_power_of_two_that_fills_the_sms():
    for sms in (80, 108, SMS):
        for kv_heads in (1, 2, 4, 8):
            for rows in range(1, 300):
                splits = decode_splits(rows, kv_heads, sms)
                assert splits & (splits - 1) == 0 and 1 <= splits <= MAX_SPLITS
                fills = rows * kv_heads * splits >= PROGRAMS_PER_SM * sms
                assert fills or splits == MAX_SPLITS, (rows, kv_heads, sms)
                half = rows * kv_heads * (splits // 2) >= PROGRAMS_PER_SM * sms
                assert splits == 1 or not half, (rows, kv_heads, sms)
    for bad in ((0, 2, SMS), (4, 0, SMS), (4, 2, 0)):
        with pytest.raises(ValueError, match="decode_splits"):
            decode_splits(*bad)


def test_launches_by_head_dim_and_their_sweep():
    assert launch_for(256) == DecodeLaunch(block_n=32, warps=4, stages=2)
    assert launch_for(128) == launch_for(64) == DecodeLaunch(block_n=64, warps=4, stages=2)
    for head_dim in (128, 256):
        sweep = launch_sweep(head_dim)
        assert sweep[0] == launch_for(head_dim) and len(set(sweep)) == len(sweep) == 8
        assert all(16 <= launch.block_n <= 128 for launch in sweep)
    for bad, message in (
        ({"block_n": 48}, "block_n must be a power of two"),
        ({"block_n": 8}, "block_n must be a power of two"),
        ({"block_n": 64, "warps": 3}, "warps must be"),
        ({"block_n": 64, "stages": 0}, "stages must be"),
    ):
        with pytest.raises(ValueError, match=message):
            DecodeLaunch(**bad)


# --- the Triton decode path of FlashInferAttention (needs triton, not a GPU) ------------------

Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, SINK = 6, 2, 32, 16, 60


@pytest.fixture
def fake(monkeypatch):
    module = fake_flashinfer.module()
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    return module


def _backend(decode_kernel: str):
    """The attention of a model of Q_HEADS over KV_HEADS on a CPU, its split count aimed at
    a GPU of 40 SMs (the H200's 132 give every step of these few rows 16 splits)."""
    pytest.importorskip("triton")
    from engine.kernels.flashinfer_attention import FlashInferAttention

    backend = FlashInferAttention(
        Q_HEADS, KV_HEADS, HEAD_DIM, PAGE, torch.bfloat16, "cpu", decode_kernel=decode_kernel
    )
    assert backend.sms == SMS  # no CUDA device: the H200's count
    backend.sms = 40
    return backend


def _stage(inputs, lengths: list[int], walk: str = "decode", bucket: int | None = None):
    """A step of rows whose cached lengths are `lengths` (decode: one new token each; prefill:
    the whole length new), as the step inputs stage it, padded to `bucket` rows."""
    rows = [
        SimpleNamespace(num_new=1 if walk == "decode" else n, walk=walk, request=SimpleNamespace(
            num_cached=n if walk == "decode" else 0, pages=list(range(12 * i, 12 * i + 12)),
            tokens=[1] * (n + 1), slot=i, rid=i,
        ))
        for i, n in enumerate(lengths)
    ]  # fmt: skip
    cache = SimpleNamespace(page_size=PAGE, sink_page=SINK, sink_slot=9)
    ops = SimpleNamespace(reads_page_table=False)
    return inputs.stage(rows, cache, ops, pad_to=bucket)


def _inputs(slots: int = 2):
    from engine.worker.step_inputs import StepInputs

    return StepInputs(512, 8, 12, torch.device("cpu"), slots=slots)


CACHE = torch.zeros(SINK + 1, PAGE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)


def _record_run(backend, q: torch.Tensor) -> list:
    """The Triton launches of one layer's `run` on the planned step (recorded, not run)."""
    from engine.kernels import offline

    launches: list = []
    with offline.recording(launches):
        backend.run(q, CACHE, CACHE, 0.3)
    return launches


def _q(rows: int) -> torch.Tensor:
    return torch.zeros(rows, Q_HEADS, HEAD_DIM, dtype=torch.bfloat16)


def test_triton_decode_plans_no_flashinfer_decode_and_prefill_still_does(fake):
    backend = _backend("triton")
    from engine.kernels.flashinfer_attention import TritonDecode

    assert [type(w).__name__ for w in fake.built] == ["BatchPrefillWithPagedKVCacheWrapper"] * 2
    backend.add_graph_bucket(8, 12)
    assert backend.graph_decode == {} and len(fake.built) == 2  # no decode wrapper, ever
    inputs = _inputs()
    slots = []
    for lengths, bucket, want_splits in (([40, 3], None, 16), ([40, 3, 150], 8, 8), ([17], 8, 8)):
        batch = _stage(inputs, lengths, bucket=bucket)
        slots.append(backend.plan(batch, bucket))
        plan = backend._active
        assert isinstance(plan, TritonDecode)
        assert plan.kv_indptr is batch.kv_indptr and plan.kv_indices is batch.kv_indices
        assert plan.kv_last_page_len is batch.kv_last_page_len
        assert plan.splits == decode_splits(batch.num_rows, KV_HEADS, 40) == want_splits
        launches = _record_run(backend, _q(batch.num_rows))
        assert [launch.kernel.fn.__name__ for launch in launches] == [
            "_decode_kernel", "_merge_kernel"
        ]  # fmt: skip
        assert launches[0].grid == (batch.num_rows, KV_HEADS, plan.splits)
    assert slots == [0, 1, 0]  # the slots still alternate (graphs keyed by bucket and slot)
    prefill = _stage(inputs, [40, 3], walk="prefill")
    assert backend.plan(prefill) == 1
    assert backend._active is backend.prefill[1] and backend.prefill[1].plans == 1
    assert _record_run(backend, _q(43)) == [] and backend.prefill[1].runs == 1
    assert all(w.plans == 0 for w in fake.built if w is not backend.prefill[1])


def test_flashinfer_decode_still_plans_its_wrappers(fake):
    backend = _backend("flashinfer")
    names = [type(w).__name__ for w in fake.built]
    assert names.count("BatchDecodeWithPagedKVCacheWrapper") == 2
    backend.add_graph_bucket(8, 12)
    assert set(backend.graph_decode) == {(8, 0), (8, 1)}
    assert backend.graph_decode[8, 0].options["use_cuda_graph"] is True
    batch = _stage(_inputs(), [40, 3], bucket=8)
    assert backend.plan(batch, 8) == 0
    assert backend._active is backend.graph_decode[8, 0] and backend._active.plans == 1
    assert _record_run(backend, _q(8)) == [] and backend._active.runs == 1


def test_every_step_of_a_bucket_launches_one_grid_on_the_same_addresses(fake):
    """INVARIANTS 58: two decode steps padded to one bucket, of other row counts, lengths and
    pages, plan the same split count and launch the same kernels on the same grid with the
    same arguments: the step inputs' views (and q, the caches) at the same addresses, the
    outputs and partials (allocated in the call, from a graph's pool when captured) of the
    same shapes. Any per-step value is read on the device."""
    backend = _backend("triton")
    inputs = _inputs(slots=1)  # one buffer, as the device side of the step inputs is
    q = _q(8)
    runs = []
    for lengths in ([150, 150, 150], [1]):  # 35 pages and 8 (a rule by pages would differ)
        backend.plan(_stage(inputs, lengths, bucket=8), 8)
        runs.append(_record_run(backend, q))
    first, second = runs
    assert len(first) == len(second) == 2
    for a, b in zip(first, second, strict=True):
        assert (a.kernel, a.grid, a.constexprs, a.options) == (b.kernel, b.grid, b.constexprs,
                                                               b.options)  # fmt: skip
        allocated = (6, 7, 8) if a.kernel.fn.__name__ == "_decode_kernel" else (0, 1, 2)
        for i, (x, y) in enumerate(zip(a.args, b.args, strict=True)):
            if isinstance(x, torch.Tensor) and i in allocated:
                assert (x.shape, x.dtype) == (y.shape, y.dtype), (a.kernel, i)
            elif isinstance(x, torch.Tensor):
                assert x.data_ptr() == y.data_ptr(), (a.kernel, i)
            else:
                assert x == y, (a.kernel, i)

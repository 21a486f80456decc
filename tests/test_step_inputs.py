"""Staged step inputs: one buffer, fixed field addresses, and decode steps padded to a graph
bucket whose padding rows touch only the cache's sink page and sink slot (INVARIANTS 25)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import replace

import pytest
import torch

from engine.messages import AddRequest
from engine.models import build_model
from engine.worker.engine import Engine
from engine.worker.graphs import buckets_up_to, gc_paused
from harness.scenario import load_scenario


def _engine_with_requests(lengths: list[int], **settings) -> Engine:
    """A tiny CPU engine holding one greedy request per prompt length, none run yet;
    `settings` over the scenario's engine."""
    config = replace(load_scenario("qwen35", "tiny").engine, kv_pages=256, max_rows=16, **settings)
    engine = Engine(build_model("qwen35", "tiny", 0, "float32", "cpu"), config)
    for rid, n in enumerate(lengths):
        prompt = [(5 * rid + j) % 4000 + 1 for j in range(n)]
        msg = AddRequest(rid, prompt, 8, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid  # the handle a worker's runtime would give
    return engine


def _engine_after_prefill(lengths: list[int], **settings) -> Engine:
    engine = _engine_with_requests(lengths, **settings)
    while any(not r.prefill_done for r in engine.requests.values()):
        engine.step_finished(engine.launch(engine.scheduler.schedule()).to_host())
    return engine


def test_padded_decode_rows_equal_the_unpadded_step_and_touch_only_the_sinks():
    engine = _engine_after_prefill([5, 19, 33])
    rows = engine.scheduler.schedule()
    assert [r.walk for r in rows] == ["decode"] * 3
    cache = engine.cache
    before = [t.clone() for t in (*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state)]

    def run(pad_to):
        for t, saved in zip(
            (*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state), before, strict=True
        ):
            t.copy_(saved)
        batch = engine.inputs.stage(rows, cache, engine.ops, pad_to=pad_to)
        with torch.inference_mode():
            logits = engine.model(batch, cache)
        return logits, [
            t.clone() for t in (*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state)
        ]

    plain, plain_cache = run(None)
    padded, padded_cache = run(8)
    assert padded.shape[0] == 8
    # Equal up to GEMM blocking (a different row count may sum in another order).
    close = {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(padded[:3], plain, **close)
    kv, states = len(cache.k) * 2, padded_cache[len(cache.k) * 2 :]
    for a, b in zip(plain_cache[:kv], padded_cache[:kv], strict=True):
        torch.testing.assert_close(a, b, **close)  # every page, the sink page too: no write
        assert not b[cache.sink_page].any()
    for a, b in zip(plain_cache[kv:], states, strict=True):  # only the sink slot may change
        torch.testing.assert_close(a[: cache.sink_slot], b[: cache.sink_slot], **close)


def test_fixed_addresses_for_a_bucket():
    """The same field at the same address each time its slot comes round (on CUDA the device
    twin is one buffer: always the same address)."""
    engine = _engine_after_prefill([4, 9])
    rows = engine.scheduler.schedule()
    first = engine.inputs.stage(rows, engine.cache, engine.ops, pad_to=4)
    other = engine.inputs.stage(rows, engine.cache, engine.ops, pad_to=4)
    assert other.input_ids.data_ptr() != first.input_ids.data_ptr()  # two host slots in turn
    second = engine.inputs.stage(rows[:1], engine.cache, engine.ops, pad_to=4)
    for name in ("input_ids", "positions", "slot_mapping", "state_slots", "last_index"):
        a, b = getattr(first, name), getattr(second, name)
        assert a.data_ptr() == b.data_ptr() and a.shape == b.shape, name
    assert second.slot_mapping[1:].tolist() == [-1, -1, -1]  # padding stores no K/V
    assert second.state_slots[1:].tolist() == [engine.cache.sink_slot] * 3


def test_graph_buckets():
    assert buckets_up_to(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert buckets_up_to(100)[-3:] == [64, 96, 100]
    assert buckets_up_to(400)[-4:] == [256, 320, 384, 400]
    assert buckets_up_to(1) == [1]


def _generate(engine: Engine, overlapped: bool, steps: int) -> dict[int, list[int]]:
    """Drive the engine as the worker's loops do: strict (launch, wait, finish) or overlapped
    (launch N+1 fed from N on the device, then finish N)."""
    in_flight = None
    for _ in range(steps):
        rows = engine.scheduler.schedule()
        if overlapped:
            launched = engine.launch(rows, feed=in_flight)
            if in_flight is not None:
                engine.step_finished(in_flight.to_host())
            in_flight = launched
        else:
            engine.step_finished(engine.launch(rows).to_host())
    if in_flight is not None:
        engine.step_finished(in_flight.to_host())
    return {rid: r.tokens[len(r.prompt) :] for rid, r in engine.requests.items()}


def test_a_step_fed_on_the_device_gives_the_tokens_of_the_strict_loop():
    """Steps launched before the previous step's tokens reached the host read those tokens
    on the device (feed indices) and produce exactly the strict loop's tokens, through
    prefill, the first decode step after it and plain decode."""
    lengths = [3, 21, 40, 7]
    strict = _generate(_engine_with_requests(lengths), overlapped=False, steps=6)
    fed = _generate(_engine_with_requests(lengths), overlapped=True, steps=6)
    assert fed == strict and all(len(t) == 6 for t in strict.values())


def test_a_step_padded_to_a_token_bucket_through_the_split_ops_equals_the_plain_step():
    """The piecewise runner's protocol without graphs (engine/worker/piecewise.py): a mixed
    step (decode rows and prompt chunks) staged with its tokens padded to a bucket, its body
    run with the attention and Gated DeltaNet ops on the real tokens alone, gives the plain
    step's logits and cache; the padding tokens store no K/V and touch no state slot."""
    from engine.kernels.torch_ops import TORCH_OPS
    from engine.worker.piecewise import CapturedBody, token_buckets_up_to, trace_body

    engine = _engine_after_prefill([5, 19])
    for rid, n in ((7, 11), (8, 23)):  # two prompts join the two decoding rows
        prompt = [(3 * rid + j) % 4000 + 1 for j in range(n)]
        msg = AddRequest(rid, prompt, 8, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid
    engine.config = replace(engine.config, mixing=True)
    engine.scheduler.config = engine.config.parts.scheduler
    rows = engine.scheduler.schedule()
    assert [r.walk for r in rows] == ["decode", "decode", "prefill", "prefill"]
    tokens = sum(r.num_new for r in rows)
    bucket = next(b for b in token_buckets_up_to(64) if b >= tokens)
    assert (tokens, bucket) == (36, 64)
    cache = engine.cache
    tensors = (*cache.k, *cache.v, *cache.conv_state, *cache.ssm_state)
    before = [t.clone() for t in tensors]

    def restore():
        for t, saved in zip(tensors, before, strict=True):
            t.copy_(saved)

    with torch.inference_mode():
        plain = engine.model(engine.inputs.stage(rows, cache, TORCH_OPS), cache)
        plain_cache = [t.clone() for t in tensors]
        restore()
        batch = engine.inputs.stage(rows, cache, TORCH_OPS, pad_tokens_to=bucket)
        assert batch.input_ids.shape[0] == bucket and batch.num_rows == 4
        assert batch.slot_mapping[tokens:].eq(-1).all() and batch.positions[tokens:].eq(0).all()
        body = trace_body(engine.model, cache, TORCH_OPS, batch, tokens, CapturedBody())
        assert [s.name for s in body.splits].count("attention") == len(cache.k)
        assert len(body.splits) == len(engine.model.model.layers)
        padded = engine.model.logits_at(
            body.hidden, body.residual, batch.last_token_index, TORCH_OPS
        )
    close = {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(padded, plain, **close)
    for a, b in zip(plain_cache, tensors, strict=True):
        torch.testing.assert_close(b, a, **close)


def test_graph_capture_pauses_the_garbage_collector_and_collects_first():
    """INVARIANTS 45: the runners capture inside gc_paused(): a cycle already dead is collected
    on entry (before any capture begins), no automatic collection runs inside, and the
    collector's state is restored on the way out, an exception included."""

    class Node:
        pass

    def dead_cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return weakref.ref(a)

    assert gc.isenabled()
    before = dead_cycle()
    with gc_paused():
        assert before() is None  # collected on entry
        assert not gc.isenabled()
        inside = dead_cycle()
        for _ in range(20_000):  # enough allocations to trigger a generation-0 collection
            Node().other = Node()
        assert inside() is not None  # the collector stayed off
    assert gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()


@pytest.mark.parametrize("pad_to", [None, 8])
def test_the_host_layout_carries_the_longest_row_flashinfer_would_find(pad_to):
    """FlashInfer's prefill plan gets the longest row's new tokens from the staging (so it
    does not loop over tensors to find them): what its own loop over the host layout finds,
    padding rows (1 new token) included; and each row's KV length (its `seq_lens`, staged so
    that it is no pageable tensor of the plan's own): what its `get_seq_lens` derives from
    the layout, each real row's cached plus new tokens."""
    engine = _engine_after_prefill([5, 19], mixing=True)
    for rid, n in ((2, 7), (3, 3)):  # two prompts beside the two decode rows: a mixed step
        prompt = [rid + j + 1 for j in range(n)]
        msg = AddRequest(rid, prompt, 8, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = rid
    rows = engine.scheduler.schedule()
    assert [r.walk for r in rows] == ["decode", "decode", "prefill", "prefill"]
    batch = engine.inputs.stage(rows, engine.cache, engine.ops, pad_to=pad_to)
    host = batch.host
    q_lens = (host.qo_indptr[1:] - host.qo_indptr[:-1]).tolist()
    assert host.max_q_len == max(q_lens) == 7
    pages = host.kv_indptr[1:] - host.kv_indptr[:-1]  # flashinfer.get_seq_lens, written out
    derived = (pages - 1).clamp(min=0) * engine.cache.page_size + host.kv_last_page_len
    assert host.kv_lens.tolist() == derived.tolist()
    assert host.kv_lens.tolist()[:4] == [r.request.num_cached + r.num_new for r in rows]


def test_pack_into_copies_each_array_end_to_end_and_keeps_none():
    """engine.staging.pack_into (FlashInfer's plans' own copy of the host layout under their
    fence, engine.split_mixed): views of the buffer equal to the arrays, laid end to end; a
    later write to the sources leaves the copies as they were."""
    from engine.staging import pack_into

    buffer = torch.full((16,), -1, dtype=torch.int32)
    a, b = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([7, 9], dtype=torch.int32)
    got = pack_into(buffer, [a, None, b])
    assert got[1] is None and got[0].tolist() == [0, 3, 5] and got[2].tolist() == [7, 9]
    assert buffer[:5].tolist() == [0, 3, 5, 7, 9] and buffer[5:].eq(-1).all()
    a[0] = 42
    assert got[0].tolist() == [0, 3, 5]

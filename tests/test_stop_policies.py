"""INVARIANTS 2: for every declared policy, the runtime's decision equals the model's own
check_stop on the same rows (randomised batches: ignore_eos on/off, EOS on the last allowed
step, max_tokens 1, caps reached exactly)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.models import ARCHITECTURES
from engine.models.qwen35_node import DECODE_LOOP, Qwen35Node
from engine.runtime.graph import GraphSpec, StopRows
from engine.runtime.runtime import GraphRuntime
from engine.runtime.stops import StopKind, StopLimits, StopPolicy, gather_columns

EOS = [7, 9]
VOCAB = 12


@st.composite
def decode_batches(draw):
    rows = draw(st.integers(1, 40))
    max_tokens = draw(st.lists(st.integers(1, 6), min_size=rows, max_size=rows))
    # output count after this step: anywhere from 2 (first decode) to max_tokens, and the
    # boundary (== max_tokens) is drawn often
    counts = [
        draw(st.sampled_from([m, max(2, m), draw(st.integers(2, max(2, m)))])) for m in max_tokens
    ]
    tokens = draw(st.lists(st.sampled_from([*EOS, 0, 1, 2, 11]), min_size=rows, max_size=rows))
    ignore = draw(st.lists(st.booleans(), min_size=rows, max_size=rows))
    return max_tokens, counts, tokens, ignore


def _runtime_decision(node, max_tokens, counts, tokens, ignore):
    rt = GraphRuntime(node.graph, capacity=4)  # small: adding rows exercises growth
    for walk in node.graph.walks:
        rt.declare_stop_policies(walk, node.get_stop_policies(walk))
    handles = []
    for rid, (m, c, ig) in enumerate(zip(max_tokens, counts, ignore, strict=True)):
        h = rt.add_request(rid)
        for walk, limits in node.stop_limits(m, ig).items():
            rt.register_limits(h, walk, limits)
        rt.iters[DECODE_LOOP][h] = c - 1  # decode iterations so far = outputs - prefill's one
        handles.append(h)
    return rt.check_stops("decode", np.array(handles), np.array(tokens, dtype=np.int64))


@settings(max_examples=300, deadline=None)
@given(decode_batches(), st.sampled_from([StopKind.EOS, StopKind.AR]))
def test_declared_policy_equals_check_stop(batch, kind):
    max_tokens, counts, tokens, ignore = batch
    node = Qwen35Node(EOS, policy_kind=kind)
    stopped, by_token, missed = _runtime_decision(node, max_tokens, counts, tokens, ignore)
    rows = StopRows.of(
        range(len(tokens)), ["decode"] * len(tokens), tokens, counts, max_tokens, ignore
    )
    model = node.check_stop(rows)
    assert missed is None
    np.testing.assert_array_equal(stopped, model.stopped)
    np.testing.assert_array_equal(by_token, model.by_token)
    # the same policy over limits gathered row by row (rows of different stop-list widths)
    limits = [node.stop_limits(m, ig)["decode"] for m, ig in zip(max_tokens, ignore, strict=True)]
    cols = gather_columns(limits, np.array(counts) - 1)
    direct, direct_tok = node.get_stop_policies("decode")[DECODE_LOOP].stops(np.array(tokens), cols)
    if kind is StopKind.EOS:  # the loop's cap is the runtime's to enforce
        direct = direct | (cols.counts >= cols.caps)
    np.testing.assert_array_equal(direct, model.stopped)
    np.testing.assert_array_equal(direct_tok, model.by_token)


def test_every_registered_model_declares_a_checkable_policy():
    for arch, entry in ARCHITECTURES.items():
        node = entry.node(EOS)
        declared = [w for w in node.graph.walks if node.get_stop_policies(w)]
        assert declared, f"{arch} declares no stop policy"


@given(st.integers(1, 5), st.booleans(), st.sampled_from(EOS + [0, 3]))
def test_prefill_check_stop_ends_partition(max_tokens, ignore, token):
    """max_tokens 1: the prefill's token is the only one; an EOS at prefill ends the reply."""
    node = Qwen35Node(EOS)
    check = node.check_stop(StopRows.of([0], ["prefill"], [token], [1], [max_tokens], [ignore]))
    expect = max_tokens == 1 or (token in EOS and not ignore)
    assert bool(check.stopped[0]) == expect
    assert bool(check.end_partition[0]) == expect


def test_policy_kinds_on_known_rows():
    limits = [StopLimits(3, (7,), False), StopLimits(3, (7,), True), StopLimits(5, (7,), False)]
    cols = gather_columns(limits, np.array([3, 3, 2]))
    tokens = np.array([1, 7, 7])
    ar, ar_tok = StopPolicy(StopKind.AR).stops(tokens, cols)
    assert ar.tolist() == [True, True, True] and ar_tok.tolist() == [False, False, True]
    it, _ = StopPolicy(StopKind.ITER).stops(tokens, cols)
    assert it.tolist() == [True, True, False]
    eos, _ = StopPolicy(StopKind.EOS).stops(tokens, cols)
    assert eos.tolist() == [False, False, True]


def test_policy_for_a_loop_the_walk_does_not_run_is_refused():
    rt = GraphRuntime(GraphSpec("n", ("prefill", "decode"), {"decode_loop": "decode"}), 2)
    try:
        rt.declare_stop_policies("prefill", {"decode_loop": StopPolicy(StopKind.AR)})
    except ValueError as exc:
        assert "decode_loop" in str(exc)
    else:
        raise AssertionError("accepted a policy for the wrong walk")

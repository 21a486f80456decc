"""Sampling: greedy and filtered draws, seeded reproducibility, the returned log-probs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.layers.sampler import (
    GREEDY_BELOW,
    MIN_TOP_P,
    SamplingParams,
    effective_temperature,
    effective_top_p,
    sample,
    scale_logits,
)

VOCAB = 50


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax_with_its_logprob():
    logits = _logits(6)
    tokens, logprobs = sample(logits, [SamplingParams(temperature=0)] * 6, [0] * 6)
    assert torch.equal(tokens, logits.argmax(-1))
    expected = torch.log_softmax(logits, -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected)
    assert tokens.dtype == torch.int64 and logprobs.dtype == torch.float32


def test_top_k_one_is_argmax():
    logits = _logits(4, seed=1)
    tokens, _ = sample(logits, [SamplingParams(temperature=1.5, top_k=1)] * 4, [0] * 4)
    assert torch.equal(tokens, logits.argmax(-1))


def test_tiny_top_p_keeps_only_the_top_token():
    logits = _logits(3, seed=2)
    for seed in (None, 5):
        params = [SamplingParams(temperature=2.0, top_p=1e-6, seed=seed)] * 3
        for step in range(20):
            tokens, _ = sample(logits, params, [step] * 3)
            assert torch.equal(tokens, logits.argmax(-1))


def test_top_k_draws_only_from_the_k_best():
    logits = _logits(1, seed=3).expand(400, VOCAB)
    tokens, _ = sample(logits, [SamplingParams(temperature=5.0, top_k=3)] * 400, [0] * 400)
    best = set(logits[0].topk(3).indices.tolist())
    assert set(tokens.tolist()) <= best and len(set(tokens.tolist())) > 1


def test_seeded_rows_reproducible_and_independent_of_the_batch():
    logits = _logits(5, seed=4)
    seeded = SamplingParams(temperature=1.0, top_p=0.9, top_k=20, seed=1234)
    alone = [sample(logits[2:3], [seeded], [i])[0].item() for i in range(30)]
    others = [SamplingParams(), SamplingParams(temperature=0), SamplingParams(seed=9, top_k=5)]
    for i in range(30):
        params = [others[0], others[1], seeded, others[2], SamplingParams(temperature=0.7)]
        tokens, _ = sample(logits, params, [7, 3, i, 11, 0])
        assert tokens[2].item() == alone[i]
    assert len(set(alone)) > 1  # the output index moves the draw on


def test_logprob_is_under_the_temperature_scaled_unfiltered_distribution():
    logits = _logits(4, seed=5)
    params = [SamplingParams(temperature=t, top_k=10, top_p=0.8, seed=s) for t, s in
              [(0.5, 1), (1.0, None), (2.0, 2), (1.3, None)]]  # fmt: skip
    tokens, logprobs = sample(logits, params, [0, 1, 2, 3])
    temps = torch.tensor([p.temperature for p in params])[:, None]
    expected = torch.log_softmax(logits / temps, -1).gather(1, tokens[:, None])[:, 0]
    torch.testing.assert_close(logprobs, expected)


@pytest.mark.parametrize(
    "bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)]
)
def test_invalid_params_are_refused(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


# --- every value validation admits samples safely (RELIABILITY 2, INVARIANTS 19) -----------

F32_MAX = torch.finfo(torch.float32).max
EXTREMES = [0.0, -0.0, F32_MAX, -F32_MAX, float("inf"), float("-inf"), float("nan"), 1e-45, -1e30]


def _usable(logits: torch.Tensor) -> torch.Tensor:
    """The logits a sampler reads: nan is never drawn, +inf counts as float32's largest."""
    return torch.nan_to_num(logits, nan=float("-inf"), posinf=F32_MAX, neginf=float("-inf"))


@st.composite
def extreme_logits(draw, max_rows: int = 4) -> torch.Tensor:
    rows, vocab = draw(st.integers(1, max_rows)), draw(st.integers(1, 40))
    values = st.one_of(
        st.sampled_from(EXTREMES),
        st.floats(width=32, allow_nan=True, allow_infinity=True),
        st.floats(-20, 20, width=32),
    )
    flat = draw(st.lists(values, min_size=rows * vocab, max_size=rows * vocab))
    return torch.tensor(flat, dtype=torch.float32).reshape(rows, vocab)


temperatures = st.one_of(
    st.sampled_from([0.0, 1e-40, 5e-324, GREEDY_BELOW, 1.0, 1e300, float("inf")]),
    st.floats(min_value=0, allow_infinity=True),
    st.floats(0, 10),
)
top_ps = st.one_of(
    st.sampled_from([5e-324, 1e-300, 1e-45, MIN_TOP_P, 1.0, 1 - 1e-16]),
    st.floats(0, 1, exclude_min=True),
)
sampling_params = st.builds(
    SamplingParams,
    temperature=temperatures,
    top_p=top_ps,
    top_k=st.one_of(st.integers(0, 50), st.integers(0, 2**31 - 1)),
    seed=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    logprobs=st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(st.data(), extreme_logits())
def test_any_admitted_value_samples_a_usable_token(data, logits):
    """Whatever the temperature, top_p, top_k, seed and logits (extremes, inf, nan): no error,
    a token of the vocabulary, never a masked (-inf or nan) one while another is left, never
    outside the row's top k, and a finite log-prob <= 0."""
    rows, vocab = logits.shape
    params = data.draw(st.lists(sampling_params, min_size=rows, max_size=rows))
    index = data.draw(st.lists(st.integers(0, 10_000), min_size=rows, max_size=rows))
    tokens, logprobs = sample(logits, params, index)
    assert tokens.dtype == torch.int64 and logprobs.dtype == torch.float32
    assert ((tokens >= 0) & (tokens < vocab)).all()
    assert torch.isfinite(logprobs).all() and (logprobs <= 0).all()
    usable = _usable(logits)
    for row, (token, p) in enumerate(zip(tokens.tolist(), params, strict=True)):
        if (usable[row] > float("-inf")).any():
            assert usable[row, token] > float("-inf")
        if p.top_k:  # ranked as the sampler sees them: at 1e38, logits 0 and 1 scale alike
            temperature = torch.tensor([effective_temperature(p.temperature) or 1.0])
            scaled = scale_logits(logits[row : row + 1], temperature)[0]
            assert (scaled > scaled[token]).sum() < p.top_k


@settings(max_examples=200, deadline=None)
@given(extreme_logits(), st.floats(0, GREEDY_BELOW, exclude_max=True), top_ps)
def test_a_tiny_temperature_is_greedy(logits, temperature, top_p):
    rows = logits.shape[0]
    params = [SamplingParams(temperature=temperature, top_p=top_p, seed=r) for r in range(rows)]
    assert effective_temperature(temperature) == 0 and all(p.greedy for p in params)
    tokens, _ = sample(logits, params, [0] * rows)
    assert torch.equal(tokens, _usable(logits).argmax(-1))


@settings(max_examples=200, deadline=None)
@given(extreme_logits(), st.floats(GREEDY_BELOW, 1e6), st.floats(0, 1e-6, exclude_min=True))
def test_a_tiny_top_p_keeps_the_top_token(logits, temperature, top_p):
    """top_p under 1/vocab keeps just the best token after scaling (the first of equals)."""
    rows = logits.shape[0]
    params = [SamplingParams(temperature=temperature, top_p=top_p) for _ in range(rows)]
    tokens, _ = sample(logits, params, [0] * rows)
    scaled = scale_logits(logits, torch.full((rows,), effective_temperature(temperature)))
    assert torch.equal(tokens, scaled.argmax(-1))


@settings(max_examples=200, deadline=None)
@given(extreme_logits(), temperatures.filter(lambda t: t >= GREEDY_BELOW))
def test_scaling_never_makes_nan_and_keeps_the_order(logits, temperature):
    rows = logits.shape[0]
    scaled = scale_logits(logits, torch.full((rows,), effective_temperature(temperature)))
    assert not scaled.isnan().any() and (scaled <= 0).all()
    assert (scaled.amax(-1) == 0).all()  # the best token of each row scales to exactly 0
    usable = _usable(logits)
    for row in range(rows):
        better = usable[row][:, None] > usable[row][None, :]
        assert (scaled[row][:, None] >= scaled[row][None, :])[better].all()
        assert (scaled[row][usable[row] == float("-inf")] == float("-inf")).all() or (
            usable[row] == float("-inf")
        ).all()


@settings(max_examples=60, deadline=None)
@given(st.data(), extreme_logits(max_rows=5))
def test_a_seeded_row_draws_the_same_token_in_any_batch(data, logits):
    rows = logits.shape[0]
    params = data.draw(st.lists(sampling_params, min_size=rows, max_size=rows))
    index = data.draw(st.lists(st.integers(0, 10_000), min_size=rows, max_size=rows))
    batched, _ = sample(logits, params, index)
    for row, p in enumerate(params):
        if p.seed is not None:
            alone, _ = sample(logits[row : row + 1], [p], [index[row]])
            assert alone.item() == batched[row].item()


def test_effective_values_are_what_every_sampler_applies():
    assert effective_temperature(0.0) == effective_temperature(1e-40) == 0.0
    assert effective_temperature(GREEDY_BELOW) == GREEDY_BELOW
    assert effective_temperature(float("inf")) == F32_MAX
    assert effective_top_p(1e-300) == MIN_TOP_P > 0 and torch.tensor(MIN_TOP_P).item() > 0
    assert effective_top_p(0.5) == 0.5


def test_greedy_ties_go_to_the_first_maximum_as_the_decode_graphs_argmax():
    """A decode graph's greedy step takes `ops.argmax`, the first maximum (ties planted in
    tests/test_triton_interpret.py); a greedy row that asks for log-probs goes through the
    sampler instead (Engine.launch), which must choose the same token."""
    from engine.kernels.torch_ops import TORCH_OPS

    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0], [5.0, -1.0, 5.0, 5.0]])
    tokens, _ = sample(logits, [SamplingParams(temperature=0, logprobs=True)] * 2, [0, 0])
    assert tokens.tolist() == [1, 0] == TORCH_OPS.argmax(logits).tolist()

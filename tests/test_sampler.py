"""Sampling: greedy and filtered draws, seeded reproducibility, the returned log-probs."""

from __future__ import annotations

import pytest
import torch

from engine.layers.sampler import SamplingParams, sample

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

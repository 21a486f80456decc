"""Token sampling on the GPU with FlashInfer's kernels, with the CPU sampler's semantics
(engine/layers/sampler.py) and its safety rules (`effective_temperature`, `effective_top_p`,
`scale_logits`: every admitted value samples without overflow or nan): greedy rows take the
argmax; other rows are scaled by their own temperature and drawn after top-k / top-p;
log-probs are log_softmax(logits / temperature) at the chosen token over the whole
vocabulary, computed only when a row asks.

Randomness: FlashInfer's Philox stream depends on a row's index in the call, so a seeded row
is drawn in a call of its own, from a seed derived from (seed, output index) as on the CPU:
its tokens do not depend on the batch. Unseeded rows share one call and a per-process
generator. (The GPU and CPU streams differ: a seed reproduces a row on the same device.)
"""

from __future__ import annotations

import numpy as np
import torch

from engine.kernels import flashinfer_import
from engine.layers.sampler import (
    SamplingParams,
    effective_top_p,
    row_seed,
    row_temperatures,
    rows_to,
    scale_logits,
)

_unseeded = np.random.default_rng()


def _draw(scaled: torch.Tensor, params: list[SamplingParams], seed: int) -> torch.Tensor:
    flashinfer = flashinfer_import.flashinfer()
    if all(p.top_k == 0 and p.top_p >= 1.0 for p in params):
        return flashinfer.sampling.sampling_from_logits(scaled, seed=seed, offset=0)
    device, vocab = scaled.device, scaled.shape[-1]
    top_k = rows_to([p.top_k or vocab for p in params], torch.int32, device)
    top_p = rows_to([effective_top_p(p.top_p) for p in params], torch.float32, device)
    return flashinfer.sampling.top_k_top_p_sampling_from_logits(
        scaled, top_k, top_p, seed=seed, offset=0
    )


def sample_on_gpu(
    logits: torch.Tensor, params: list[SamplingParams], output_index: list[int]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [R, V] fp32 on the GPU -> (tokens [R] int64, log-probs [R] fp32 or None)."""
    tokens = logits.argmax(-1)
    if all(p.greedy and not p.logprobs for p in params):
        return tokens, None  # the common case: no temperature tensor, no extra kernels
    scaled = scale_logits(logits, row_temperatures(params, logits.device))
    if not all(p.greedy for p in params):
        shared = [i for i, p in enumerate(params) if not p.greedy and p.seed is None]
        if shared:
            rows = rows_to(shared, torch.int64, logits.device)
            drawn = _draw(scaled[rows], [params[i] for i in shared], int(_unseeded.integers(2**62)))
            tokens[rows] = drawn.long()
        for i, p in enumerate(params):
            if not p.greedy and p.seed is not None:
                tokens[i] = _draw(scaled[i : i + 1], [p], row_seed(p.seed, output_index[i]))[0]
    if not any(p.logprobs for p in params):
        return tokens, None
    logprobs = torch.log_softmax(scaled, dim=-1).gather(1, tokens[:, None])[:, 0]
    return tokens, logprobs

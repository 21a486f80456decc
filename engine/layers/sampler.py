"""Token sampling from a step's logits: greedy, or temperature + top-k + top-p then a draw.

Log-probs: the returned log-prob of a row is log_softmax(logits / temperature) at the chosen
token, over the whole vocabulary (before top-k/top-p filtering), with temperature 1 for greedy
rows. That is the distribution the request asked to sample from, comparable across requests
whatever their filters; the filtered (renormalised) value would read 0 for every top_k=1 row.

Reproducibility: a row with a seed draws from its own generator seeded from (seed, output
index) and is filtered alone, so its tokens do not depend on what else is in the batch. Rows
without a seed share torch's process-wide generator.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep the smallest set of top tokens whose mass reaches top_p
    top_k: int = 0  # keep the k most likely tokens; 0 = no limit
    seed: int | None = None
    logprobs: bool = False  # the caller returns the log-prob of each token to the client

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def row_seed(seed: int, output_index: int) -> int:
    """The seed of one seeded row at one output position; stable across processes."""
    return zlib.crc32(f"{seed}:{output_index}".encode())


def row_generator(seed: int, output_index: int, device: torch.device) -> torch.Generator:
    """The generator of one seeded row at one output position."""
    return torch.Generator(device=device).manual_seed(row_seed(seed, output_index))


def _draw(logits: torch.Tensor, params: list[SamplingParams], generator=None) -> torch.Tensor:
    """Sample one token per row of logits [n, V] after temperature, top-k and top-p."""
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    scaled = logits / temps[:, None]
    if all(p.top_k == 0 and p.top_p == 1.0 for p in params):
        return torch.multinomial(scaled.softmax(-1), 1, generator=generator)[:, 0]
    vocab = logits.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    top_k = torch.tensor([p.top_k or vocab for p in params], device=logits.device)
    ranks = torch.arange(vocab, device=logits.device)
    probs = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf")).softmax(-1)
    top_p = torch.tensor([p.top_p for p in params], device=logits.device)
    # Mass of the strictly better tokens: the top token (0) always stays.
    probs = probs.masked_fill(probs.cumsum(-1) - probs >= top_p[:, None], 0.0)
    picked = torch.multinomial(probs, 1, generator=generator)
    return order.gather(1, picked)[:, 0]


def sample(
    logits: torch.Tensor, params: list[SamplingParams], output_index: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [R, V]; params and output_index (the token's index in the row's output) per row.
    Returns (tokens [R] int64, logprobs [R] float32)."""
    logits = logits.float()
    device = logits.device
    tokens = torch.empty(logits.shape[0], dtype=torch.int64, device=device)
    greedy = [i for i, p in enumerate(params) if p.greedy]
    shared = [i for i, p in enumerate(params) if not p.greedy and p.seed is None]
    if greedy:
        rows = torch.tensor(greedy, device=device)
        tokens[rows] = logits[rows].argmax(-1)
    if shared:
        rows = torch.tensor(shared, device=device)
        tokens[rows] = _draw(logits[rows], [params[i] for i in shared])
    for i, p in enumerate(params):
        if not p.greedy and p.seed is not None:
            generator = row_generator(p.seed, output_index[i], device)
            tokens[i] = _draw(logits[i : i + 1], [p], generator)[0]
    temps = torch.tensor([p.temperature if not p.greedy else 1.0 for p in params], device=device)
    logprobs = torch.log_softmax(logits / temps[:, None], dim=-1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]

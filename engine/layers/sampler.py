"""Token sampling from a step's logits: greedy, or temperature + top-k + top-p then a draw.

Every value that validation admits samples safely (docs/RELIABILITY.md): a temperature under
`GREEDY_BELOW` is greedy, a top_p under `MIN_TOP_P` keeps just the top token, and the logits
are scaled so that nothing overflows (`scale_logits`). `effective_temperature`,
`effective_top_p` and `scale_logits` are the rules every sampler (CPU or GPU) applies.

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

# Below this a temperature samples as greedy: a logit gap of 1e-3 already weighs e^-100 there,
# and dividing by it could overflow float32 (vLLM and SGLang draw the same line).
GREEDY_BELOW = 1e-5
# The smallest top_p a sampler sees: positive in float32 (1e-300 would round to 0 there) and
# far below 1/vocab, so it keeps exactly the top token, as any smaller top_p would.
MIN_TOP_P = torch.finfo(torch.float32).tiny
_FLOAT32_MAX = torch.finfo(torch.float32).max


def effective_temperature(temperature: float) -> float:
    """The temperature a sampler applies: 0 (greedy) below `GREEDY_BELOW`, else the value
    capped at float32's largest (an infinite temperature would make -inf / inf = nan)."""
    return 0.0 if temperature < GREEDY_BELOW else min(temperature, _FLOAT32_MAX)


def effective_top_p(top_p: float) -> float:
    """The top_p a sampler applies: at least `MIN_TOP_P`, so the top token always stays."""
    return max(top_p, MIN_TOP_P)


def scale_logits(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """(logits - row max) / temperature: [R, V] float32, for effective temperatures [R] > 0.

    Never nan and never overflows to +inf, whatever the logits: each row's best token scales
    to exactly 0 and the rest to [-inf, 0], so a tiny temperature leaves only the best
    token(s). A -inf or nan logit stays -inf (never drawn), +inf counts as float32's largest,
    and a row with no usable logit at all has every token alike.
    """
    logits = torch.nan_to_num(logits, nan=-torch.inf, posinf=_FLOAT32_MAX, neginf=-torch.inf)
    top = logits.amax(-1, keepdim=True)
    shifted = torch.where(top == -torch.inf, 0.0, logits - top)
    return shifted / temperatures[:, None]


def window_logits(
    logits: torch.Tensor, low, width: int, first_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A node's logit mask (NodeSubmodule.sampling_window): each row's logits over its ids
    [low[r], low[r] + width) only, and low as a tensor. Sampling the window, then adding
    low, draws from the distribution masked to those ids (log-probs are over them too),
    for width / vocab of the sampler's work. `first_id`: the id of the logits' first column
    (a head restricted to a span of the vocabulary; 0: the whole vocabulary). On CUDA `low`
    goes up from pinned memory without blocking: a blocking copy would wait for the step's
    forward, which the overlapped loop launches ahead of the host."""
    low = rows_to(low, torch.int64, logits.device)
    columns = torch.arange(-first_id, width - first_id, device=logits.device)
    index = low[:, None] + columns  # each window's ids, less the first column's id
    return logits.gather(1, index), low


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 (or below GREEDY_BELOW) = greedy
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
        return effective_temperature(self.temperature) == 0


def row_seed(seed: int, output_index: int) -> int:
    """The seed of one seeded row at one output position; stable across processes."""
    return zlib.crc32(f"{seed}:{output_index}".encode())


def row_generator(seed: int, output_index: int, device: torch.device) -> torch.Generator:
    """The generator of one seeded row at one output position."""
    return torch.Generator(device=device).manual_seed(row_seed(seed, output_index))


def rows_to(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A step's small per-row values (a list or array) as a tensor on `device`. On CUDA from
    pinned memory without blocking: a blocking copy waits for every kernel queued before it,
    which in the overlapped loop is the step just launched, so the host would sit idle through
    that step's forward instead of postprocessing the last one (INVARIANTS 46)."""
    host = torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def take_rows(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """values[rows] without waiting for the GPU: a run of consecutive rows is a view, any
    other choice is gathered by an index sent from pinned memory (`rows_to`). Indexing a
    CUDA tensor by a Python list copies the list from pageable memory, which waits for
    everything queued on the stream first (INVARIANTS 46)."""
    first = rows[0] if rows else 0
    if rows == list(range(first, first + len(rows))):
        return values[first : first + len(rows)]
    return values.index_select(0, rows_to(rows, torch.int64, values.device))


def row_temperatures(params: list[SamplingParams], device: torch.device) -> torch.Tensor:
    """Per row: the effective temperature, 1 for greedy rows (their log-prob's scale)."""
    temps = [effective_temperature(p.temperature) or 1.0 for p in params]
    return rows_to(temps, torch.float32, device)


def _draw(logits: torch.Tensor, params: list[SamplingParams], generator=None) -> torch.Tensor:
    """Sample one token per row of logits [n, V] after temperature, top-k and top-p."""
    scaled = scale_logits(logits, row_temperatures(params, logits.device))
    if all(p.top_k == 0 and p.top_p == 1.0 for p in params):
        return torch.multinomial(scaled.softmax(-1), 1, generator=generator)[:, 0]
    vocab = logits.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True, stable=True)
    top_k = rows_to([p.top_k or vocab for p in params], torch.int64, logits.device)
    ranks = torch.arange(vocab, device=logits.device)
    probs = sorted_logits.masked_fill(ranks[None, :] >= top_k[:, None], float("-inf")).softmax(-1)
    top_p = rows_to([effective_top_p(p.top_p) for p in params], torch.float32, logits.device)
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
    scaled = scale_logits(logits, row_temperatures(params, device))
    if greedy:
        rows = rows_to(greedy, torch.int64, device)
        tokens[rows] = scaled[rows].argmax(-1)
    if shared:
        rows = rows_to(shared, torch.int64, device)
        tokens[rows] = _draw(logits[rows], [params[i] for i in shared])
    for i, p in enumerate(params):
        if not p.greedy and p.seed is not None:
            generator = row_generator(p.seed, output_index[i], device)
            tokens[i] = _draw(logits[i : i + 1], [p], generator)[0]
    logprobs = torch.log_softmax(scaled, dim=-1)
    return tokens, logprobs.gather(1, tokens[:, None])[:, 0]

"""The requests of a scenario's load: the same sequence for every arm and every shard."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in the sequence (the same for every arm)
    prompt: list[int]  # token ids
    max_tokens: int


class RequestSequence(msgspec.Struct, frozen=True):
    """The requests of a scenario, drawn on demand: request i comes from a generator seeded with
    (seed, i), so every arm and every shard sees the same requests, and a million of them cost
    no memory. Lengths are uniform over the inclusive ranges, token ids uniform in [0, vocab)."""

    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    vocab_size: int
    count: int
    seed: int

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> RequestSpec:
        if not -self.count <= index < self.count:
            raise IndexError(index)
        index %= self.count
        rng = np.random.default_rng([self.seed, index])
        prompt_len = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
        max_tokens = int(rng.integers(self.output_tokens[0], self.output_tokens[1] + 1))
        return RequestSpec(index, rng.integers(0, self.vocab_size, prompt_len).tolist(), max_tokens)


def build_requests(load, vocab_size: int, count: int, seed: int | None = None) -> RequestSequence:
    """`count` requests drawn from `load` (its prompt_tokens and output_tokens ranges, its seed)."""
    seed = load.seed if seed is None else seed
    return RequestSequence(
        tuple(load.prompt_tokens), tuple(load.output_tokens), vocab_size, count, seed
    )

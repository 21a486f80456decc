"""The requests of a load: the same sequence for every arm, every shard and every slot.

Two kinds, both indexable and both crossing to shard processes as msgpack: `RequestSequence`
(random token ids, lengths uniform over the scenario's ranges, or fixed when a range is one
value), drawn on demand from a seed; and `PromptList` (a prompt file's requests, read once by
prompt_file.py, taken in file order and repeated when more are asked for).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np


@dataclass(frozen=True)
class RequestSpec:
    index: int  # position in the sequence (the same for every arm)
    prompt: list[int] | str  # token ids, or a text the server tokenizes
    max_tokens: int

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the prompt where the client knows them (0 for a text)."""
        return len(self.prompt) if isinstance(self.prompt, list) else 0


class RequestSequence(msgspec.Struct, frozen=True, tag="random"):
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
        index = _index(index, self.count)
        rng = np.random.default_rng([self.seed, index])
        prompt_len = int(rng.integers(self.prompt_tokens[0], self.prompt_tokens[1] + 1))
        max_tokens = int(rng.integers(self.output_tokens[0], self.output_tokens[1] + 1))
        return RequestSpec(index, rng.integers(0, self.vocab_size, prompt_len).tolist(), max_tokens)


class PromptList(msgspec.Struct, frozen=True, tag="prompts"):
    """A prompt file's requests (prompt, output tokens), `count` of them: request i is entry
    i mod len(entries)."""

    prompts: list[list[int] | str]
    output_tokens: list[int]
    count: int

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> RequestSpec:
        index = _index(index, self.count)
        entry = index % len(self.prompts)
        return RequestSpec(index, self.prompts[entry], self.output_tokens[entry])


Requests = RequestSequence | PromptList


def _index(index: int, count: int) -> int:
    if not -count <= index < count:
        raise IndexError(index)
    return index % count


def build_requests(load, vocab_size: int, count: int, seed: int | None = None) -> RequestSequence:
    """`count` requests drawn from `load` (its prompt_tokens and output_tokens ranges, its seed)."""
    seed = load.seed if seed is None else seed
    return RequestSequence(
        tuple(load.prompt_tokens), tuple(load.output_tokens), vocab_size, count, seed
    )

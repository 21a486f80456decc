"""A request as the worker holds it: its tokens, cache progress, pages and state slot."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.layers.sampler import SamplingParams


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_tokens: int
    ignore_eos: bool
    sampling: SamplingParams
    arrival: int  # order of arrival at the worker; admission is oldest first
    tokens: list[int] = field(default_factory=list)  # prompt then output, appended per step
    num_cached: int = 0  # tokens whose K/V (and recurrent state) the cache holds
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    handle: int | None = None  # the graph runtime's handle, set when the worker registers it
    # engine.prefill_stream: a prefill step of this request is launched on the prefill stream
    # and not yet postprocessed (its tokens are not on the host; it decodes after)
    prefilling: bool = False

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.prompt)

    @property
    def num_output(self) -> int:
        return len(self.tokens) - len(self.prompt)

    @property
    def prefill_done(self) -> bool:
        return self.num_cached >= len(self.prompt)

    @property
    def pending(self) -> int:
        """Tokens not yet run through the model (a prompt's rest, or the last sampled one)."""
        return len(self.tokens) - self.num_cached

    @property
    def reserved_tokens(self) -> int:
        """Cache positions the request can ever need: admission reserves them all up front,
        so a running request never waits for memory and nothing is preempted."""
        return len(self.prompt) + self.max_tokens

"""What a model declares about its graph: nodes, walks, loops, and the stop check it owns.

A walk is a kind of step (`prefill`, `decode`); a loop repeats one walk (`decode_loop` over
`decode`). The runtime reads these declarations; it never special-cases a model (STYLE:
declared, not hard-wired).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engine.runtime.stops import StopLimits, StopPolicy


@dataclass(frozen=True)
class GraphSpec:
    node: str
    walks: tuple[str, ...]  # in the order a request takes them
    loops: dict[str, str] = field(default_factory=dict)  # loop name -> the walk it repeats

    def next_walk(self, walk: str) -> str | None:
        i = self.walks.index(walk)
        return self.walks[i + 1] if i + 1 < len(self.walks) else None

    def loop_of(self, walk: str) -> str | None:
        return next((lp for lp, w in self.loops.items() if w == walk), None)


@dataclass(frozen=True)
class StopRows:
    """The rows a model's `check_stop` decides, with what it needs, row-aligned."""

    rids: np.ndarray  # int64 [R]
    walks: list[str]
    tokens: np.ndarray  # int64 [R], the token each row sampled this step
    output_counts: np.ndarray  # int64 [R], output tokens so far, this one included
    max_tokens: np.ndarray  # int64 [R]
    ignore_eos: np.ndarray  # bool [R]

    @classmethod
    def of(cls, rids, walks, tokens, output_counts, max_tokens, ignore_eos) -> StopRows:
        """From sequences, typed as the model's check_stop expects them."""
        return cls(
            rids=np.asarray(rids, dtype=np.int64),
            walks=list(walks),
            tokens=np.asarray(tokens, dtype=np.int64),
            output_counts=np.asarray(output_counts, dtype=np.int64),
            max_tokens=np.asarray(max_tokens, dtype=np.int64),
            ignore_eos=np.asarray(ignore_eos, dtype=bool),
        )


@dataclass
class StopCheck:
    """A model's stop decision for some rows (row-aligned with the StopRows it was given)."""

    stopped: np.ndarray  # bool [R]
    by_token: np.ndarray  # bool [R], stopped on a stop token (finish 'stop', else 'length')
    end_partition: np.ndarray  # bool [R], the row asks to end its partition here
    failed: list[int] = field(default_factory=list)  # row indices whose check raised

    @classmethod
    def none(cls, rows: int) -> StopCheck:
        false = np.zeros(rows, dtype=bool)
        return cls(stopped=false, by_token=false.copy(), end_partition=false.copy())


class NodeSubmodule:
    """A model node as the runtime sees it. Subclasses declare; the runtime acts."""

    graph: GraphSpec
    eos_token_ids: tuple[int, ...] = ()
    # The logit mask the node declares, if any: a method sampling_window(output_index) ->
    # (low, width): per row, given the index in its output of the token it samples, the ids
    # [low, low + width) it may sample (one width for all rows). None: the whole vocabulary.
    sampling_window: Callable[[np.ndarray], tuple[np.ndarray, int]] | None = None
    # The ids [first, end) every window of that mask lies in, if the node declares them: with
    # `engine.masked_head` the model computes logits of those ids alone.
    sampling_span: tuple[int, int] | None = None

    def get_stop_policies(self, walk: str) -> dict[str, StopPolicy] | None:
        """Loop name -> policy for a walk; None keeps calling `check_stop` for it."""
        return None

    def get_loop_caps(self, max_tokens: int) -> dict[str, int]:
        """Each loop's budget of iterations for a request."""
        return {}

    def stop_limits(self, max_tokens: int, ignore_eos: bool) -> dict[str, StopLimits]:
        """Walk -> the limits the runtime checks for that walk's loop."""
        caps = self.get_loop_caps(max_tokens)
        return {
            walk: StopLimits(caps[loop], self.eos_token_ids, ignore_eos)
            for loop, walk in self.graph.loops.items()
        }

    def check_stop(self, rows: StopRows) -> StopCheck:
        raise NotImplementedError

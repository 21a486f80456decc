"""The scheduler's settings (engine/worker/scheduler.py): how many rows and tokens a step
holds, and whether prompt rows join, split from or run beside the decode rows."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import ConfigError, check_at_least_one, setting


@dataclass(frozen=True)
class SchedulerConfig:
    max_rows: int = setting(256, "rows (requests) in one step")
    max_tokens_per_step: int = setting(2048, "tokens in one step; longer prompts are chunked")
    mixing: bool = setting(False, "prefill rows may join a decode step")
    # Mixed steps in two launches back to back on the stream: the decode rows replay their
    # decode graph, then the prompt rows run on the piecewise runner (or eagerly), where
    # `mixing` alone runs every row of a mixed step through the piecewise runner. The decode
    # rows keep their graph's cost, and the host plans the prompt rows while the GPU runs the
    # decode graph and the step before it. Two stagings a step: each staged host buffer and
    # FlashInfer plan waits for its last copy first (INVARIANTS 64). Turns mixing's
    # scheduling on whatever `mixing` says.
    split_mixed: bool = setting(
        False, "mixed steps in two launches: the decode rows' graph, then the prompt rows"
    )
    # A step's prompt rows launch apart from its decode rows (`schedule_apart`) on a second
    # set of staged resources (ops, step inputs, piecewise graphs), and join the decode steps
    # once their prefill has completed and been postprocessed; the decode rows go on decoding
    # meanwhile. One prefill step in flight at a time. INVARIANTS 65.
    prefill_stream: bool = setting(
        False, "prefill steps on a CUDA stream of their own, beside the decode steps"
    )
    # Requests arriving a few steps apart prefill together: fewer prefill steps (each holds up
    # every decoding row, and costs the host about as much for one row as for four) for a
    # later first token (TGI's router has this trade as max_waiting_tokens). Never holds with
    # no row decoding, nor once a step's worth of prompt tokens waits (docs/ENGINE.md,
    # INVARIANTS 53).
    prefill_hold_steps: int = setting(
        0, "steps a new prefill may wait while other rows decode (0: at once)"
    )

    @property
    def mixes(self) -> bool:
        """Whether prompt rows join decode steps (`mixing`, or `split_mixed`'s two launches)."""
        return self.mixing or self.split_mixed

    def __post_init__(self) -> None:
        check_at_least_one(self, "max_rows")
        if self.max_tokens_per_step < self.max_rows:
            raise ConfigError(
                f"engine.max_tokens_per_step ({self.max_tokens_per_step}) must be at least "
                f"engine.max_rows ({self.max_rows}): a step holds a token of each row"
            )
        if self.prefill_stream and self.mixes:
            raise ConfigError(
                "engine.prefill_stream launches prompt rows apart from decode rows; it cannot "
                "be combined with engine.mixing or engine.split_mixed (set "
                "engine.prefill_stream=false with them)"
            )

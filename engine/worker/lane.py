"""Where a step launches (`Lane`): the engine's own lane, and with `engine.prefill_stream` the
prefill steps' lane of their own; and the lane's resources that stage pinned host memory,
checked for the staging hazard once the host runs ahead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.worker.piecewise import PiecewiseGraphs
from engine.worker.step_inputs import StepInputs

log = logging.getLogger("engine.worker")


@dataclass
class Lane:
    """Where a step launches: its ops (attention plans, sampler staging), its step inputs,
    its piecewise runner, and its CUDA stream (None: the current one). The engine's own lane
    runs every step but, with `engine.prefill_stream`, the prefill steps, which launch on a
    lane of their own: nothing staged, planned or captured is shared between the two. ops and
    inputs None: the engine's own (`Engine.ops`, which a benchmark may wrap, and `.inputs`)."""

    ops: object | None
    inputs: StepInputs | None
    piecewise: PiecewiseGraphs | None
    stream: torch.cuda.Stream | None = None


def staging(inputs: StepInputs, ops) -> list:
    """The resources that stage pinned host memory behind non-blocking copies: each
    declares `force_double_buffer` and keeps its slots' `fences` (engine/staging.py)."""
    resources = (inputs, ops.attention_backend)
    return [r for r in resources if getattr(r, "force_double_buffer", False)]


def check_double_buffering(inputs: StepInputs, ops, overlap: bool, device: torch.device) -> None:
    """A resource that declares `force_double_buffer` needs two slots once the host runs
    ahead (the overlapped loop); with one, plan(N+1) may overwrite what N's copy has not
    read. Allowed (the hazard is an arm to compare), never silent."""
    short = [type(r).__name__ for r in staging(inputs, ops) if r.slots < 2]
    if short and overlap and device.type == "cuda":
        log.warning(
            "engine.overlap with engine.double_buffer=false: %s stage host buffers the "
            "next step may overwrite before they are copied (the staging hazard)",
            ", ".join(short),
        )

"""The worker loop's settings (engine/worker/worker.py, main.py): the runtime's stop check,
the overlapped loop, the start-up warmup, and the planted slowdowns the harness checks its
verdicts with. `Worker` takes this part whole."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import setting


@dataclass(frozen=True)
class LoopConfig:
    runtime_stops: bool = setting(True, "declared stop policies checked in the runtime")
    # Launch step N+1 (decode rows fed step N's tokens on the device) before postprocessing
    # step N, hiding the host's work under the GPU's. On a CPU it gains nothing: the step
    # runs at launch.
    overlap: bool = setting(False, "the overlapped loop (off: launch, wait, postprocess)")
    # Throwaway steps before Ready (prefill below and above gdn_split_from_tokens, several
    # rows, decode, mixed, sampled; engine/worker/warmup.py), so that the kernels compile then,
    # not under the first requests (an H200 server's first prefill otherwise stalls for
    # minutes). On every device: on a CPU nothing compiles and a tiny model's warmup is a
    # small part of its start.
    warmup: bool = setting(True, "throwaway steps before Ready, so the kernels compile then")
    planted_delay_us: int = setting(
        0, "planted slowdown of each loop iteration (bench power, harness tests)"
    )
    # For the harness's verdict checks on a GPU-bound loop, where a host delay hides under
    # the GPU's work; on a CPU a busy-wait at launch.
    planted_gpu_delay_us: int = setting(
        0, "planted spin kernel of this many us after each decode-lane step"
    )

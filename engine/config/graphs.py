"""The graph runners' settings (engine/worker/graphs.py, piecewise.py) and the staging's
double buffering (engine/staging.py): what the engine captures, and how many host buffers a
staged resource keeps."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import setting


@dataclass(frozen=True)
class GraphsConfig:
    # Captured per batch bucket; needs the CUDA kernels with FlashInfer attention (bf16/fp16).
    cuda_graphs: bool = setting(True, "decode steps replay CUDA graphs (off: every step eager)")
    # The token-wise pieces between the attention and Gated DeltaNet ops, captured per token
    # bucket (prefill, mixed, and decode steps past the largest decode bucket); same
    # requirements as cuda_graphs.
    piecewise_graphs: bool = setting(True, "prefill and mixed steps replay piecewise graphs")
    # The step inputs and FlashInfer's plans stage host data behind a non-blocking copy; with
    # one buffer the next step's plan may overwrite what this step's copy has not read (the
    # staging hazard, kept nameable for an A/B).
    double_buffer: bool = setting(True, "staged resources keep two host buffers used in turn")

    @property
    def slots(self) -> int:
        """The host buffers a staged resource keeps."""
        return 2 if self.double_buffer else 1

"""The codec stage's settings (Orpheus's SNAC: engine/worker/stream_stage.py,
codec_graphs.py, engine/models/snac.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import check_one_of, setting

CODEC_KERNELS = ("torch", "snake", "fused", "folded", "folded_noise")  # engine.codec_kernels
CODEC_SINES = ("exact", "approx")  # engine.codec_sine


@dataclass(frozen=True)
class CodecConfig:
    # Captured per window-count bucket up to max_rows (engine/worker/codec_graphs.py); ignored
    # on a CPU. On since it measured +28% audio-s/s (docs/evidence/codec_graphs).
    codec_graphs: bool = setting(True, "the codec's decode replays CUDA graphs")
    # Begin (decode queued, PCM copied back without blocking) in one worker iteration, finish
    # (wait, then the postprocess and frames) in the next, so the host no longer waits out the
    # codec's device work. The same frames either way; off (strict) until measured on a GPU.
    codec_overlap: bool = setting(False, "the codec's step in two phases across iterations")
    # On Triton kernels (engine/kernels/triton_snac.py), CUDA only: "torch" (the reference:
    # each Snake five elementwise kernels), "snake" (each Snake one kernel), "fused" (that,
    # and each residual unit's Snake -> depthwise conv -> Snake one kernel), "folded" (that,
    # and each unit's 1x1 conv one GEMM adding into the unit's input in place, its bias handed
    # on to the next kernel) or "folded_noise" (that, and each block's noise block one kernel
    # and a GEMM into x). Captured by the codec graphs like the rest; Orpheus 3b runs
    # "folded_noise" (scenarios/orpheus.yaml).
    codec_kernels: str = setting("torch", "the codec's elementwise work: torch or our kernels")
    # "exact" (libdevice's sinf, ~40 instructions and a local-memory stack frame) or "approx"
    # (the SFU's sin.approx.f32, ~2^-21 absolute error at the codec's O(1) arguments, far
    # under bf16's rounding). Orpheus 3b runs "approx" (docs/evidence/codec_sine*).
    codec_sine: str = setting("exact", "the sines of the codec's Triton kernels")

    def __post_init__(self) -> None:
        check_one_of("engine.codec_kernels", self.codec_kernels, CODEC_KERNELS)
        check_one_of("engine.codec_sine", self.codec_sine, CODEC_SINES)

"""The kernels' settings (engine/kernels): which backend runs a model step and, on the CUDA
kernels, which kernel each op launches and how. `build_ops` takes this part whole."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config.checks import ConfigError, check_one_of, setting
from engine.config.gdn_split import SPLIT_FROM_TOKENS, parse_split_config

BACKENDS = ("auto", "torch", "cuda")  # engine.kernels
GDN_PREFILLS = ("fla", "triton", "triton_split", "auto")  # engine.gdn_prefill
GDN_DECODES = ("grid", "pipelined")  # engine.gdn_decode
DECODE_ATTENTIONS = ("flashinfer", "triton")  # engine.decode_attention
DENSE_KERNELS = ("torch", "triton", "head")  # engine.dense_kernel
TRITON_LAUNCHES = ("jit", "bound")  # engine.triton_launch
DENSE_MAX_ROWS = 128  # the most rows our dense GEMM takes (engine/kernels/triton_gemm.py)


@dataclass(frozen=True)
class KernelsConfig:
    # "auto" runs the CUDA kernels (Triton, FlashInfer, flash-linear-attention) on a CUDA
    # device and the torch reference elsewhere; "torch" forces the reference, "cuda" the
    # kernels (an error without CUDA).
    kernels: str = setting("auto", "the model step's backend: auto, torch or cuda")
    # Of bf16/fp16 prefill and mixed steps: "triton" (ours, engine/kernels/triton_gdn.py, one
    # launch a layer), "triton_split" (ours in three launches, a short serial part), "auto"
    # (per step: triton_split when the longest row has gdn_split_from_tokens or more, else
    # triton; faster than either alone at every step measured) or "fla"
    # (flash-linear-attention's chunked kernel, ~9 launches a layer). Ours run a mixed step's
    # decode rows through the recurrence.
    gdn_prefill: str = setting("auto", "the Gated DeltaNet kernel of prefill and mixed steps")
    # SplitConfig's fields as `name=value,...` (engine/config/gdn_split.py; e.g.
    # `states_bv=32,outputs_bv=64`), "default" for its defaults: a tuned launch can be an arm.
    gdn_split: str = setting("default", "how the split Gated DeltaNet kernel launches")
    # The one-launch kernel's single launch costs less host time; the split kernel is ahead
    # from about 256 tokens on the H200 (engine/config/gdn_split.py).
    gdn_split_from_tokens: int = setting(
        SPLIT_FROM_TOKENS, "`auto`: rows of this many new tokens or more take the split kernel"
    )
    # Of decode steps (and a mixed step's leading decode rows): "grid" (a program per row,
    # value head and value block) or "pipelined" (persistent programs striding over those
    # tiles, each tile's state read a tile ahead by Triton's pipeliner while the one before
    # computes). The same arithmetic either way; "grid" until measured on a GPU.
    gdn_decode: str = setting("grid", "the Gated DeltaNet recurrence of decode steps")
    # "flashinfer" (its decode wrappers; `decode_tensor_cores` picks which) or "triton" (ours,
    # split over each row's tokens, engine/kernels/triton_decode.py: FlashInfer's decode in
    # graphs read the cache at well under the H200's bandwidth; ours is faster there, see
    # docs/BENCHMARKS.md). Prefill and mixed steps run FlashInfer's prefill either way.
    decode_attention: str = setting("triton", "the kernel of decode steps' attention")
    # FlashInfer's prefill kernel run for one query a row, which FlashInfer advises for
    # grouped-query heads of 4 or more (0.8b: 8 over 2).
    decode_tensor_cores: bool = setting(False, "FlashInfer's decode attention on tensor cores")
    # "torch" (cuBLAS through torch), "triton" (ours for steps of up to 128 rows in bf16/fp16,
    # the weight streamed once; more rows, and fp32, stay on torch's) or "head" (ours for the
    # LM head alone, the one shape where the H200 measured it ahead). Ignored by the reference.
    dense_kernel: str = setting("torch", "the GEMM of a step's dense projections")
    # Ours takes steps of up to this many rows (at most DENSE_MAX_ROWS), torch's GEMM more:
    # measured level or ahead of cuBLAS at 1-64 rows, behind at 128 (docs/KERNELS.md).
    dense_rows: int = setting(DENSE_MAX_ROWS, "our GEMM's most rows a step (dense_kernel triton)")
    # Where our GEMM runs a product (dense_kernel triton): the MLP's SiLU-and-multiply in its
    # epilogue (gate and up rows in one program), an output projection's K-split partials
    # summed by the norm that reads them, a decode step's conv after Gated DeltaNet's
    # in-projection, and before the output projections the gated norm or the sigmoid gate
    # (engine/kernels/triton_gemm_fused.py): the same bits as the unfused kernels.
    dense_epilogues: bool = setting(
        True,
        "fuse SiLU-mul, the K split's sum, a decode step's conv and the output "
        "projections' gated norm or sigmoid gate into our GEMM",
    )
    # "jit" (Triton's own launch, which finds the compiled kernel on every call) or "bound"
    # (the compiled kernel kept per call signature, its launcher called directly: less host
    # time a launch). One setting per worker process; "jit" until measured on a GPU.
    triton_launch: str = setting("jit", "how the CUDA ops launch their Triton kernels")
    # Hopper's griddepcontrol (engine/kernels/triton_launch.py): each kernel may start while
    # the one before it finishes, waiting on the device before it touches that kernel's data;
    # the dense GEMM prefetches its weight into L2 meanwhile. Captured in the CUDA graphs as
    # programmatic edges. Off: it shortened 0.8b's decode graph but served "no change" at c=64
    # (docs/evidence/pdl).
    pdl: bool = setting(False, "programmatic dependent launch of our Triton kernels (CUDA)")
    # Its kernels on grids fixed per token bucket, reading the step's row and chunk tables
    # from the staged inputs (engine/kernels/gdn_tables.py); only attention stays eager.
    piecewise_gdn: bool = setting(False, "the piecewise graphs capture Gated DeltaNet too")
    # A node whose logit mask never leaves a span of the vocabulary (Orpheus: 28,672 audio
    # codes of 156,940 ids) gets logits of that span only (engine/models/decoder.py
    # `CausalLM.restrict_head`): the same windows sampled from the same logits; the head's
    # weight read 5.5x smaller at 3b. Ignored by a node that declares no span.
    masked_head: bool = setting(False, "the LM head computes the node's sampling span only")

    def __post_init__(self) -> None:
        check_one_of("engine.kernels", self.kernels, BACKENDS)
        check_one_of("engine.gdn_prefill", self.gdn_prefill, GDN_PREFILLS)
        try:  # parsed once: the kernels take `split`
            object.__setattr__(self, "split", parse_split_config(self.gdn_split))
        except ValueError as exc:
            raise ConfigError(f"engine.gdn_split: {exc}") from None
        check_one_of("engine.gdn_decode", self.gdn_decode, GDN_DECODES)
        check_one_of("engine.decode_attention", self.decode_attention, DECODE_ATTENTIONS)
        check_one_of("engine.dense_kernel", self.dense_kernel, DENSE_KERNELS)
        if not 1 <= self.dense_rows <= DENSE_MAX_ROWS:
            raise ConfigError(
                f"engine.dense_rows must be 1 to {DENSE_MAX_ROWS}, got {self.dense_rows!r}"
            )
        check_one_of("engine.triton_launch", self.triton_launch, TRITON_LAUNCHES)

"""The CUDA backend: a step's ops on kernels, with the torch reference's semantics.

- Projections that read the same input run as one GEMM: the layer's weights are packed into
  one buffer at startup and each Linear's weight becomes a view of its rows (no copy kept).
  Every dense projection (packed or not, the LM head too) runs on torch's GEMM (cuBLAS) or,
  with `dense_kernel="triton"`, on ours for steps of up to triton_gemm.MAX_ROWS rows in
  bf16/fp16 (triton_gemm.py: the weight streamed once); more rows and fp32 stay on torch's.
  The dense ops, and what `dense_epilogues` fuses into our GEMM, are `DenseOps`'
  (cuda_dense.py), this class's base.
- Norms, the gated norm, the sigmoid gate, SiLU-and-multiply: Triton (triton_norms.py); an
  attention layer's q/k norm + rotary in one launch, with a decode step's K/V store
  (`_kv_early`), else the store in `attention` (triton_rope.py). Attention: FlashInfer for
  bf16/fp16, decode steps on our split Triton kernel with `decode_attention="triton"`
  (triton_decode.py); fp32 (the verification mode) uses the torch reference attention,
  since FlashInfer has no fp32 kernels.
- Gated DeltaNet: the conv and, for decode steps and fp32, the recurrence run on our Triton
  kernels in place on the state pool (triton_gdn.py); bf16/fp16 prefill and mixed steps run
  our chunked kernel, in place, one launch a layer (`gdn_prefill="triton"`), or in three
  launches with a short serial part (`"triton_split"`), or whichever of the two suits the
  step's longest row (`"auto"`, the default), a mixed step's leading decode rows through the
  recurrence beside it (`triton_gdn.gated_delta_prefill`); or flash-linear-attention's over
  every row at once (varlen, `"fla"`), states gathered from and written back to the pool once
  per layer. With `piecewise_gdn` the op declares itself capturable: a step whose inputs staged
  Gated DeltaNet's tables (the piecewise runner's, padded to a token bucket) runs the conv, the
  recurrence and the split kernel on grids fixed by the bucket
  (`triton_gdn.gated_delta_fixed_grid`), whatever `gdn_prefill` says. The split kernel
  launches as `gdn_split` says (engine/config/gdn_split.py; the default unless a benchmark
  gives another).
- Sampling: FlashInfer (gpu_sampler.py).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.config import KernelsConfig
from engine.kernels import triton_argmax, triton_gdn, triton_norms, triton_rope
from engine.kernels.cuda_dense import DenseOps
from engine.kernels.flashinfer_attention import FlashInferAttention
from engine.kernels.gdn_launch import (
    PIPELINED_LAUNCH,
    RECURRENT_LAUNCH,
    PipelinedLaunch,
    RecurrentLaunch,
)
from engine.kernels.gpu_sampler import sample_on_gpu
from engine.layers.attention import Attention, GatedAttention, torch_paged_attention
from engine.layers.gated_delta import GatedDeltaNet, gdn_gates
from engine.layers.norm import GatedRMSNorm, RMSNorm


def _pack(linears: tuple[nn.Linear, ...]) -> torch.Tensor:
    """One weight for several Linears of the same input; each keeps a view of its rows. Where
    an earlier ops object of the same model packed them (the prefill lane's beside the
    engine's), that buffer is the one returned: no second copy of the weights."""
    weights = [linear.weight.detach() for linear in linears]
    first, width = weights[0], weights[0].shape[1]
    offset = first.storage_offset()
    packed_before = True
    for weight in weights:
        same = weight.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
        packed_before &= same and weight.is_contiguous() and weight.storage_offset() == offset
        offset += weight.numel()
    if packed_before:
        rows = sum(weight.shape[0] for weight in weights)
        return first.as_strided((rows, width), (width, 1))
    packed = torch.cat(weights)
    start = 0
    for linear in linears:
        rows = linear.weight.shape[0]
        linear.weight.data = packed[start : start + rows]
        start += rows
    return packed


class CudaOps(DenseOps):
    name = "cuda"

    def __init__(
        self,
        model: nn.Module,
        device: torch.device,
        page_size: int,
        slots: int = 2,
        config: KernelsConfig = KernelsConfig(),
        recurrent: RecurrentLaunch = RECURRENT_LAUNCH,
        pipelined: PipelinedLaunch = PIPELINED_LAUNCH,
    ):
        """`config`: the kernels' part of the engine's configuration (engine/config/kernels.py);
        `recurrent`, `pipelined`: the Gated DeltaNet recurrence's launches (gdn_launch.py: the
        engine runs the defaults, benchmarks/bench_gdn_kernels.py --recurrent times others)."""
        self.device = device
        self.recurrent_launch, self.pipelined_launch = recurrent, pipelined
        # engine.gdn_decode pipelined: decode rows' recurrence on the persistent kernel
        self.pipelined_decode = config.gdn_decode == "pipelined"
        self.dense_kernel = config.dense_kernel  # "torch", "triton" or "head"
        self.dense_rows = config.dense_rows  # ours for steps of up to this many rows
        self.dense_epilogues = config.dense_epilogues  # on our GEMM: SiLU-mul, the split's sum
        # the cached path's LM head (tied: the embeddings; restricted: some of their rows)
        self.head = getattr(model, "step_head", None)
        self.gdn_prefill = config.gdn_prefill
        self.gdn_split = config.split  # the split Gated DeltaNet kernel's launch configuration
        self.gdn_split_from = config.gdn_split_from_tokens  # `auto`: the split kernel from here
        # linear_attention can be captured in a CUDA graph on a step that staged its tables
        self.linear_attention_capturable = config.piecewise_gdn
        self.dtype = next(model.parameters()).dtype
        self.weights: dict[nn.Module, torch.Tensor] = {}  # norm -> fp32 scale
        self.packed: dict[tuple[nn.Linear, ...], tuple[torch.Tensor, list[int]]] = {}
        self.attention_backend: FlashInferAttention | None = None
        for module in model.modules():
            if isinstance(module, RMSNorm):
                self.weights[module] = (1.0 + module.weight.detach().float()).contiguous()
            elif isinstance(module, GatedRMSNorm):
                self.weights[module] = module.weight.detach().float().contiguous()
            elif isinstance(module, (GatedAttention, Attention)):
                self._register(module.q_proj, module.k_proj, module.v_proj)
                if self.attention_backend is None and self.dtype != torch.float32:
                    self.attention_backend = FlashInferAttention(
                        module.heads, module.kv_heads, module.head_dim, page_size,
                        self.dtype, device, slots, tensor_cores=config.decode_tensor_cores,
                        decode_kernel=config.decode_attention,
                    )  # fmt: skip
            elif isinstance(module, GatedDeltaNet):
                self._register(*module.projections)
            if hasattr(module, "gate_proj") and hasattr(module, "up_proj"):
                self._register(module.gate_proj, module.up_proj)
        self.reads_page_table = self.attention_backend is None  # the reference attention does
        self._chunked = False  # this step's Gated DeltaNet runs a chunked kernel
        self._step = None  # (slots, keep, cu_seqlens, cu_seqlens on the host) of that step
        self._stored = None  # the batch whose K/V qk_rope stored and no attention read yet

    def _register(self, *linears: nn.Linear) -> None:
        self.packed[linears] = (_pack(linears), [linear.weight.shape[0] for linear in linears])

    # --- per step ------------------------------------------------------------------------
    def begin_step(self, batch, bucket: int | None = None) -> int:
        """Plan the step on the host; `bucket` names the CUDA-graph decode bucket it replays.
        Returns the double-buffer slot the plan used (the graph of that slot replays)."""
        slot = 0
        if self.attention_backend is not None:
            slot = self.attention_backend.plan(batch, bucket)
        self._chunked = not batch.is_decode and self.dtype != torch.float32
        if self._chunked and self.gdn_prefill == "fla":
            self._step = (
                batch.state_slots.long(),
                (batch.cached > 0)[:, None, None, None],
                batch.cu_seqlens.long(),
                torch.from_numpy(batch.host.cu_seqlens),
            )
        return slot

    # --- ops (the dense projections: DenseOps) --------------------------------------------
    def norm(self, x, norm: RMSNorm, residual=None, rows=None):
        return triton_norms.rms_norm(x, self.weights[norm], norm.eps, residual, rows)

    def qk_rope(self, q, k, cos, sin, norms: tuple[RMSNorm, RMSNorm] | None = None, kv=None):
        """One launch for an attention layer's q and k (`triton_rope.qk_rope`). `kv`: (v,
        k_cache, v_cache, batch); where `_kv_early`, k and v go to their cache slots in that
        launch too, and `attention` stores nothing."""
        store = None
        if kv is not None and self._kv_early(kv[3]):
            v, k_cache, v_cache, batch = kv
            store = triton_rope.KvStore(v, k_cache, v_cache, batch.slot_mapping)
            self._stored = batch  # the step whose next attention finds its K/V stored
        weights, eps = (None, None), (0.0, 0.0)
        if norms is not None:
            weights = (self.weights[norms[0]], self.weights[norms[1]])
            eps = (norms[0].eps, norms[1].eps)
        return triton_rope.qk_rope(q, k, *weights, cos, sin, *eps, kv=store)

    def attention(self, q, k, v, k_cache, v_cache, batch, scale: float) -> torch.Tensor:
        if self.attention_backend is None:
            return torch_paged_attention(q, k, v, k_cache, v_cache, batch, scale)
        if self._kv_early(batch):
            if self._stored is not batch:  # nothing stored this step's K/V: say so, not attend
                raise RuntimeError(
                    "a decode step's attention needs its layer's qk_rope(..., kv=...) first: "
                    "that launch stores K and V (INVARIANTS 91)"
                )
            self._stored = None
        else:
            tokens = k.shape[0]
            triton_rope.store_kv(
                k.view(tokens, -1), v.view(tokens, -1), k_cache, v_cache, batch.slot_mapping
            )
        return self.attention_backend.run(q, k_cache, v_cache, scale)

    def _kv_early(self, batch) -> bool:
        """Whether a step's K and V are stored by `qk_rope` rather than by `attention`: a
        decode step outside the piecewise runner (whose attention runs eagerly between its
        pieces, on the step's real tokens) on the kernels' attention. `qk_rope` and
        `attention` ask it of the same step, and agree."""
        return self.attention_backend is not None and batch.is_decode and batch.token_bucket is None

    def linear_attention(self, layer: GatedDeltaNet, mixed, a, b, conv_state, ssm_state, batch):
        """The conv (unless the in-projection's epilogue ran it: `_conv_fused`), then the rule."""
        if not self._conv_fused(layer, mixed, batch):
            mixed = triton_gdn.causal_conv(mixed, layer.conv1d.weight[:, 0, :], conv_state, batch)
        return self.delta_rule(layer, mixed, a, b, ssm_state, batch)

    def delta_rule(self, layer: GatedDeltaNet, qkv, a, b, ssm_state, batch) -> torch.Tensor:
        """The gated delta rule over the conv's output qkv [T, q | k | v] on the step's kernel
        (the fixed grid, the recurrence, `gdn_prefill`'s): [T, Hv, V]; each row's slot of
        ssm_state updated."""
        args = (qkv, a, b, layer.A_log, layer.dt_bias, ssm_state, batch)
        shape = (layer.k_heads, layer.k_dim, layer.v_dim)
        if batch.gdn_tables is not None:
            return triton_gdn.gated_delta_fixed_grid(
                *args, *shape, split=self.gdn_split, launch=self.recurrent_launch
            )
        launches = {"launch": self.recurrent_launch, "pipelined_launch": self.pipelined_launch}
        if not self._chunked:  # a decode step (one token a row), or fp32
            pipelined = self.pipelined_decode and batch.is_decode
            return triton_gdn.gated_delta_recurrent(*args, *shape, pipelined=pipelined, **launches)
        if self.gdn_prefill != "fla":
            return triton_gdn.gated_delta_prefill(
                self.gdn_prefill,
                *args,
                *shape,
                split=self.gdn_split,
                split_from=self.gdn_split_from,
                pipelined=self.pipelined_decode,
                **launches,
            )
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        slots, keep, cu, cu_cpu = self._step
        tokens, key = qkv.shape[0], layer.k_heads * layer.k_dim
        q, k, v = qkv.split((key, key, layer.v_heads * layer.v_dim), dim=-1)
        g, beta = gdn_gates(a, b, layer.A_log, layer.dt_bias)
        out, final = chunk_gated_delta_rule(
            q.reshape(1, tokens, layer.k_heads, layer.k_dim),
            k.reshape(1, tokens, layer.k_heads, layer.k_dim),
            v.reshape(1, tokens, layer.v_heads, layer.v_dim),
            g=g[None], beta=beta[None], scale=layer.k_dim**-0.5,
            initial_state=torch.where(keep, ssm_state[slots].float(), 0.0),  # not NaN * 0
            output_final_state=True,
            use_qk_l2norm_in_kernel=True, cu_seqlens=cu, cu_seqlens_cpu=cu_cpu,
        )  # fmt: skip
        ssm_state.index_copy_(0, slots, final.to(ssm_state.dtype))
        return out[0]

    sample = staticmethod(sample_on_gpu)
    # each row's greedy choice, the first maximum (a decode graph captures it): our two-pass
    # kernel, where torch's one reduction a row is slow on a long vocabulary row
    argmax = staticmethod(triton_argmax.argmax)

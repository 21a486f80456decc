"""The staging hazard and its fix, made certain (pytest -m gpu).

A step's inputs reach the GPU by a non-blocking copy from a pinned host buffer. A kernel that
spins (torch.cuda._sleep) queued before that copy holds it back while the host runs on, as
the overlapped loop does: it stages step N+1 while N runs and waits for N-1 (not N) first.
With one host buffer the held-back copy delivers the NEXT step's inputs to this step; with
two buffers in turn each step reads its own. Both halves are asserted, so the first half
proves the test can see the hazard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from engine.cache import CacheShapes, KVCache
from engine.kernels.torch_ops import TORCH_OPS
from engine.layers.sampler import SamplingParams
from engine.worker.pending_step import PendingStep
from engine.worker.request import Request
from engine.worker.scheduler import ScheduledRow
from engine.worker.step_inputs import StepInputs

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_quick]
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)


@dataclass
class _Request:
    tokens: list[int]
    num_cached: int
    pages: list[int] = field(default_factory=lambda: [0, 1])
    slot: int = 0


@dataclass
class _Row:
    request: _Request
    num_new: int = 1
    walk: str = "decode"


def _seen_by_step(slots: int, wait: bool = False) -> list[list[int]]:
    cache = KVCache(CacheShapes(1, 1, 1, 8, 8, 4, 1, 4, 4), 8, 16, 4, torch.float32, "cuda")
    inputs = StepInputs(64, 8, 4, torch.device("cuda"), slots=slots)
    inputs.fences.wait = wait
    seen = []
    for _ in range(3):  # warm up the copy path first: a cold first copy may not show it
        inputs.stage([_Row(_Request([1, 2], 1))], cache, TORCH_OPS)
    torch.cuda.synchronize()
    done = []
    for step in range(4):
        if step >= 2:
            done[step - 2].synchronize()  # the overlapped loop's wait: two steps back
        torch.cuda._sleep(int(2e7))  # ~10 ms of GPU spin ahead of this step's copy
        batch = inputs.stage([_Row(_Request([0, 100 + step], 1))], cache, TORCH_OPS)
        seen.append(batch.input_ids.clone())  # what the step's kernels read, in stream order
        done.append(torch.cuda.Event())
        done[-1].record()
    torch.cuda.synchronize()
    if wait:  # every stage after the first found its one buffer's copy held back, and waited
        assert inputs.fences.waits == 3 and inputs.fences.hazards == 0, vars(inputs.fences)
    return [t.tolist() for t in seen]


def test_one_host_buffer_delivers_the_next_steps_inputs_two_deliver_each_its_own():
    single = _seen_by_step(slots=1)
    assert single[:3] == [[101], [102], [103]], single  # each step read its successor's ids
    double = _seen_by_step(slots=2)
    assert double == [[100], [101], [102], [103]], double


def test_a_fence_that_waits_makes_one_host_buffer_deliver_each_steps_own():
    """`fences.wait` (engine.split_mixed's two stagings a step, engine/staging.py): staging
    waits for the buffer's last copy, so even one buffer delivers each step its own ids."""
    assert _seen_by_step(slots=1, wait=True) == [[100], [101], [102], [103]]


def test_a_steps_host_copy_is_read_after_the_copy_held_back_by_queued_work():
    """INVARIANTS 88: `PendingStep.to_host` called at once (no `wait` first, as the GPU tests
    driving an engine by hand called it) still reads the step's tokens. A spin holds the
    step's tokens, and their non-blocking copy to pinned memory, ~10 ms behind the host."""
    request = Request(0, [1, 2], 8, True, SamplingParams(temperature=0), 0)
    request.handle = 0  # the runtime handle a worker sets
    torch.cuda.synchronize()
    for value in (123_457, 765_431):  # the second pinned block may be the first's, recycled
        torch.cuda._sleep(int(2e7))
        tokens = torch.full((1,), value, dtype=torch.int64, device="cuda")
        pending = PendingStep([ScheduledRow(request, 1, "decode")], [0], tokens, None, {0: request})
        assert pending.to_host().tokens.tolist() == [value]


def test_flashinfers_prefill_plan_does_not_wait_for_queued_gpu_work():
    """INVARIANTS 46 for the prefill plan: every host tensor FlashInfer's plan copies up is a
    pinned view of the staged buffer (its `seq_lens` too: `HostLayout.kv_lens`), so planning a
    prompt step while ~1 s of GPU spin is queued returns before the spin ends. The split mixed
    step plans its prompt rows with two decode steps queued (engine.split_mixed)."""
    from engine.kernels.cuda_ops import CudaOps
    from engine.layers.attention import GatedAttention

    ps, q_heads, kv_heads, dim = 16, 8, 2, 256
    model = torch.nn.ModuleDict({"a": GatedAttention(1024, q_heads, kv_heads, dim, 1e-6)})
    ops = CudaOps(model.to("cuda", torch.bfloat16), torch.device("cuda"), page_size=ps)
    cache = KVCache(CacheShapes(1, 1, 1, 8, 8, 4, 1, 4, 4), 8, 16, 4, torch.float32, "cuda")
    inputs = StepInputs(64, 8, 4, torch.device("cuda"))
    rows = [
        _Row(_Request(list(range(20)), 0, [0, 1]), 20, "prefill"),
        _Row(_Request(list(range(9)), 0, [2]), 9, "prefill"),
    ]
    for _ in range(3):  # warm up: FlashInfer's module, the pinned blocks
        ops.begin_step(inputs.stage(rows, cache, ops))
    torch.cuda.synchronize()
    torch.cuda._sleep(2_000_000_000)  # ~1 s of cycles on the stream
    spin = torch.cuda.Event()
    spin.record()
    ops.begin_step(inputs.stage(rows, cache, ops))
    assert not spin.query(), "staging or planning a prompt step waited for the queued work"
    torch.cuda.synchronize()

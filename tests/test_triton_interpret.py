"""Our Gated DeltaNet Triton kernels in Triton's interpreter on the CPU, against the torch
reference (engine/layers/gated_delta.py): the recurrence and the chunked kernels, fp32, rows
of one token to a few chunks, fresh and continuing (their slot's state), chunk sizes 16 to 64,
and the slots no row names left alone; and a prefill or mixed step's dispatch
(`gated_delta_prefill`: leading one-token rows recurrent, the rest chunked, into one output).
And the codec's kernels (engine/kernels/triton_snac.py) against the SNAC modules
(engine/models/snac.py), fp32 and bf16, alone and through the decoder's dispatch.

Needs the `triton` package (not a CPU dependency of the project: where it is missing, as in
CI, the test skips); the interpreter runs in a subprocess, since TRITON_INTERPRET must be set
before the kernels are defined. On the GPU the same kernels are held to the reference by
tests/test_gpu_kernels.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

# What both Gated DeltaNet checks run after: the step's metadata and the torch reference, row
# by row, of the outputs and the final states of the slots the rows name.
REFERENCE = r"""
import json
from types import SimpleNamespace
import torch
from engine.kernels import triton_gdn
from engine.kernels.gdn_config import SPLIT_LEGACY, SplitConfig
from engine.kernels.gdn_launch import PipelinedLaunch, RecurrentLaunch
from engine.layers.gated_delta import gdn_gates, torch_gated_delta_rule_recurrent

HK, HV, DK, DV = 2, 4, 16, 32


def step(lengths, cached, slots):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return SimpleNamespace(
        num_rows=len(lengths), num_new=list(lengths), cu_seqlens=cu,
        cached=torch.tensor(cached, dtype=torch.int32),
        state_slots=torch.tensor(slots, dtype=torch.int32),
    )


def reference(qkv, a, b, A_log, dt_bias, state0, meta):
    g, beta = gdn_gates(a, b, A_log, dt_bias)
    want, want_state = torch.empty(qkv.shape[0], HV, DV), state0.clone()
    cu, slots = meta.cu_seqlens, meta.state_slots.tolist()
    for r, n in enumerate(meta.num_new):
        s, e = cu[r].item(), cu[r + 1].item()
        q, k, v = qkv[s:e].split((HK * DK, HK * DK, HV * DV), -1)
        init = state0[slots[r] : slots[r] + 1] if meta.cached[r] else torch.zeros(1, HV, DK, DV)
        o, final = torch_gated_delta_rule_recurrent(
            q.reshape(1, n, HK, DK), k.reshape(1, n, HK, DK), v.reshape(1, n, HV, DV),
            g[None, s:e], beta[None, s:e], init,
        )
        want[s:e], want_state[slots[r]] = o[0], final[0]
    return want, want_state
"""

CHECK = r"""
# launch configurations that change what the kernels do, not only how they are launched
SPLIT_OPTIONS = {
    "legacy": SPLIT_LEGACY,  # the default computes the scores in the prepare pass; this doesn't
    "blocks": SplitConfig(states_bv=8, outputs_bv=32),
    "scores64": SplitConfig(chunk=64, scores_in_prepare=True, outputs_bv=8),
}
lengths, cached, slots = [1, 5, 33, 70], [0, 3, 0, 7], [3, 0, 5, 2]


def recurrent_one_pass(*args, **kw):  # the recurrence's other form (RecurrentLaunch.one_pass)
    other = RecurrentLaunch(one_pass=not RecurrentLaunch().one_pass)
    return triton_gdn.gated_delta_recurrent(*args, launch=other, **kw)


T = sum(lengths)
meta = step(lengths, cached, slots)
report = {}
# "fast": strong decay, independent keys. "slow": little decay and keys close to one shared
# direction, so a chunk's corrections reach across all its tokens (the solve's far terms).
for regime, (lo, hi), shared in (("fast", (0, 2.7), 0.0), ("slow", (-7, -5), 1.0)):
  torch.manual_seed(0)
  qkv = torch.randn(T, 2 * HK * DK + HV * DV)
  qkv[:, HK * DK : 2 * HK * DK] = shared * torch.randn(HK * DK) + 0.3 * qkv[:, HK * DK : 2 * HK * DK]
  a, b = torch.randn(T, HV), torch.randn(T, HV) + 2 * shared
  A_log, dt_bias = torch.empty(HV).uniform_(lo, hi), torch.randn(HV) * 0.5
  state0 = torch.randn(6, HV, DK, DV) * 0.3
  want, want_state = reference(qkv, a, b, A_log, dt_bias, state0, meta)
  runs = [("recurrent", triton_gdn.gated_delta_recurrent, {}),
          ("recurrent-one-pass", recurrent_one_pass, {})]
  runs += [(f"chunked{c}", triton_gdn.gated_delta_chunked, {"chunk": c}) for c in (16, 32, 64)]
  runs += [(f"split{c}", triton_gdn.gated_delta_chunked_split, {"split": SplitConfig(chunk=c)})
           for c in (16, 32, 64)]
  runs += [(f"split-{name}", triton_gdn.gated_delta_chunked_split, {"split": split})
           for name, split in SPLIT_OPTIONS.items()]
  for name, kernel, kw in runs:
      state = state0.clone()
      out = kernel(qkv, a, b, A_log, dt_bias, state, meta, HK, DK, DV, **kw)
      report[f"{regime}-{name}"] = {
          "out": (out - want).abs().max().item(),
          "state": (state - want_state).abs().max().item(),
          "others_untouched": torch.equal(state[[1, 4]], state0[[1, 4]]),
      }
print(json.dumps(report))
"""

# Prefill and mixed steps through `gated_delta_prefill`: a leading run of one-token rows (a
# mixed step's decode rows, their slots holding states) through the recurrence, the rest
# chunked: rows past a chunk, continuing a slot and fresh, and a later one-token row, which
# stays chunked. Also a step of one-token rows alone and one with none leading. `auto-split`
# lowers `auto`'s threshold (split_from) so that it takes the split kernel on these short rows.
MIXED_CHECK = r"""
steps = {
    "mixed": ([1, 1, 1, 40, 5, 1, 20], [4, 9, 2, 0, 6, 3, 0], [3, 0, 7, 5, 2, 8, 6]),
    "one-token-rows": ([1, 1, 1], [3, 0, 2], [3, 0, 7]),
    "no-prefix": ([40, 1, 7], [0, 3, 5], [5, 3, 2]),
}
kinds = {"triton": "triton", "triton_split": "triton_split", "auto": "auto", "auto-split": "auto"}
torch.manual_seed(0)
report = {}
for name, (lengths, cached, slots) in steps.items():
    T = sum(lengths)
    qkv = torch.randn(T, 2 * HK * DK + HV * DV)
    a, b = torch.randn(T, HV), torch.randn(T, HV)
    A_log, dt_bias = torch.empty(HV).uniform_(-2, 1), torch.randn(HV) * 0.5
    state0 = torch.randn(10, HV, DK, DV) * 0.3
    want, want_state = reference(qkv, a, b, A_log, dt_bias, state0, step(lengths, cached, slots))
    for label, kind in kinds.items():
        split_from = 32 if label == "auto-split" else 512
        state = state0.clone()
        meta = step(lengths, cached, slots)
        out = triton_gdn.gated_delta_prefill(kind, qkv, a, b, A_log, dt_bias, state, meta, HK, DK, DV,
                                             split_from=split_from)
        report[f"{name}-{label}"] = {
            "out": (out - want).abs().max().item(),
            "state": (state - want_state).abs().max().item(),
            "others_untouched": all(
                torch.equal(state[s], state0[s]) for s in range(10) if s not in slots
            ),
            "one_token_rows": meta.gdn_one_token_rows,
            "split_tables": getattr(meta, "gdn_chunks", None) is not None,
        }
print(json.dumps(report))
"""


# engine.gdn_decode pipelined: decode steps (one token a row; fresh rows, permuted slots) on the
# persistent kernel with fewer programs than tiles (each strides over several) and with more,
# in both forms of the update, and a mixed step's leading one-token rows through it
# (`gated_delta_prefill(..., pipelined=True)`), against the reference.
PIPELINED_CHECK = r"""
torch.manual_seed(0)
report = {}
decode = ([1] * 5, [3, 0, 2, 7, 1], [4, 0, 7, 2, 6])
mixed = ([1, 1, 1, 40, 5, 1, 20], [4, 9, 2, 0, 6, 3, 0], [3, 0, 7, 5, 2, 8, 6])
for programs in (3, 1000):  # SMS x PER_SM: under the 5 x 4 x 1 tiles, and over them
    pipelined = PipelinedLaunch(per_sm=1, sms=programs)
    for form in (False, True):
        launches = {"launch": RecurrentLaunch(one_pass=form), "pipelined_launch": pipelined}
        for name, (lengths, cached, slots) in (("decode", decode), ("mixed", mixed)):
            T = sum(lengths)
            qkv = torch.randn(T, 2 * HK * DK + HV * DV)
            a, b = torch.randn(T, HV), torch.randn(T, HV)
            A_log, dt_bias = torch.empty(HV).uniform_(-2, 1), torch.randn(HV) * 0.5
            state0 = torch.randn(10, HV, DK, DV) * 0.3
            meta = step(lengths, cached, slots)
            want, want_state = reference(qkv, a, b, A_log, dt_bias, state0, meta)
            state = state0.clone()
            args = (qkv, a, b, A_log, dt_bias, state, meta, HK, DK, DV)
            if name == "decode":
                out = triton_gdn.gated_delta_recurrent(*args, pipelined=True, **launches)
            else:
                out = triton_gdn.gated_delta_prefill("triton", *args, pipelined=True, **launches)
            report[f"{name}-programs{programs}-one_pass{form}"] = {
                "out": (out - want).abs().max().item(),
                "state": (state - want_state).abs().max().item(),
                "others_untouched": all(
                    torch.equal(state[s], state0[s]) for s in range(10) if s not in slots
                ),
            }
print(json.dumps(report))
"""


# The capturable op (engine.piecewise_gdn): steps padded to a bucket of 96 tokens, their rows'
# counts and chunk tables staged by StepInputs, the conv and Gated DeltaNet on grids set by the
# bucket alone (`causal_conv` and `gated_delta_fixed_grid` on `batch.gdn_tables`), against the
# per-row reference conv and recurrence: real tokens, both state pools, the padding tokens'
# outputs 0, and the slots no row names untouched.
FIXED_GRID_CHECK = r"""
import numpy as np
from engine.layers.gated_delta import torch_causal_conv1d
from engine.worker.step_inputs import StepInputs

BUCKET, SLOTS, KW = 96, 10, 4
# the default launch (fixed programs striding, the scores option), the legacy one (a program
# per row or chunk the bucket holds), and fewer programs than the rows and chunks, in 32- and
# 16-token chunks
SPLITS = {
    "default": SplitConfig(),
    "legacy": SPLIT_LEGACY,
    "persistent": SplitConfig(
        fixed_recurrent_rows=2, fixed_states_rows=1, fixed_chunks=2, scores_in_prepare=True
    ),
    "persistent16": SplitConfig(chunk=16, fixed_states_rows=2, fixed_chunks=3,
                                scores_in_prepare=False),
}
inputs = {
    chunk: StepInputs(BUCKET, 16, 8, torch.device("cpu"), slots=1, gdn_chunk=chunk)
    for chunk in (16, 32)
}
cache = SimpleNamespace(page_size=16, sink_page=200, sink_slot=SLOTS - 1)
ops = SimpleNamespace(reads_page_table=False)


def staged(lengths, cached, slots, chunk):
    rows = [
        SimpleNamespace(num_new=n, walk="prefill", request=SimpleNamespace(
            num_cached=c, pages=list(range(8 * i, 8 * i + 8)), tokens=[1] * (c + n), slot=s,
            rid=i))
        for i, (n, c, s) in enumerate(zip(lengths, cached, slots))
    ]
    return inputs[chunk].stage(rows, cache, ops, pad_tokens_to=BUCKET, gdn_tables=True)


steps = {
    "mixed": ([1, 1, 1, 40, 5, 1, 20], [4, 9, 2, 0, 6, 3, 0], [3, 0, 7, 5, 2, 8, 6]),
    "one-token-rows": ([1, 1, 1], [3, 0, 2], [3, 0, 7]),
    "no-prefix": ([40, 1, 7], [0, 3, 5], [5, 3, 2]),
}
torch.manual_seed(0)
C = 2 * HK * DK + HV * DV
report = {}
for name, (lengths, cached, slots) in steps.items():
    T = sum(lengths)
    mixed = torch.randn(BUCKET, C)
    a, b = torch.randn(BUCKET, HV), torch.randn(BUCKET, HV)
    A_log, dt_bias = torch.empty(HV).uniform_(-2, 1), torch.randn(HV) * 0.5
    weight = torch.randn(C, KW)
    conv0, state0 = torch.randn(SLOTS, C, KW - 1), torch.randn(SLOTS, HV, DK, DV) * 0.3
    meta = step(lengths, cached, slots)
    want_qkv, want_conv = torch.empty(T, C), conv0.clone()
    for r, (n, c, s) in enumerate(zip(lengths, cached, slots)):
        start = meta.cu_seqlens[r].item()
        init = conv0[s] if c else torch.zeros(C, KW - 1)
        want_qkv[start : start + n], want_conv[s] = torch_causal_conv1d(
            mixed[start : start + n], weight, init
        )
    want, want_state = reference(want_qkv, a[:T], b[:T], A_log, dt_bias, state0, meta)
    for label, split in SPLITS.items():
        batch = staged(lengths, cached, slots, split.chunk)
        conv, state = conv0.clone(), state0.clone()
        qkv = triton_gdn.causal_conv(mixed, weight, conv, batch)
        out = triton_gdn.gated_delta_fixed_grid(
            qkv, a, b, A_log, dt_bias, state, batch, HK, DK, DV, split=split
        )
        others = [s for s in range(SLOTS) if s not in slots]
        report[f"{name}/{label}"] = {
            "counts": batch.gdn_tables.counts.tolist(),
            "conv": (qkv[:T] - want_qkv).abs().max().item(),
            "conv_state": (conv - want_conv).abs().max().item(),
            "out": (out[:T] - want).abs().max().item(),
            "state": (state - want_state).abs().max().item(),
            "padding_out_zero": bool(out[T:].eq(0).all()),
            "others_untouched": torch.equal(state[others], state0[others])
            and torch.equal(conv[others], conv0[others]),
        }
print(json.dumps(report))
"""

CONV_CHECK = r"""
import json
from types import SimpleNamespace
import torch
from engine.kernels import triton_gdn
from engine.layers.gated_delta import torch_causal_conv1d, torch_causal_conv1d_update

torch.manual_seed(0)
C, K = 300, 4  # channels past one 256-wide block
weight = torch.randn(C, K)
state0 = torch.randn(6, C, K - 1)
report = {}
# A decode step: one token a row, one row with nothing cached (its window starts at zeros).
slots, cached = [3, 0, 5], [7, 2, 0]
x = torch.randn(3, C)
meta = SimpleNamespace(
    num_rows=3, cu_seqlens=torch.tensor([0, 1, 2, 3], dtype=torch.int32),
    token_row=torch.arange(3, dtype=torch.int32), cached=torch.tensor(cached, dtype=torch.int32),
    state_slots=torch.tensor(slots, dtype=torch.int32), is_decode=True,
)
want_state = state0.clone()
want_state[5] = 0  # the uncached row's window
want = torch_causal_conv1d_update(x, weight, want_state, torch.tensor(slots))
for name, decode in (("decode-fused", True), ("decode-two-launches", False)):
    state = state0.clone()
    meta.is_decode = decode
    out = triton_gdn.causal_conv(x, weight, state, meta)
    report[name] = {
        "out": (out - want).abs().max().item(),
        "state": (state[slots] - want_state[slots]).abs().max().item(),
        "others_untouched": torch.equal(state[[1, 2, 4]], state0[[1, 2, 4]]),
    }
# A prefill step: rows of 1, 2 and 9 tokens, fresh and continuing.
lengths, cached = [1, 2, 9], [4, 0, 3]
x = torch.randn(sum(lengths), C)
cu = torch.tensor([0, 1, 3, 12], dtype=torch.int32)
meta = SimpleNamespace(
    num_rows=3, cu_seqlens=cu, cached=torch.tensor(cached, dtype=torch.int32),
    token_row=torch.repeat_interleave(torch.arange(3), torch.tensor(lengths)).int(),
    state_slots=torch.tensor(slots, dtype=torch.int32), is_decode=False,
)
state = state0.clone()
out = triton_gdn.causal_conv(x, weight, state, meta)
errors, state_errors = [], []
for r, (n, c) in enumerate(zip(lengths, cached)):
    start = cu[r].item()
    init = state0[slots[r]] if c else torch.zeros(C, K - 1)
    want, want_window = torch_causal_conv1d(x[start : start + n], weight, init)
    errors.append((out[start : start + n] - want).abs().max().item())
    state_errors.append((state[slots[r]] - want_window).abs().max().item())
report["prefill"] = {"out": max(errors), "state": max(state_errors),
                     "others_untouched": torch.equal(state[[1, 2, 4]], state0[[1, 2, 4]])}
print(json.dumps(report))
"""


def _interpret(script: str) -> dict:
    """Run `script` under Triton's interpreter in a subprocess; its last stdout line, as JSON."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_gated_deltanet_kernels_in_the_interpreter_equal_the_reference():
    report = _interpret(REFERENCE + CHECK)
    kernels = {"recurrent", "recurrent-one-pass"}
    kernels |= {f"{k}{c}" for k in ("chunked", "split") for c in (16, 32, 64)}
    kernels |= {f"split-{name}" for name in ("legacy", "blocks", "scores64")}
    assert set(report) == {f"{r}-{k}" for r in ("fast", "slow") for k in kernels}
    for name, result in report.items():
        assert result["out"] < 1e-5 and result["state"] < 1e-5, (name, result)
        assert result["others_untouched"], name


def test_prefill_dispatch_splits_a_leading_run_of_one_token_rows_off_to_the_recurrence():
    """A mixed step's decode rows (the leading one-token rows) through the recurrence, the other
    rows through each chunked kind into the same output: outputs and final states equal the
    reference, other slots untouched; `auto` takes the split kernel only past its threshold."""
    report = _interpret(REFERENCE + MIXED_CHECK)
    steps, kinds = ("mixed", "one-token-rows", "no-prefix"), ("triton", "triton_split", "auto")
    assert set(report) == {f"{s}-{k}" for s in steps for k in (*kinds, "auto-split")}
    for name, result in report.items():
        assert result["out"] < 1e-5 and result["state"] < 1e-5, (name, result)
        assert result["others_untouched"], name
    leading = {"mixed": 3, "one-token-rows": 3, "no-prefix": 0}
    for step, count in leading.items():
        for kind in (*kinds, "auto-split"):
            result = report[f"{step}-{kind}"]
            assert result["one_token_rows"] == count, (step, kind)
            split = kind in ("triton_split", "auto-split") and step != "one-token-rows"
            assert result["split_tables"] == split, (step, kind)


def test_pipelined_decode_recurrence_equals_the_reference():
    """engine.gdn_decode pipelined (`_gdn_decode_pipelined_kernel`): a decode step's rows (one
    fresh) and a mixed step's leading decode rows, on fewer programs than tiles (each program
    striding over several tiles, as on the GPU's SMS x PER_SM) and on one a tile, in both forms
    of the update: outputs and final states equal the reference, other slots untouched."""
    report = _interpret(REFERENCE + PIPELINED_CHECK)
    assert set(report) == {
        f"{s}-programs{p}-one_pass{f}"
        for s in ("decode", "mixed") for p in (3, 1000) for f in (False, True)
    }  # fmt: skip
    for name, result in report.items():
        assert result["out"] < 1e-5 and result["state"] < 1e-5, (name, result)
        assert result["others_untouched"], name


def test_fixed_grid_gated_deltanet_op_on_a_padded_step_equals_the_reference():
    """The capturable op (engine.piecewise_gdn): a mixed step (one-token rows with cached
    states leading; rows past a chunk, fresh and continuing; a later one-token row), a step of
    one-token rows alone and one with none leading, each padded to a bucket with its tables
    staged by StepInputs: conv outputs and windows, Gated DeltaNet outputs and states equal the
    reference; the padding tokens' outputs are 0; no other slot of either pool is touched. So
    too with fewer programs than rows and chunks, each striding over them (SplitConfig's
    fixed_* counts), the scores option on, and 16-token chunks staged by the step inputs."""
    report = _interpret(REFERENCE + FIXED_GRID_CHECK)
    counts = {
        "mixed": [0, 3, 7, 5],  # rows 3-6 (40, 5, 1, 20 tokens): 2 + 1 + 1 + 1 chunks
        "one-token-rows": [0, 3, 3, 0],
        "no-prefix": [0, 0, 3, 4],
    }
    counts16 = {"mixed": [0, 3, 7, 7], "one-token-rows": [0, 3, 3, 0], "no-prefix": [0, 0, 3, 5]}
    splits = ("default", "legacy", "persistent", "persistent16")
    assert set(report) == {f"{step}/{split}" for step in counts for split in splits}
    for name, result in report.items():
        step, split = name.split("/")
        assert result["counts"] == (counts16 if split.endswith("16") else counts)[step], name
        assert result["conv"] < 1e-5 and result["conv_state"] < 1e-6, (name, result)
        assert result["out"] < 1e-5 and result["state"] < 1e-5, (name, result)
        assert result["padding_out_zero"] and result["others_untouched"], (name, result)


def test_conv_kernels_in_the_interpreter_equal_the_reference():
    """The short causal conv: a decode step in its fused launch and in the general two, and a
    prefill step of fresh and continuing rows, against the torch reference, outputs and the
    conv-state windows; the slots no row names untouched."""
    report = _interpret(CONV_CHECK)
    assert set(report) == {"decode-fused", "decode-two-launches", "prefill"}
    for name, result in report.items():
        assert result["out"] < 1e-5 and result["state"] < 1e-6, (name, result)
        assert result["others_untouched"], name


# The codec's kernels (engine/kernels/triton_snac.py) against the torch modules they replace,
# fp32 and bf16 activations and parameters, each measured against the fp32 reference on the
# same (rounded) values: err = max |got - want| / (1 + |want|). Odd channel counts and lengths,
# rows longer than a program's block, rows shorter than the conv's reach (dilation 9: 27 steps
# each side), and channels with alpha 0 (the 1e-9 keeps them finite) and below 0.
SNAC_CHECK = r"""
import json
import torch
from engine.kernels import triton_snac
from engine.models import snac_layers


def params(c, dtype):
    alpha = torch.empty(1, c, 1).uniform_(0.2, 2.5)
    alpha[0, 1 % c, 0] = 0.0
    alpha[0, 2 % c, 0] = -0.7
    return alpha.to(dtype)


def errors(got, want, reference):
    rel = lambda t: ((t.float() - want).abs() / (1 + want.abs())).max().item()
    return {"err": rel(got), "reference_err": rel(reference), "dtype": str(got.dtype),
            "shape": list(got.shape) == list(want.shape)}  # reference_err: for the record


torch.manual_seed(0)
report = {}
for dtype in (torch.float32, torch.bfloat16):
    name = "fp32" if dtype == torch.float32 else "bf16"
    for b, c, t in ((2, 5, 37), (3, 7, 1500), (1, 1, 1), (2, 3, 1024)):
        x, alpha = (torch.randn(b, c, t) * 2).to(dtype), params(c, dtype)
        want = snac_layers.snake(x.float(), alpha.float())
        report[f"snake-{name}-{b}x{c}x{t}"] = errors(
            triton_snac.snake(x, alpha), want, snac_layers.snake(x, alpha)
        )
    for d in (1, 3, 9):
        for b, c, t in ((2, 5, 37), (1, 3, 5), (2, 7, 600)):
            unit = snac_layers.ResidualUnit(c, d, groups=c)
            with torch.no_grad():
                unit.block[0].alpha.copy_(params(c, torch.float32))
                unit.block[2].alpha.copy_(params(c, torch.float32).flip(1))
                unit.block[1].weight.normal_(0, 0.4)
                unit.block[1].bias.normal_(0, 0.2)
            unit = unit.to(dtype)
            s1, conv, s2, _ = unit.block
            x = (torch.randn(b, c, t) * 2).to(dtype)
            with torch.no_grad():
                reference = unit.block[:3](x)
                got = triton_snac.residual_snake_conv(x, s1.alpha, conv.weight, conv.bias, s2.alpha, d)
                want = unit.float().block[:3](x.float())
            report[f"unit-d{d}-{name}-{b}x{c}x{t}"] = errors(got, want, reference)
# a per-channel bias added to x as the kernels read it (engine.codec_kernels folded), fp32
for b, c, t in ((2, 5, 37), (1, 3, 600)):
    x, alpha, shift = torch.randn(b, c, t) * 2, params(c, torch.float32), torch.randn(c)
    want = snac_layers.snake(x + shift[:, None], alpha)
    report[f"shift-snake-{b}x{c}x{t}"] = errors(triton_snac.snake(x, alpha, shift), want, want)
    for d in (1, 9):
        unit = snac_layers.ResidualUnit(c, d, groups=c)
        with torch.no_grad():
            unit.block[1].weight.normal_(0, 0.4)
            unit.block[1].bias.normal_(0, 0.2)
            s1, conv, s2, _ = unit.block
            got = triton_snac.residual_snake_conv(x, s1.alpha, conv.weight, conv.bias, s2.alpha, d, shift)
            want = unit.block[:3](x + shift[:, None])
        report[f"shift-unit-d{d}-{b}x{c}x{t}"] = errors(got, want, want)
    # a folded noise block's input (engine.codec_kernels folded_noise), with a shift and without
    noise = torch.randn(1, 1, t)
    want = (x + shift[:, None]) * noise
    report[f"shift-scale-{b}x{c}x{t}"] = errors(triton_snac.shift_scale(x, shift, noise), want, want)
    report[f"shift-scale-none-{b}x{c}x{t}"] = errors(
        triton_snac.shift_scale(x, None, noise), x * noise, x * noise
    )
print(json.dumps(report))
"""

# The whole decoder on the kernels, as `Snake1d` and `ResidualUnit` dispatch them on CUDA:
# here every tensor claims to be a CUDA tensor (this subprocess only), so the dispatch runs on
# the CPU, the kernels in the interpreter. A small config (latent 8, 16 channels, 4 latent
# steps) keeps the interpreter's programs few; fp32 against the reference network (same seed).
SNAC_DECODER_CHECK = r"""
import json
import torch
from engine.kernels import triton_snac
from engine.models import snac

calls = {"snake": 0, "residual_snake_conv": 0, "shift_scale": 0}
for name in calls:
    def counted(*args, _kernel=getattr(triton_snac, name), _name=name, **options):
        assert not options.get("approx")  # engine.codec_sine exact: the interpreter has no SFU sine
        calls[_name] += 1
        return _kernel(*args, **options)
    setattr(triton_snac, name, counted)
torch.Tensor.is_cuda = property(lambda self: True)
config = snac.SnacConfig(latent_dim=8, decoder_dim=16, latent_steps=4)


def network(kernels):
    # the seeded weights have every alpha 1 and every bias 0: redrawn here (the same for each
    # network), so that a swapped alpha or a dropped bias in the dispatch shows
    net = snac.SnacDecoder.random(config, 0, torch.float32, "cpu", kernels)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if name.endswith("alpha"):
                p.uniform_(0.3, 2.0, generator=gen)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.1, generator=gen)
    return net


gen = torch.Generator().manual_seed(0)
codes = [torch.randint(0, 4096, (2, 4 // s), generator=gen) for s in config.vq_strides]
want = network("torch").decode(codes)
report = {}
for kernels in ("snake", "fused", "folded", "folded_noise"):
    calls.update(snake=0, residual_snake_conv=0, shift_scale=0)
    got = network(kernels).decode(codes)
    report[kernels] = {"err": (got - want).abs().max().item(), "calls": dict(calls)}
print(json.dumps(report))
"""


def test_snac_kernels_in_the_interpreter_equal_the_reference():
    """`snake` and `residual_snake_conv` (dilations 1, 3, 9): fp32 equals the reference to
    float rounding; bf16 computes in fp32 and rounds once, on the store, so it is within one
    bf16 ulp (2^-7 relative) of the fp32 reference on the same inputs, where the bf16
    reference, rounding after every op, is up to 0.04 off on the units. (One ulp, not half:
    the interpreter's fp32 -> bf16 conversion truncates, where the GPU's rounds to nearest.)"""
    report = _interpret(SNAC_CHECK)
    assert len(report) == 2 * (4 + 3 * 3) + 2 * (1 + 2 + 2), sorted(report)
    for name, result in report.items():
        assert result["shape"], name
        if "fp32" in name or name.startswith("shift"):
            assert result["dtype"] == "torch.float32" and result["err"] < 1e-5, (name, result)
        else:
            assert result["dtype"] == "torch.bfloat16", name
            assert result["err"] <= 2**-7 + 1e-5, (name, result)


def test_snac_decoder_dispatches_its_kernels_and_decodes_as_the_reference():
    """`engine.codec_kernels` snake, fused and folded through the modules' CUDA dispatch:
    every Snake (4 per block's units x 2 + 1 per block + the last: 29) on the Snake kernel, or
    each of the 12 residual units on the fused kernel and the other 5 Snakes on the Snake
    kernel (folded: the units' 1x1 convs adding into their inputs in place, their biases
    handed on to the next kernel; folded_noise: each block's noise block too, on the
    shift-scale kernel and a GEMM, its transposed conv's bias handed on); the decoded audio
    equals the reference network's to float rounding (the biases are redrawn nonzero and the
    noise is drawn: a bias folded wrong or dropped, or a noise applied wrong, shows)."""
    report = _interpret(SNAC_DECODER_CHECK)
    units = {"snake": 5, "residual_snake_conv": 12, "shift_scale": 0}
    assert report["snake"]["calls"] == {"snake": 29, "residual_snake_conv": 0, "shift_scale": 0}
    assert report["fused"]["calls"] == units
    assert report["folded"]["calls"] == units
    # folded_noise: each block's noise block on the kernel too, its transposed conv's bias handed on
    assert report["folded_noise"]["calls"] == units | {"shift_scale": 4}
    for kernels, result in report.items():
        assert result["err"] < 1e-5, (kernels, result)


# The dense GEMM for few rows (engine/kernels/triton_gemm.py) against fp32 math on the same
# (rounded) inputs: small shapes, 0.8b-like ones cut in N (the interpreter runs each program in
# Python), rows 1, 7 and 64, x a strided view (every other row of a wider buffer), K not a
# multiple of BLOCK_K, and the K split forced on and off. Triton 3.6's interpreter multiplies
# bf16 operands of tl.dot as their uint16 bit patterns (create_dot never converts them), so
# this subprocess widens them to fp32 first (WIDENED_BF16_DOT), as the GPU's MMA does (exact
# products in fp32).
WIDENED_BF16_DOT = r"""
import numpy as np
from triton.runtime import interpreter

create_dot = interpreter.InterpreterBuilder.create_dot


def widened_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    import triton.language as tl
    if a.dtype.scalar == tl.bfloat16:
        widen = lambda t: interpreter.TensorHandle(
            interpreter._convert_float(t.data, tl.bfloat16, tl.float32, None).view(np.float32),
            tl.float32,
        )
        a, b = widen(a), widen(b)
    return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)


interpreter.InterpreterBuilder.create_dot = widened_dot
"""

GEMM_CHECK = r"""
import json
import torch
from engine.kernels import triton_gemm

torch.manual_seed(0)
report = {}
shapes = [(1, 96, 256), (7, 200, 384), (64, 136, 1024), (16, 64, 200), (64, 72, 3584),
          (1, 130, 2048), (7, 256, 1024)]
for dtype in (torch.bfloat16, torch.float16):
    for m, n, k in shapes:
        for split in (None, 1, 3):
            wide = torch.randn(2 * m, k).to(dtype)
            x = wide[::2]  # rows strided
            w = (torch.randn(n, k) / k**0.5).to(dtype)
            want = x.float() @ w.float().T
            got = triton_gemm.skinny_linear(x, w, split=split)
            plan = triton_gemm.plan(m, n, k, split)
            rel = ((got.float() - want).abs() / (1 + want.abs())).max().item()
            report[f"{str(dtype)[6:]}-{m}x{n}x{k}-split{split}"] = {
                "err": rel, "dtype": str(got.dtype), "shape": list(got.shape),
                "split": plan.split,
            }
    out = torch.full((7, 2 * 200), 7.0, dtype=dtype)  # into a view whose rows are strided
    x, w = torch.randn(7, 384).to(dtype), torch.randn(200, 384).to(dtype)
    view = out[:, :200]
    triton_gemm.skinny_linear(x, w, out=view, split=2)
    want = x.float() @ w.float().T
    report[f"{str(dtype)[6:]}-out-view"] = {
        "err": ((view.float() - want).abs() / (1 + want.abs())).max().item(),
        "rest_untouched": bool((out[:, 200:] == 7.0).all()), "split": 2,
        "dtype": str(view.dtype), "shape": list(view.shape),
    }
print(json.dumps(report))
"""


def test_skinny_gemm_in_the_interpreter_equals_fp32_math():
    """skinny_linear against x.float() @ w.float().T: it accumulates in fp32 and rounds once,
    so it is within one ulp of the output dtype (bf16 2^-7, fp16 2^-10 relative; the
    interpreter's fp32 -> bf16 truncates) plus fp32 summation-order noise, whatever the split.
    The split launches sum in a fixed order; the forced split 3 of K = 200 takes 2 steps."""
    report = _interpret(WIDENED_BF16_DOT + GEMM_CHECK)
    assert len(report) == 2 * (7 * 3 + 1), sorted(report)
    for name, result in report.items():
        ulp = 2**-7 if name.startswith("bfloat16") else 2**-10
        assert result["err"] <= ulp + 1e-5, (name, result)
        assert result["dtype"] == "torch." + name.split("-")[0], name
        assert result.get("rest_untouched", True), name
    assert report["bfloat16-64x72x3584-splitNone"]["split"] == 7  # 0.8b's down_proj split
    assert report["bfloat16-1x96x256-splitNone"]["split"] == 1
    assert report["bfloat16-1x130x2048-split3"]["split"] == 3


ROPE_CHECK = r"""
import json
from types import SimpleNamespace
import torch
from engine.config import KernelsConfig
from engine.kernels import triton_rope
from engine.kernels.cuda_ops import CudaOps
from engine.layers.norm import RMSNorm
from engine.layers.rotary import RotaryEmbedding, apply_rotary
from engine.kernels.torch_ops import TorchOps

torch.manual_seed(0)
report = {}
positions = torch.tensor([0, 1, 7, 300, 4095])
for dtype in (torch.float32, torch.bfloat16):
    for heads, dim, rotary in ((3, 128, 128), (2, 64, 16)):  # Llama's (full), a partial one
        cos, sin = RotaryEmbedding(rotary, 5e5)(positions)
        packed = torch.randn(5, 3 * heads * dim).to(dtype)  # a projection's q | k | v
        x = packed[:, heads * dim : 2 * heads * dim].view(5, heads, dim)  # strided rows
        got = triton_rope.rope(x, cos, sin)
        want = apply_rotary(x, cos, sin)
        norm = RMSNorm(dim)
        norm.weight.data.normal_(0, 0.1)
        w = 1 + norm.weight.float()  # before norm.to(dtype), which converts it in place
        normed = triton_rope.head_norm_rope(x, w, cos, sin, 1e-6)
        want_normed = TorchOps().qk_rope(x, x, cos, sin, (norm.to(dtype), norm.to(dtype)))[0]
        # q and k in one launch (an attention layer's qk_rope): each head's bits as alone
        k_norm = RMSNorm(dim)
        k_norm.weight.data.normal_(0, 0.1)
        k = packed[:, 2 * heads * dim :].view(5, heads, dim)[:, :2]  # fewer k heads, strided
        kw = 1 + k_norm.weight.float()
        pair = triton_rope.qk_rope(x, k, w, kw, cos, sin, 1e-6, 1e-5)
        alone = (normed, triton_rope.head_norm_rope(k, kw, cos, sin, 1e-5))
        plain_pair = triton_rope.qk_rope(x, k, None, None, cos, sin)
        plain_alone = (got, triton_rope.rope(k, cos, sin))
        report[f"{str(dtype)[6:]}-{heads}x{dim}-rot{rotary}"] = {
            "pair_same": all(torch.equal(a, b) for a, b in zip(pair + plain_pair,
                                                               alone + plain_alone)),
            "rope": (got.float() - want.float()).abs().max().item(),
            "rope_scale": want.float().abs().max().item(),
            "norm_rope": (normed.float() - want_normed.float()).abs().max().item(),
            "norm_rope_scale": want_normed.float().abs().max().item(),
            "dtype": str(got.dtype), "contiguous": got.is_contiguous(),
            "untouched": torch.equal(got[..., rotary:], x[..., rotary:]),
        }
        # a decode step's K and V stored in the same launch (kv=): the caches store_kv fills
        # from the rotated k, slot -1 (a padding row) stored nowhere
        v = torch.randn(5, 2, dim).to(dtype)
        slots = torch.tensor([9, 3, -1, 30, 0])
        caches = [torch.zeros(4, 8, 2, dim, dtype=dtype) for _ in range(4)]
        store = triton_rope.KvStore(v, caches[0], caches[1], slots)
        fused = triton_rope.qk_rope(x, k, w, kw, cos, sin, 1e-6, 1e-5, kv=store)
        triton_rope.store_kv(pair[1].view(5, -1), v.view(5, -1), caches[2], caches[3], slots)
        report[f"{str(dtype)[6:]}-{heads}x{dim}-rot{rotary}"]["kv_same"] = (
            torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
            and all(torch.equal(a, b) for a, b in zip(fused, pair)) and caches[0].any().item())

# which steps store K and V with the rotary (CudaOps._kv_early): a decode step; not the
# piecewise runner's (a token bucket) or a prefill step, whose attention op stores them; the
# caches the same either way
calls = []
real_store = triton_rope.store_kv
triton_rope.store_kv = lambda *args: calls.append("attention") or real_store(*args)
routes = {}
for name, decode, bucket in (("decode", True, None), ("piecewise", True, 16),
                             ("prefill", False, None)):
    ops = CudaOps(torch.nn.Linear(1, 1), torch.device("cpu"), 8, config=KernelsConfig())
    ops.attention_backend = SimpleNamespace(run=lambda q, kc, vc, scale: q)  # routing only
    batch = SimpleNamespace(is_decode=decode, token_bucket=bucket, slot_mapping=slots)
    kc, vc = (torch.zeros(4, 8, 2, 64) for _ in range(2))
    q, k = torch.randn(5, 3, 64), torch.randn(5, 2, 64)
    v = torch.randn(5, 2, 64)
    cos, sin = RotaryEmbedding(16, 5e5)(positions)
    calls.clear()
    q2, k2 = ops.qk_rope(q, k, cos, sin, kv=(v, kc, vc, batch))
    ops.attention(q2, k2, v, kc, vc, batch, 1.0)
    want_k, want_v = torch.zeros_like(kc), torch.zeros_like(vc)
    real_store(k2.view(5, -1), v.view(5, -1), want_k, want_v, slots)
    routes[name] = {"attention_stored": calls == ["attention"],
                    "same": torch.equal(kc, want_k) and torch.equal(vc, want_v)}
# attention on a decode step whose qk_rope stored nothing: refused, not attended unstored
try:
    ops.attention(q2, k2, v, kc, vc, SimpleNamespace(is_decode=True, token_bucket=None,
                                                     slot_mapping=slots), 1.0)
    routes["bare"] = None
except RuntimeError as exc:
    routes["bare"] = str(exc)
report["routes"] = routes
print(json.dumps(report))
"""


def test_rotary_kernels_in_the_interpreter_equal_the_reference():
    """Llama's rotary (`rope`) and Qwen3.5's q/k norm + partial rotary (`head_norm_rope`, one
    kernel with a norm switch) against the torch reference on strided heads: fp32 to fp32
    rounding; bf16 within one bf16 ulp of the values' scale for the rotary alone (one rounding
    of the same fp32 result; the interpreter's fp32 -> bf16 conversion truncates where torch
    rounds) and four for the norm + rotary (rounded after the norm, then after the rotation,
    which mixes two rounded values). The dims past the rotary part pass through unchanged.
    q and k in one launch (`qk_rope`, each with its own norm and eps, k fewer heads) store
    what each alone does; with `kv=`, the caches hold what `store_kv` of the rotated k and v
    puts there. The CUDA ops store them so on a decode step alone (`_kv_early`), and the
    attention op does everywhere else: each slot written once, by one of the two."""
    report = _interpret(ROPE_CHECK)
    routes = report.pop("routes")
    assert len(report) == 4, sorted(report)
    for name, result in report.items():
        fp32 = name.startswith("float32")
        tol = 1e-5 if fp32 else 2**-7 * max(1.0, result["rope_scale"])
        assert result["rope"] <= tol, (name, result)
        tol = 1e-5 if fp32 else 4 * 2**-7 * max(1.0, result["norm_rope_scale"])
        assert result["norm_rope"] <= tol, (name, result)
        assert result["dtype"] == "torch." + name.split("-")[0] and result["contiguous"], name
        assert result["untouched"], name
        assert result["pair_same"], name  # q and k in one launch: the same bits as two
        assert result["kv_same"], name  # with K and V stored: store_kv's caches
    assert "qk_rope(..., kv=...) first" in routes.pop("bare")
    assert routes == {
        "decode": {"attention_stored": False, "same": True},
        "piecewise": {"attention_stored": True, "same": True},
        "prefill": {"attention_stored": True, "same": True},
    }


ARGMAX = """
import json
import torch
from engine.kernels import triton_argmax

torch.manual_seed(0)
report = {}
for n in (248_320, 5_000, 4_096, 17):  # 0.8b's vocabulary, a ragged last part, one part, tiny
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(5, n).to(dtype)
        x[1, n // 2] = x[1, n - 1] = 9.0  # a tie across parts: the first column wins
        x[2, 3] = x[2, 7] = 9.0  # a tie within one block
        x[3] = float("-inf")  # nothing finite: column 0, as torch picks
        x[4, n - 1] = 9.0  # the maximum in the last column
        got = triton_argmax.argmax(x)
        report[f"{n}-{dtype}"] = got.tolist() == x.argmax(-1).tolist() and got.dtype == torch.int64
x = torch.randn(3, 2 * 5_000)[:, :5_000]  # rows strided
report["strided"] = triton_argmax.argmax(x).tolist() == x.argmax(-1).tolist()
report["no rows"] = triton_argmax.argmax(torch.zeros(0, 10)).shape == (0,)
print(json.dumps(report))
"""


def test_argmax_kernel_in_the_interpreter_equals_torchs_first_maximum():
    """engine/kernels/triton_argmax.py against torch.argmax: 0.8b's vocabulary and ragged ones,
    bf16 and fp32, ties across parts and within a block (the first column), a row of -inf,
    the maximum in the last column, strided rows, no rows."""
    report = _interpret(ARGMAX)
    assert all(report.values()), report


# Our decode attention (engine/kernels/triton_decode.py) against dense fp32 attention over each
# row's gathered pages, on the same (rounded) inputs. Two models: group 3 at head dim 32 and
# page 16 (tiles of 64 tokens: several pages a tile), group 4 at head dim 64 and page 48 (a tile
# crosses a page boundary mid-page); a non-default scale each. Rows of 1, 15, 16, 17, 100 and
# 300 tokens (past every split's tile at 2 and 5 splits) on scattered pages, and a padding row
# as the step inputs stage one (the sink page, one token); q a strided view. Splits 1, 2, 5 and
# the default (16 at 7 rows); fp32 and bf16.
DECODE_CHECK = r"""
import json
import torch
from engine.kernels import triton_decode
from engine.kernels.decode_config import decode_splits

LENGTHS = [1, 15, 16, 17, 100, 300]


def layout(page, pages, sink, lengths):
    # each row's pages scattered over the pool; the padding row last, on the sink page
    free = torch.randperm(pages - 1).tolist()
    indices, indptr, last = [], [0], []
    for n in lengths:
        count = -(-n // page)
        indices += [free.pop() for _ in range(count)]
        indptr.append(len(indices))
        last.append(n - (count - 1) * page)
    indices.append(sink), indptr.append(len(indices)), last.append(1)
    i32 = {"dtype": torch.int32}
    return torch.tensor(indices, **i32), torch.tensor(indptr, **i32), torch.tensor(last, **i32)


def dense(q, k_cache, v_cache, indices, indptr, last, scale):
    # fp32 attention of each row's query over its tokens, query head h on KV head h // group
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // kv_heads
    out = torch.empty(q.shape, dtype=torch.float32)
    for r in range(q.shape[0]):
        pages = indices[indptr[r] : indptr[r + 1]].long()
        n = (len(pages) - 1) * page + int(last[r])
        k = k_cache[pages].flatten(0, 1)[:n].float().repeat_interleave(group, dim=1)
        v = v_cache[pages].flatten(0, 1)[:n].float().repeat_interleave(group, dim=1)
        scores = torch.einsum("hd,thd->ht", q[r].float(), k) * scale
        out[r] = torch.einsum("ht,thd->hd", scores.softmax(-1), v)
    return out


torch.manual_seed(0)
report = {}
for q_heads, kv_heads, dim, page, scale in ((6, 2, 32, 16, 0.3), (8, 2, 64, 48, 0.05)):
    pages = 40 if page == 16 else 16
    indices, indptr, last = layout(page, pages, pages - 1, LENGTHS)
    rows = len(LENGTHS) + 1
    for dtype in (torch.float32, torch.bfloat16):
        k_cache, v_cache = torch.randn(2, pages, page, kv_heads, dim).to(dtype)
        q = torch.randn(rows, q_heads, 2 * dim).to(dtype)[..., :dim]  # a strided view
        want = dense(q, k_cache, v_cache, indices, indptr, last, scale)
        for splits in (1, 2, 5, None):
            got = triton_decode.paged_decode(
                q, k_cache, v_cache, indices, indptr, last, scale, splits=splits
            )
            report[f"g{q_heads // kv_heads}-d{dim}-p{page}-{str(dtype)[6:]}-s{splits}"] = {
                "err": (got.float() - want).abs().max().item(),
                "scale": want.abs().max().item(),
                "padding_row": (got[-1].float() - want[-1]).abs().max().item(),
                "dtype": str(got.dtype), "shape": list(got.shape),
                "default_splits": decode_splits(rows, kv_heads),
            }
empty = triton_decode.paged_decode(q[:0], k_cache, v_cache, indices, indptr[:1], last[:0], 0.1)
report["no rows"] = list(empty.shape)
print(json.dumps(report))
"""


def test_decode_attention_in_the_interpreter_equals_dense_attention():
    """paged_decode against fp32 attention over the gathered pages: fp32 to float rounding
    (the splits merge in another order), bf16 within two bf16 ulps of the outputs' scale (the
    probabilities rounded to bf16 for the P V product, then the output once; the interpreter's
    conversions truncate); the padding row too; the output in q's dtype and shape; a step of
    no rows launches nothing."""
    report = _interpret(WIDENED_BF16_DOT + DECODE_CHECK)
    assert report.pop("no rows") == [0, 8, 64]  # a step of no rows launches nothing
    assert len(report) == 2 * 2 * 4, sorted(report)
    for name, result in report.items():
        fp32 = "-float32-" in name
        tol = 1e-5 if fp32 else 2 * 2**-7 * max(1.0, result["scale"])
        assert result["err"] <= tol and result["padding_row"] <= tol, (name, result)
        assert result["dtype"] == ("torch.float32" if fp32 else "torch.bfloat16"), name
        assert result["shape"] == [7, int(name[1]) * 2, int(name.split("-d")[1].split("-")[0])]
        assert result["default_splits"] == 16  # 7 rows x 2 KV heads on 132 SMs


# The Triton decode path through the CUDA ops (engine/kernels/cuda_ops.py, FlashInferAttention
# with decode_kernel "triton", FlashInfer itself a stand-in: tests/fake_flashinfer.py): decode
# steps staged by the step inputs, eagerly and padded to a graph bucket, bf16; qk_rope stores
# the step's K/V (a decode step's, in its launch) and the op attends over the cache with the
# layer's scale, against torch_paged_attention on a copy of the cache.
OPS_CHECK = r"""
import json
import sys
from types import SimpleNamespace
import torch
from tests import fake_flashinfer

sys.modules["flashinfer"] = fake_flashinfer.module()
from engine.config import KernelsConfig
from engine.kernels.cuda_ops import CudaOps
from engine.layers.attention import Attention, torch_paged_attention
from engine.worker.step_inputs import StepInputs

PAGE, SINK, Q_HEADS, KV_HEADS, DIM = 16, 30, 8, 2, 32
model = torch.nn.ModuleDict({"a": Attention(64, Q_HEADS, KV_HEADS, DIM)}).to(torch.bfloat16)
ops = CudaOps(model, torch.device("cpu"), PAGE, config=KernelsConfig(decode_attention="triton"))
cache = SimpleNamespace(page_size=PAGE, sink_page=SINK, sink_slot=9)
inputs = StepInputs(64, 8, 8, torch.device("cpu"), slots=2)


def stage(cached, reads_page_table, bucket):
    rows = [
        SimpleNamespace(num_new=1, walk="decode", request=SimpleNamespace(
            num_cached=c, pages=list(range(7 * i, 7 * i + 7)), tokens=[1] * (c + 1), slot=i, rid=i,
        ))
        for i, c in enumerate(cached)
    ]
    return inputs.stage(rows, cache, SimpleNamespace(reads_page_table=reads_page_table),
                        pad_to=bucket)


torch.manual_seed(0)
report = {}
for name, cached, bucket in (("eager", [5, 40, 16, 99], None), ("bucket", [0, 31, 63], 8)):
    k_cache, v_cache = (torch.randn(SINK + 1, PAGE, KV_HEADS, DIM).bfloat16() for _ in "kv")
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    batch = stage(cached, False, bucket)
    ref_batch = stage(cached, True, None)
    rows = len(cached)
    q = torch.randn(batch.num_rows, Q_HEADS, DIM).bfloat16()
    k, v = torch.randn(2, batch.num_rows, KV_HEADS, DIM).bfloat16()
    slot = ops.begin_step(batch, bucket)
    # as the layer calls them: qk_rope (an identity rotary here) stores a decode step's K and V
    # (CudaOps._kv_early), then attention attends
    half = torch.ones(batch.num_rows, DIM // 2)
    q, k = ops.qk_rope(q, k, half, 0 * half, kv=(v, k_cache, v_cache, batch))
    got = ops.attention(q, k, v, k_cache, v_cache, batch, 0.2)
    want = torch_paged_attention(q[:rows], k[:rows], v[:rows], ref_k, ref_v, ref_batch, 0.2)
    report[name] = {
        "err": (got[:rows].float() - want.float()).abs().max().item(),
        "scale": want.float().abs().max().item(),
        "caches_equal": torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v),
        "rows": got.shape[0], "slot": slot,
        "flashinfer_plans": sum(w.plans for w in sys.modules["flashinfer"].built),
    }
print(json.dumps(report))
"""


def test_cuda_ops_decode_steps_on_the_triton_path_equal_the_reference():
    """`engine.decode_attention: triton` through CudaOps.attention (FlashInfer a stand-in,
    Triton interpreted): an eager decode step and one padded to a bucket of 8 rows (padding
    rows on the sink page, storing nothing) store the same K/V as the reference and attend as
    torch_paged_attention does at the layer's scale (0.2, not 1/sqrt(head_dim)), to bf16
    rounding; no FlashInfer wrapper is planned; the slots alternate."""
    report = _interpret(WIDENED_BF16_DOT + OPS_CHECK)
    assert set(report) == {"eager", "bucket"}
    for name, result in report.items():
        assert result["err"] <= 2 * 2**-7 * max(1.0, result["scale"]), (name, result)
        assert result["caches_equal"] and result["flashinfer_plans"] == 0, (name, result)
    assert (report["eager"]["rows"], report["bucket"]["rows"]) == (4, 8)
    assert (report["eager"]["slot"], report["bucket"]["slot"]) == (0, 1)

"""The kernel launches of one decode step through the CUDA ops, counted on a CPU, no GPU: what
each layer launches, and the step's total.

The model has the size's widths, vocabulary and layer kinds but few layers (qwen35: 8, two of
them attention; Llama: 2), which changes no layer's launches. A decode step
of `--rows` rows (contexts of `--context` tokens) is staged by the step inputs and run through
CudaOps as a decode graph would capture it (the model's forward, then the greedy argmax), with
the scenario's kernel settings and `--set`'s. Every Triton launch is recorded, not run
(engine/kernels/offline.py's recorder; its outputs stay unwritten, which nothing here reads),
the decode attention on our kernel (`engine.decode_attention: triton`, FlashInfer stubbed);
and each aten op that is no view or bare allocation is counted as a torch kernel (a GEMM past
our rows, the embedding, an elementwise op: what a GPU would launch for it).

    python -m benchmarks.count_launches --size 0.8b [--rows 64] [--set engine.dense_epilogues=false]
    python -m benchmarks.count_launches --scenario orpheus --size 3b

A layer's launches repeat in every layer of its kind but the last, whose down_proj is summed
(its output goes to the final norm's indexed rows): the table lists the first of each kind,
the last layer and the head (the final norm, the LM head, the greedy argmax); the step's
total is for the model's own layer count.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
from collections import Counter
from types import SimpleNamespace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine.cache.kv_cache import KVCache
from engine.models import architecture
from engine.worker.step_inputs import StepInputs
from harness.scenario import load_scenario, parse_overrides

# aten ops that launch no kernel: allocations (their values unwritten) and metadata
NO_KERNEL = {"empty", "empty_like", "empty_strided", "lift_fresh", "detach", "set_", "alias"}
# the launch arguments that say which fused form a recorded GEMM or rotary launch took
FORMS = ("SILU_MUL", "PARTIAL", "PROLOGUE", "STORE")


class _TorchKernels(TorchDispatchMode):
    """Counts each aten op that would launch a kernel on a GPU into `launches`."""

    def __init__(self, launches: list):
        super().__init__()
        self.launches = launches

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in NO_KERNEL:
            self.launches.append(f"torch {name}")
        return func(*args, **(kwargs or {}))


class _OurDecodeAttention:
    """FlashInferAttention as the engine runs a decode step on our kernel (TritonDecode),
    without FlashInfer (a CPU has none)."""

    force_double_buffer = True

    def __init__(self, q_heads, kv_heads, *args, **kwargs):
        self.kv_heads = kv_heads

    def plan(self, batch, bucket=None) -> int:
        from engine.kernels.flashinfer_attention import TritonDecode

        self.active = TritonDecode.of(batch, self.kv_heads)
        return 0

    def run(self, q, k_cache, v_cache, scale: float):
        return self.active.run(q, k_cache, v_cache, scale)


def _name(launch) -> str:
    """A recorded launch's kernel and its fused form (a GEMM with its conv epilogue: `conv`)."""
    name = launch.kernel.fn.__name__.strip("_").removesuffix("_kernel")
    forms = [f"{k.lower()}={v}" for k, v in launch.constexprs.items() if k in FORMS and v]
    if name == "skinny_gemm" and launch.args[10] is not None:
        forms.append("conv")
    return f"{name}({', '.join(forms)})" if forms else name


def _small_model(scenario):
    """The scenario's model at its widths and vocabulary with few layers, each small layer's
    kind, and each of the full model's layers' kind."""
    arch = architecture(scenario.model.arch)
    config = arch.presets[scenario.model.preset]
    fields = {f.name for f in dataclasses.fields(config)}
    layers = 8 if "layer_types" in fields else 2
    small = {"num_hidden_layers": layers}
    small |= {"layer_types": ()} if "layer_types" in fields else {}
    small = dataclasses.replace(config, **small)
    dtype = getattr(torch, scenario.engine.dtype)
    model = arch.network.random(small, scenario.model.seed, dtype, "cpu")
    kinds = [getattr(c, "layer_types", ()) or ("layer",) * c.num_hidden_layers
             for c in (small, config)]  # fmt: skip
    return model, *kinds


def count(scenario_name: str, size: str, rows: int, context: int, settings: str = "") -> dict:
    """Per layer, the launches of one decode step (names in order), and the step's total."""
    # they import triton: here, not at import (asv's discovery imports every module of
    # benchmarks/ on machines without it)
    from engine.kernels import cuda_ops, offline

    overrides = {"engine.decode_attention": "triton", **parse_overrides(settings)}
    scenario = load_scenario(scenario_name, size, overrides)
    config = dataclasses.replace(scenario.engine, device="cpu")
    model, small_kinds, kinds = _small_model(scenario)
    model.rotary.tabulate(config.max_model_len, torch.device("cpu"))  # as the engine on CUDA
    page = config.page_size
    pages = -(-(context + 1) // page)
    cache = KVCache(model.cache_shapes(), rows * pages, page, rows, model.head.weight.dtype, "cpu")
    with _patched(cuda_ops, "FlashInferAttention", _OurDecodeAttention):
        ops = cuda_ops.CudaOps(model, torch.device("cpu"), page, config=config.parts.kernels)
    steps = [
        SimpleNamespace(num_new=1, walk="decode", request=SimpleNamespace(
            num_cached=context, pages=list(range(i * pages, (i + 1) * pages)),
            tokens=[1] * (context + 1), slot=i, rid=i,
        ))
        for i in range(rows)
    ]  # fmt: skip
    inputs = StepInputs(rows, rows, rows * pages, torch.device("cpu"))
    batch = inputs.stage(steps, cache, ops)
    ops.begin_step(batch)
    launches: list = []
    marks = [(0, "body")]

    def mark(label):
        return lambda *args: marks.append((len(launches), label))

    hooks = [layer.register_forward_pre_hook(mark(f"layer {i} {small_kinds[i]}"))
             for i, layer in enumerate(model.model.layers)]  # fmt: skip
    logits_at = model.logits_at
    model.logits_at = lambda *args, **kw: mark("head")() or logits_at(*args, **kw)
    try:
        with torch.no_grad(), offline.recording(launches), _TorchKernels(launches):
            ops.argmax(model.forward(batch, cache, float32=False))
    finally:
        for hook in hooks:
            hook.remove()
    named = [item if isinstance(item, str) else _name(item) for item in launches]
    bounds = [at for at, _ in marks[1:]] + [len(named)]
    parts = {label: named[at:end] for (at, label), end in zip(marks, bounds, strict=True)}
    return {"scenario": scenario_name, "size": size, "rows": rows, "settings": settings,
            "parts": parts, "layers": len(kinds), "total": _total(parts, kinds)}  # fmt: skip


def _total(parts: dict[str, list[str]], kinds: tuple[str, ...]) -> int:
    """The step's launches at the model's own layers (`kinds`, each layer's kind in order):
    every layer but the last as the first layer of its kind ran, the last as the last ran."""
    layers = [label for label in parts if label.startswith("layer")]
    first: dict[str, int] = {}
    for label in layers[:-1]:
        first.setdefault(label.split(" ", 2)[2], len(parts[label]))
    others = sum(len(names) for label, names in parts.items() if label not in layers)
    return others + sum(first[kind] for kind in kinds[:-1]) + len(parts[layers[-1]])


@contextlib.contextmanager
def _patched(module, name, value):
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.count_launches")
    parser.add_argument("--scenario", default="qwen35")
    parser.add_argument("--size", default="0.8b")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--set", default="", metavar="engine.KEY=VALUE,...", dest="settings")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = count(args.scenario, args.size, args.rows, args.context, args.settings)
    if args.json:
        print(json.dumps(result))
        return
    layers = [label for label in result["parts"] if label.startswith("layer")]
    shown = {label.split(" ", 2)[2]: label for label in reversed(layers[:-1])}
    for label, names in result["parts"].items():
        if label.startswith("layer") and label not in (*shown.values(), layers[-1]):
            continue  # one layer of each kind, and the last
        print(f"{label}{' (the last)' if label == layers[-1] else ''}: {len(names)} launches")
        for name, times in Counter(names).items():
            print(f"    {times} x {name}")
    print(f"the step at {result['layers']} layers: {result['total']} launches")


if __name__ == "__main__":
    main()

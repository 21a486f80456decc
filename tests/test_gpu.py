"""The engine on CUDA, held to the CPU reference (run on the GPU machine: pytest -m gpu)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.config import load_scenario
from engine.messages import AddRequest, StepFrames
from engine.models import build_model
from engine.worker.main import build_worker
from engine.worker.timing import PhaseTimer

pytestmark = pytest.mark.gpu


def greedy_on(device: str, dtype: str, preset: str, prompts: list[list[int]], n: int):
    scenario = load_scenario("qwen35", "tiny")
    config = replace(scenario.engine, device=device, dtype=dtype, kv_pages=1024)
    spec = replace(scenario.model, preset=preset)
    frames: list[StepFrames] = []
    worker = build_worker(spec, config, PhaseTimer(0, "g", []), frames.append)
    for rid, prompt in enumerate(prompts):
        worker.handle(AddRequest(rid, prompt, n, ignore_eos=True, temperature=0))
    while worker.iteration():
        pass
    out: dict[int, list[int]] = {rid: [] for rid in range(len(prompts))}
    for step in frames:
        for frame in step.frames:
            out[frame.rid].extend(frame.tokens)
    return out, worker.engine.model


def test_tiny_engine_on_cuda_equals_the_cpu_reference():
    prompts = [[(7 * i + j) % 4000 + 1 for j in range(n)] for i, n in enumerate([3, 30, 17, 64])]
    cuda, _ = greedy_on("cuda", "float32", "tiny", prompts, 16)
    cpu_model = build_model("qwen35", "tiny", 0, "float32", "cpu")
    for rid, prompt in enumerate(prompts):
        tokens = list(prompt)
        with torch.inference_mode():
            for _ in range(16):
                tokens.append(int(cpu_model.forward_full(torch.tensor(tokens))[-1].argmax()))
        assert cuda[rid] == tokens[len(prompt) :], f"prompt {rid}"


def test_08b_bf16_cached_path_matches_its_full_forward():
    prompts = [[(11 * i + j) % 240000 + 1 for j in range(n)] for i, n in enumerate([5, 40])]
    out, model = greedy_on("cuda", "bfloat16", "0.8b", prompts, 6)
    for rid, prompt in enumerate(prompts):
        assert len(out[rid]) == 6
        with torch.inference_mode():
            logits = model.forward_full(torch.tensor(prompt + out[rid][:-1], device="cuda"))
        assert torch.isfinite(logits).all()
        # bf16: the greedy choice of the full forward agrees with the engine on most tokens
        full = logits[len(prompt) - 1 :].argmax(-1).tolist()
        agree = sum(a == b for a, b in zip(full, out[rid], strict=True))
        assert agree >= 5, (full, out[rid])

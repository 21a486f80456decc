"""benchmarks/bench_gpu_step.py on the CPU (tiny, the torch kernels): `--scenario orpheus` steps
Orpheus's LLM under its node's logit mask, as the worker does, on speech prompts; qwen35 (the
default) draws the prompts it always drew."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks import bench_gpu_step as bench
from engine.models.orpheus import CODEBOOK, SPEECH, audio_token_low
from harness.scenario import load_scenario


def test_orpheus_decode_steps_sample_each_token_from_its_frame_positions_codes():
    scenario = load_scenario("orpheus", "tiny")
    engine = bench.build(scenario, batch=3, context=20, steps=12, kernels="torch", graphs=False)
    for _ in range(12):
        bench._step(engine)
    for request in engine.requests.values():
        prompt, out = request.prompt, np.array(request.tokens[len(request.prompt) :])
        assert prompt[: len(SPEECH.prefix)] == SPEECH.prefix
        assert prompt[-len(SPEECH.suffix) :] == SPEECH.suffix and len(prompt) == 20
        assert len(out) == 13  # the prefill's token and one a step
        low = audio_token_low(np.arange(len(out)))
        assert ((out >= low) & (out < low + CODEBOOK)).all()


def test_qwen35_prompts_are_the_random_ids_they_were():
    gen, want = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    got = bench.prompt_ids("qwen35", 1000, 16, gen)
    assert got == torch.randint(1, 1000, (16,), generator=want).tolist()


def test_the_orpheus_step_line_names_the_mask(capsys):
    argv = ["--scenario", "orpheus", "--size", "tiny", "--kernels", "torch", "--batch", "2"]
    bench.main(argv + ["--context", "16", "--steps", "3", "--warmup", "1"])
    out = capsys.readouterr().out
    assert "decode step, size tiny, batch 2, context 16" in out
    assert "decode tensor cores False, decode attention triton, state float32" in out
    assert "each row sampling its logit mask's 4,096 of 156,940 ids" in out


def test_cprofile_writes_the_decode_steps_host_time_by_function(tmp_path):
    out = tmp_path / "host.txt"
    argv = ["--size", "tiny", "--kernels", "torch", "--batch", "2", "--context", "16"]
    bench.main(argv + ["--steps", "2", "--warmup", "1", "--cprofile", str(out)])
    text = out.read_text()
    assert text.startswith("host time by Python function over 5 decode steps (cProfile)")
    assert "launch" in text  # Engine.launch, the step's own entry, is among the functions
    assert text.count("Ordered by:") == 2  # own time, then cumulative

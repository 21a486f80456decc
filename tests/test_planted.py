"""The planted slowdowns the harness checks its verdicts with (engine/worker/planted.py):
`engine.planted_gpu_delay_us` keeps the device busy after each decode-lane step."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from engine.messages import AddRequest
from engine.models import build_model
from engine.worker import engine as engine_module
from engine.worker.engine import Engine
from engine.worker.planted import planted_device_delay
from harness.scenario import load_scenario


def test_a_cpu_device_delay_busy_waits_its_microseconds():
    started, cpu = time.perf_counter(), time.process_time()
    planted_device_delay(torch.device("cpu"), 30_000)
    assert time.perf_counter() - started >= 0.030
    assert time.process_time() > cpu  # it ran on the CPU (a busy-wait), not in a sleep


def test_each_launched_step_is_followed_by_the_planted_device_delay(monkeypatch):
    delays = []
    monkeypatch.setattr(engine_module, "planted_device_delay", lambda d, us: delays.append(us))
    for planted, expected in ((0, []), (70, [70, 70])):
        config = replace(
            load_scenario("qwen35", "tiny").engine, kv_pages=64, planted_gpu_delay_us=planted
        )
        engine = Engine(build_model("qwen35", "tiny", 0, "float32", "cpu"), config)
        prompt = [3, 1, 4, 1, 5]
        msg = AddRequest(0, prompt, 4, ignore_eos=True, temperature=0)
        engine.add_request(msg, prompt).handle = 0  # the handle a worker's runtime would give
        delays.clear()
        for _ in range(2):
            rows = engine.scheduler.schedule()
            engine.step_finished(engine.launch(rows).to_host())
        assert delays == expected

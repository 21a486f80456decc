"""The GPU tests' guard (tests/gpu_isolation.py), on the CPU: what a test changed is put back,
and a cached random model is handed out as an equal, independent copy."""

from __future__ import annotations

import os

import torch

from engine.models import build_model
from tests import gpu_isolation


def test_restore_puts_back_what_a_test_changed_and_names_it(monkeypatch):
    before = gpu_isolation.snapshot()
    precision, tf32 = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        torch.set_float32_matmul_precision("medium" if precision != "medium" else "high")
        torch.backends.cudnn.allow_tf32 = not tf32
        os.environ["GPU_ISOLATION_PROBE"] = "1"
        drawn = torch.rand(3)
        changed = gpu_isolation.restore(before)
    finally:
        torch.set_float32_matmul_precision(precision)
        torch.backends.cudnn.allow_tf32 = tf32
        os.environ.pop("GPU_ISOLATION_PROBE", None)
    assert changed == ["torch.float32_matmul_precision", "cudnn.allow_tf32", "environment"]
    assert torch.get_float32_matmul_precision() == precision
    assert torch.backends.cudnn.allow_tf32 == tf32 and "GPU_ISOLATION_PROBE" not in os.environ
    assert torch.equal(torch.rand(3), drawn)  # the RNG put back too, without a warning
    assert gpu_isolation.restore(before) == []


def test_pytests_own_variable_is_no_change_of_the_environment(monkeypatch):
    """PYTEST_CURRENT_TEST names the test's phase: it differs between the guard's snapshot (at
    setup) and its restore (at teardown) in every test, and is pytest's to keep."""
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/x.py::t (setup)")
    before = gpu_isolation.snapshot()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/x.py::t (teardown)")
    assert gpu_isolation.restore(before) == []
    os.environ["GPU_ISOLATION_PROBE"] = "1"
    assert gpu_isolation.restore(before) == ["environment"]
    assert "GPU_ISOLATION_PROBE" not in os.environ
    assert os.environ["PYTEST_CURRENT_TEST"] == "tests/x.py::t (teardown)"


def test_a_cached_random_model_is_an_equal_independent_copy():
    models = gpu_isolation.RandomModels(on=lambda device: True)  # the CPU too, for this test
    models.install()
    try:
        first = build_model("qwen35", "tiny", 0, "float32", "cpu")
        second = build_model("qwen35", "tiny", 0, "float32", "cpu")
        other_seed = build_model("qwen35", "tiny", 1, "float32", "cpu")
        assert len(models.built) == 2 and models.bytes() > 0
    finally:
        models.uninstall()
    fresh = build_model("qwen35", "tiny", 0, "float32", "cpu")  # uncached again
    for name, tensor in fresh.state_dict().items():
        assert torch.equal(first.state_dict()[name], tensor), name
        assert torch.equal(second.state_dict()[name], tensor), name
    a, b = next(first.parameters()), next(second.parameters())
    assert a.data_ptr() != b.data_ptr()
    with torch.no_grad():
        a.add_(1.0)
    assert torch.equal(b, next(fresh.parameters()))
    assert not torch.equal(next(other_seed.parameters()), next(fresh.parameters()))

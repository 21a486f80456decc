"""BENCH_FLASHINFER_PREBUILT: a FlashInfer JIT module whose .so is on disk loads as it is
(engine/kernels/flashinfer_import.py), tried on a stand-in of FlashInfer's JitSpecNvcc."""

from __future__ import annotations

import sys
import types

import pytest

from engine.env import EnvError, flashinfer_prebuilt
from engine.kernels import flashinfer_import


def _spec_class():
    class Spec:  # FlashInfer's contract: try_load -> module or None (then ninja builds)
        def __init__(self, path, is_aot=False, loads=True):
            self.jit_library_path, self.is_aot, self.loads = path, is_aot, loads
            self.calls = []

        def load(self, path=None):
            self.calls.append(("load", path))
            if not self.loads:
                raise OSError("not an ELF file")
            return f"module from {path}"

        def try_load(self):
            self.calls.append(("own",))
            return None

    return Spec


def test_a_built_so_loads_without_the_own_rule(tmp_path):
    Spec = _spec_class()
    flashinfer_import.trust_built(Spec)
    built = tmp_path / "x.so"
    built.write_bytes(b"\x7fELF")
    spec = Spec(built)
    assert spec.try_load() == f"module from {built}"
    assert spec.calls == [("load", built)]


@pytest.mark.parametrize("case", ["missing", "aot", "corrupt"])
def test_otherwise_the_own_rule_decides(tmp_path, case):
    Spec = _spec_class()
    flashinfer_import.trust_built(Spec)
    path = tmp_path / "x.so"
    if case != "missing":
        path.write_bytes(b"junk")
    spec = Spec(path, is_aot=case == "aot", loads=case != "corrupt")
    assert spec.try_load() is None
    assert spec.calls[-1] == ("own",)
    assert [c for c in spec.calls if c[0] == "load"] == (
        [("load", path)] if case == "corrupt" else []
    )


def test_patched_once(tmp_path):
    Spec = _spec_class()
    flashinfer_import.trust_built(Spec)
    patched = Spec.try_load
    flashinfer_import.trust_built(Spec)
    assert Spec.try_load is patched
    spec = Spec(tmp_path / "absent.so")
    assert spec.try_load() is None and spec.calls == [("own",)]  # the own rule once, not twice


def _fake_flashinfer(monkeypatch):
    Spec = _spec_class()
    core = types.ModuleType("flashinfer.jit.core")
    core.JitSpecNvcc = Spec
    jit = types.ModuleType("flashinfer.jit")
    jit.core = core
    module = types.ModuleType("flashinfer")
    module.jit = jit
    for name, m in (("flashinfer", module), ("flashinfer.jit", jit), ("flashinfer.jit.core", core)):
        monkeypatch.setitem(sys.modules, name, m)
    return module, Spec


@pytest.mark.parametrize("value", [None, "0", "1"])
def test_the_variable_decides(monkeypatch, value):
    module, Spec = _fake_flashinfer(monkeypatch)
    own = Spec.try_load
    if value is None:
        monkeypatch.delenv("BENCH_FLASHINFER_PREBUILT", raising=False)
    else:
        monkeypatch.setenv("BENCH_FLASHINFER_PREBUILT", value)
    assert flashinfer_import.flashinfer() is module
    assert (Spec.try_load is own) == (value != "1")


def test_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv("BENCH_FLASHINFER_PREBUILT", "yes")
    with pytest.raises(EnvError, match="BENCH_FLASHINFER_PREBUILT='yes'"):
        flashinfer_prebuilt()

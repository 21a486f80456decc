"""engine/kernels/triton_launch.py (`engine.triton_launch: bound`) on stand-in kernels, no GPU
or Triton needed: INVARIANTS 56, a kept launch runs the compiled kernel Triton's own launch
would have found, every parameter by position, the values the call gave (defaults for the
rest), on the call's grid; any change of what Triton specialises on (a tensor's dtype, device
or 16-byte alignment, an argument's type or value, a keyword, positional or keyword) goes
back through Triton's launch; off, `[grid]` is the kernel's own."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from engine.config import ConfigError, EngineConfig
from engine.kernels import triton_launch
from engine.kernels.triton_launch import bound


class Compiled:
    """A compiled kernel's surface: `packed_metadata`, and `[grid]`, its runner."""

    packed_metadata = b""

    def __init__(self, calls: list):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *values: self.calls.append(("runner", grid, values))


class StandIn:
    """A @triton.jit kernel's surface: `params` (name, default) and `kernel[grid](...)`, which
    records the launch and returns a compiled kernel whose runner records its calls."""

    def __init__(self, returns_compiled: bool = True):
        empty = inspect.Parameter.empty
        names = [("X", empty), ("OUT", empty), ("n", empty), ("eps", 1e-6), ("BLOCK", empty),
                 ("HAS_RES", False)]  # fmt: skip
        self.params = [SimpleNamespace(name=n, default=d) for n, d in names]
        self.calls: list[tuple] = []
        self.compiled = Compiled(self.calls) if returns_compiled else None

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return self.compiled

        return launch


class OnSecondGPU(torch.Tensor):
    """A tensor that says it is on CUDA device 1 (`get_device`), as one there would: this
    machine may have no GPU."""

    def get_device(self):
        return 1


@pytest.fixture
def kept():
    triton_launch.set_launch("bound")
    yield
    triton_launch.set_launch("jit")


def test_off_the_kernels_own_launch_runs_every_time():
    kernel = StandIn()
    wrapped = bound(kernel)
    x = torch.zeros(8)
    for _ in range(3):
        wrapped[(4,)](x, x, 8, BLOCK=16)
    assert [c[0] for c in kernel.calls] == ["jit"] * 3
    assert wrapped.params is kernel.params  # other attributes are the kernel's


def test_a_kept_launch_passes_every_parameter_by_position(kept):
    """INVARIANTS 56: the second launch of a signature is the runner's, with the constexprs
    and defaults in the kernel's parameter order, on a 3-d grid."""
    kernel = StandIn()
    wrapped = bound(kernel)
    x, out = torch.zeros(8), torch.zeros(8)
    assert wrapped[(4,)](x, out, 8, BLOCK=16) is kernel.compiled
    wrapped[(5, 2)](x, out, 8, BLOCK=16)
    kind, grid, values = kernel.calls[1]
    assert kind == "runner" and grid == (5, 2, 1)
    assert values == (x, out, 8, 1e-6, 16, False)
    assert [c[0] for c in kernel.calls] == ["jit", "runner"]


@pytest.mark.parametrize(
    "change",
    ["misaligned", "dtype", "int value", "bool for int", "keyword", "bool for int keyword",
     "keyword given", "device"],
)  # fmt: skip
def test_whatever_triton_specialises_on_goes_back_through_its_launch(kept, change):
    """INVARIANTS 56: a signature the kept kernel was not compiled for is Triton's to launch
    (and then kept too): the next launch of it is the runner's."""
    kernel = StandIn()
    wrapped = bound(kernel)
    buffer = torch.zeros(64, dtype=torch.bfloat16)
    x, out = buffer[:32], torch.zeros(32, dtype=torch.bfloat16)
    args, kwargs = [x, out, 32], {"BLOCK": 16}
    wrapped[(1,)](*args, **kwargs)
    wrapped[(1,)](*args, **kwargs)
    if change == "misaligned":  # 2 bytes in: no longer on a 16-byte boundary
        args[0] = buffer[1:33]
    elif change == "dtype":
        args[0] = x.float()
    elif change == "int value":
        args[2] = 48
    elif change == "bool for int":  # equal to 1 and hashed alike, typed apart by Triton
        args[2] = 1
        wrapped[(1,)](*args, **kwargs)
        wrapped[(1,)](*args, **kwargs)
        args[2] = True
    elif change == "keyword":
        kwargs["BLOCK"] = 32
    elif change == "bool for int keyword":
        kwargs["HAS_RES"] = 0
        wrapped[(1,)](*args, **kwargs)
        wrapped[(1,)](*args, **kwargs)
        kwargs["HAS_RES"] = False
    elif change == "keyword given":  # the default's value, given
        kwargs["eps"] = 1e-6
    elif change == "device":  # a tensor of the same dtype and address on another GPU
        args[0] = x.as_subclass(OnSecondGPU)
    wrapped[(1,)](*args, **kwargs)
    wrapped[(1,)](*args, **kwargs)
    kinds = [c[0] for c in kernel.calls]
    assert kinds[-2:] == ["jit", "runner"], kinds


def test_a_kept_launch_passes_this_calls_values(kept):
    """INVARIANTS 56: the kept kernel's runner gets the values of the call at hand (new tensors,
    a keyword's value, a default where none is given), on the call's grid, whatever the
    launches before it were."""
    kernel = StandIn()
    wrapped = bound(kernel)
    x = torch.zeros(8)
    outs = [torch.zeros(8) for _ in range(4)]
    wrapped[(4,)](x, OUT=outs[0], n=8, BLOCK=16)
    wrapped[(4,)](x, OUT=outs[1], n=8, BLOCK=16)
    wrapped[(5, 2)](x, OUT=outs[2], n=8, BLOCK=16, HAS_RES=True)
    wrapped[(5, 2)](x, OUT=outs[3], n=8, BLOCK=16, HAS_RES=True)
    wrapped[[4]](x, OUT=outs[0], n=8, BLOCK=16)
    runs = [c for c in kernel.calls if c[0] == "runner"]
    assert [c[1] for c in runs] == [(4, 1, 1), (5, 2, 1), (4, 1, 1)]
    assert runs[0][2] == (x, outs[1], 8, 1e-6, 16, False)
    assert runs[1][2] == (x, outs[3], 8, 1e-6, 16, True)
    assert runs[2][2] == (x, outs[0], 8, 1e-6, 16, False)
    assert [c[0] for c in kernel.calls] == ["jit", "runner", "jit", "runner", "runner"]


def test_positional_or_keyword_the_runner_gets_the_same_values(kept):
    """The same values given by position, by keyword or left to their defaults are separate
    signatures (each Triton's launch first), whose runners get the same values in parameter
    order."""
    kernel = StandIn()
    wrapped = bound(kernel)
    x, out = torch.zeros(8), torch.zeros(8)
    calls = [
        lambda: wrapped[(1,)](x, out, 8, 1e-6, 16, False),
        lambda: wrapped[(1,)](x, out, 8, BLOCK=16),
        lambda: wrapped[(1,)](X=x, OUT=out, n=8, eps=1e-6, BLOCK=16, HAS_RES=False),
    ]
    for call in calls:
        call()
        call()
    assert [c[0] for c in kernel.calls] == ["jit", "runner"] * 3
    values = {c[2] for c in kernel.calls if c[0] == "runner"}
    assert values == {(x, out, 8, 1e-6, 16, False)}


def test_each_alignment_keeps_its_own_kernel(kept):
    """A view off a 16-byte boundary and the aligned view of the same shape each keep their
    own kernel: after one launch of each through Triton's, both are the runner's."""
    kernel = StandIn()
    wrapped = bound(kernel)
    buffer = torch.zeros(64, dtype=torch.bfloat16)
    aligned, misaligned = buffer[:32], buffer[1:33]
    out = torch.zeros(32, dtype=torch.bfloat16)
    for x in (aligned, misaligned, aligned, misaligned):
        wrapped[(1,)](x, out, 32, BLOCK=16)
    kinds = [c[0] for c in kernel.calls]
    assert kinds == ["jit", "jit", "runner", "runner"]
    assert kernel.calls[3][2][0] is misaligned


def test_the_interpreters_launch_keeps_nothing(kept):
    """Under TRITON_INTERPRET a launch returns no compiled kernel: every launch is Triton's."""
    kernel = StandIn(returns_compiled=False)
    wrapped = bound(kernel)
    x = torch.zeros(8)
    for _ in range(3):
        wrapped[(1,)](x, x, 8, BLOCK=16)
    assert [c[0] for c in kernel.calls] == ["jit"] * 3 and not wrapped.kept


def test_the_setting_is_checked():
    with pytest.raises(ConfigError, match="engine.triton_launch must be one of jit, bound"):
        EngineConfig(triton_launch="fast")
    with pytest.raises(ValueError, match="triton_launch must be one of jit, bound"):
        triton_launch.set_launch("fast")
    assert EngineConfig().triton_launch == "jit"


class PdlStandIn(StandIn):
    """A kernel that declares `PDL` (it calls triton_pdl.pdl_start(PDL) first)."""

    def __init__(self):
        super().__init__()
        self.params.append(SimpleNamespace(name="PDL", default=False))


@pytest.mark.parametrize("kind", ["jit", "bound"])
def test_pdl_launches_only_the_kernels_that_declare_it_and_only_when_on(kind):
    """INVARIANTS 62: with engine.pdl on, a kernel with the `PDL` parameter launches with
    PDL=True and Triton's launch_pdl=True (through Triton's launch and, kept, as its own
    signature: a runner compiled for it); one without the parameter, and every kernel with the
    setting off, launches with neither."""
    x = torch.zeros(8)
    try:
        for pdl in (False, True):
            triton_launch.set_launch(kind, pdl=pdl)
            declares, plain = PdlStandIn(), StandIn()
            for kernel in (bound(declares), bound(plain)):
                kernel[(4,)](x, x, 8, BLOCK=16)
                kernel[(4,)](x, x, 8, BLOCK=16)
            jit_kwargs = [c[3] for c in declares.calls if c[0] == "jit"]
            assert jit_kwargs[0] == ({"BLOCK": 16, "PDL": True, "launch_pdl": True}
                                     if pdl else {"BLOCK": 16})  # fmt: skip
            assert all(c[3] == {"BLOCK": 16} for c in plain.calls if c[0] == "jit")
            if kind == "bound":  # the kept runner gets PDL by position, launch_pdl is compiled
                kinds, values = [c[0] for c in declares.calls], declares.calls[1][2]
                assert kinds == ["jit", "runner"] and values == (x, x, 8, 1e-6, 16, False, pdl)
    finally:
        triton_launch.set_launch("jit")


def test_pdl_is_refused_off_cuda():
    with pytest.raises(ConfigError, match="engine.pdl needs engine.device: cuda"):
        EngineConfig(pdl=True)
    assert EngineConfig(pdl=True, device="cuda").pdl

"""FlashInfer, imported once, its JIT cache optionally trusted as it stands.

FlashInfer 0.6 compiles a kernel variant (a dtype and head-dim combination) into
`<cache>/cached_ops/<name>/<name>.so` the first time it is asked for, and on every later ask
runs ninja over that directory, which rebuilds unless the objects, `build.ninja` and ninja's
logs are all there. A device machine starts bare, and the `.so` files alone are what a call
can carry (the objects would double the JIT cache past the carry's 64 MiB): with them, each
fresh machine's first server still spent ~3 minutes in nvcc (the Orpheus 3b's warmup: 179 s
of its first server, 0.2 s of the next).

`BENCH_FLASHINFER_PREBUILT=1` (scripts/gpu_suite.sh sets it when it restores the cache)
makes a JIT module whose `.so` exists load that file as it is; a module without one, or
whose file does not load, takes FlashInfer's own path (ninja). Safe where the cache holds
files FlashInfer itself built from the same release: the directory names the release and
the architecture, the file name the variant. Off by default: a developer editing
FlashInfer's sources wants ninja's rebuild.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from engine.env import flashinfer_prebuilt

log = logging.getLogger(__name__)


def trust_built(spec_class: type) -> None:
    """Make `spec_class` (FlashInfer's `JitSpecNvcc`) load an existing JIT `.so` before it
    falls back to its own `try_load` (and so, on None, to ninja)."""
    own_try_load = spec_class.try_load
    if getattr(own_try_load, "trusts_built", False):
        return

    def try_load(self) -> Any:
        path = self.jit_library_path
        if not getattr(self, "is_aot", False) and path.exists():
            try:
                return self.load(path)
            except Exception as exc:  # a corrupt or foreign file: FlashInfer rebuilds it
                log.warning("FlashInfer module %s did not load (%s): rebuilding", path, exc)
        return own_try_load(self)

    try_load.trusts_built = True
    spec_class.try_load = try_load


def flashinfer():
    """The `flashinfer` module (whatever sys.modules holds: tests put a stand-in there), its
    JIT cache trusted when BENCH_FLASHINFER_PREBUILT=1. Cheap after the first call for a
    module (the sampler asks on every sampled step)."""
    import flashinfer as module

    _prepare(module)
    return module


@functools.cache
def _prepare(module) -> None:
    """Once a module: read the variable and patch its JitSpecNvcc (`trust_built`)."""
    if flashinfer_prebuilt():
        from flashinfer.jit import core

        trust_built(core.JitSpecNvcc)

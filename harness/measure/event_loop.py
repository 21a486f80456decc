"""The harness's event loops: uvloop where available (the load generator and the mock)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


def run_loop(coro: Coroutine):
    """Run a coroutine on uvloop where available."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)

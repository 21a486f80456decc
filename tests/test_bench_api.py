"""benchmarks/bench_api.py: the real API server against a stand-in worker, driven by the
harness's closed loop. What it measures is a ceiling (docs/BENCHMARKS.md); what this test holds
is that the path it measures loses nothing: every token the stand-in sent reached the client,
each request got exactly its max_tokens, none failed."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import bench_api


@pytest.mark.slow
def test_the_api_ceiling_bench_delivers_every_token_the_stand_in_sent(tmp_path):
    args = argparse.Namespace(
        concurrency=4, tick_ms=2.0, requests=24, warmup=4, size="0.8b",
        out=str(tmp_path / "run"), profile=None,
    )  # fmt: skip
    result = bench_api.run(args)
    assert result["failed"] == 0
    assert result["tokens_sent"] == result["tokens_received"] == result["tokens_asked"] > 0
    assert result["capacity_tok_per_s"] == 2000.0
    assert 0 < result["delivered_tok_per_s_steady"]

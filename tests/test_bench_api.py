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


def test_two_trees_alternate_a_b_then_b_a_and_each_round_is_judged(monkeypatch, capsys):
    """--tree A --tree B --rounds 3: the runs go A B, B A, A B (a drift of the machine's speed
    over the rounds falls on both), and each round's B/A is printed, with the rounds B led."""
    order = []
    delivered = {"a": 100.0, "b": 150.0}

    def run(args, tree):
        order.append(tree)
        value = delivered[tree] * (1 - 0.1 * len(order))  # a machine slowing down
        return {"delivered_tok_per_s_steady": value, "ttft_p50_ms": 10.0, "itl_p99_ms": 1.0,
                "failed": 0}  # fmt: skip

    monkeypatch.setattr(bench_api, "run", run)
    bench_api.alternate(argparse.Namespace(tree=["a", "b"], rounds=3))
    assert order == ["a", "b", "b", "a", "a", "b"]
    last = capsys.readouterr().out.splitlines()[-1]
    assert "(B ahead in 3 of 3)" in last and last.startswith("B/A delivered tok/s by round:")

"""engine/worker/streams.py's `own_streams` against a stand-in of torch's stream pool (32
streams of a device handed out in turn, compared by their CUDA stream, as torch's are)."""

from __future__ import annotations

import gc
import itertools

import pytest
import torch

from engine.worker import streams


class PooledStream:
    """torch.cuda.Stream's part `own_streams` reads: a pool of 32 handed out in turn."""

    turn = itertools.count()

    def __init__(self, device):
        device = torch.device(device)  # torch's report an index: cuda:0 for "cuda"
        self.device = device if device.index is not None else torch.device("cuda", 0)
        self.cuda_stream = 0x1000 + next(self.turn) % streams.POOL

    def __eq__(self, other):
        return self.cuda_stream == other.cuda_stream and self.device == other.device

    def __hash__(self):
        return hash((self.cuda_stream, self.device))


@pytest.fixture
def pool(monkeypatch):
    monkeypatch.setattr(PooledStream, "turn", itertools.count())
    monkeypatch.setattr(torch.cuda, "Stream", PooledStream)
    monkeypatch.setattr(streams, "_held", set())
    return torch.device("cuda", 0)


class Lane:
    """An owner: an engine or a graph runner."""


def test_streams_a_live_lane_owns_are_never_handed_out_again(pool):
    """The pool wraps after 32 draws; a plain draw may return a held stream, `own_streams`
    never does while its owner lives, and does once the owner is gone (its streams may
    outlive it: what is held is the owner's claim, by handle)."""
    engine, runner = Lane(), Lane()
    decode, prefill = streams.own_streams(pool, 2, engine)
    (piecewise,) = streams.own_streams(pool, 1, runner)
    assert len({decode.cuda_stream, prefill.cuda_stream, piecewise.cuda_stream}) == 3
    for _ in range(40):  # other code drawing from the pool: it wraps onto all three
        torch.cuda.Stream(pool)
    later = streams.own_streams(pool, 2, Lane()) + streams.own_streams(pool, 1, Lane())
    assert not {s.cuda_stream for s in later} & {decode.cuda_stream, prefill.cuda_stream,
                                                  piecewise.cuda_stream}  # fmt: skip
    gone = {decode.cuda_stream, prefill.cuda_stream}
    del engine
    gc.collect()
    mine = {s.cuda_stream for s in streams.own_streams(pool, streams.POOL - 1, Lane())}
    assert gone <= mine and piecewise.cuda_stream not in mine  # all but the runner's


def test_a_device_named_without_an_index_is_guarded_too(pool):
    """The engine names its device `torch.device("cuda")`; the streams it gets report
    `cuda:0`: what they hold is still held."""
    owner = Lane()
    held = streams.own_streams(torch.device("cuda"), 2, owner)
    for _ in range(40):
        torch.cuda.Stream(pool)
    again = streams.own_streams(torch.device("cuda"), 30, Lane())
    assert not {s.cuda_stream for s in held} & {s.cuda_stream for s in again}


def test_a_pool_held_whole_is_a_clear_error(pool):
    owner = Lane()
    held = streams.own_streams(pool, streams.POOL, owner)
    with pytest.raises(RuntimeError, match="no 1 CUDA streams of cuda:0 left"):
        streams.own_streams(pool, 1, Lane())
    assert len({s.cuda_stream for s in held}) == streams.POOL

"""Orpheus on one worker: the LLM node streams audio tokens into the SNAC node.

The window arithmetic (N frames make 2048 x max(0, N - 3) samples, none lost or doubled at a
stream's end), the SNAC loop ending when its input ends (and not before), both nodes' declared
policies agreeing with their check_stop (INVARIANTS 2), an abort mid-stream freeing both nodes
(INVARIANTS 7), batched SNAC decode equal to decoding alone, a codec step padded to its
graph bucket equal to the plain step (INVARIANTS 41), the overlapped codec stage
(`engine.codec_overlap`) emitting the strict stage's frames (INVARIANTS 48), the LLM's logit
mask, and its cached path equal to a full forward (INVARIANTS 6)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import ConfigError
from engine.kernels.torch_ops import TorchOps
from engine.layers.sampler import window_logits
from engine.messages import Abort, AddRequest, TokenFrame
from engine.models import build_model, build_streams
from engine.models.orpheus import (
    AUDIO_TOKEN_BASE,
    CODEBOOK,
    END_OF_SPEECH,
    FRAME_TOKENS,
    SAMPLES_PER_FRAME,
    audio_token_low,
    window_codes,
    windows_for,
)
from engine.models.orpheus_node import WINDOW_LOOP, OrpheusNode, SnacNode
from engine.models.snac_layers import ResidualUnit, Snake1d
from engine.models.token_node import DECODE_LOOP
from engine.runtime.graph import StopRows
from engine.runtime.runtime import GraphRuntime
from engine.runtime.stops import StopKind
from engine.worker.codec_graphs import CodecGraphs
from engine.worker.engine import Engine
from engine.worker.main import build_worker
from engine.worker.stream_stage import StreamStage
from engine.worker.timing import PhaseTimer
from harness.scenario import load_scenario

BYTES_PER_WINDOW = 2 * SAMPLES_PER_FRAME


@pytest.fixture(scope="module")
def snac():
    ((network, node),) = build_streams("orpheus", "tiny", 0, "float32", "cpu")
    return network, node


def audio_stream(seed: int, tokens: int) -> list[int]:
    """Valid audio tokens: position p of each frame in its own 4096 codes."""
    codes = np.random.default_rng(seed).integers(0, CODEBOOK, tokens)
    return (audio_token_low(np.arange(tokens)) + codes).tolist()


def reference_pcm(snac, tokens: list[int]) -> np.ndarray:
    """Every window of a stream decoded alone, its second frame's samples kept, in order."""
    network, node = snac
    windows = [
        node.decode(network, np.array([tokens[w * FRAME_TOKENS : w * FRAME_TOKENS + 28]]))[0]
        for w in range(windows_for(len(tokens)))
    ]
    return np.concatenate(windows) if windows else np.zeros(0, dtype=np.int16)


def pcm(frames: list[TokenFrame]) -> np.ndarray:
    return np.frombuffer(b"".join(f.audio or b"" for f in frames), dtype="<i2")


def assert_same_audio(got: np.ndarray, want: np.ndarray) -> None:
    """Equal but for float rounding across batch sizes (one least significant bit)."""
    assert got.shape == want.shape
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max(initial=0) <= 1


def assert_one_last_frame(frames: list[TokenFrame], reason: str) -> None:
    assert frames and frames[-1].finish_reason == reason
    assert all(f.finish_reason is None for f in frames[:-1])


# --- the window arithmetic and the SNAC loop, at the stage ----------------------------------
def run_stage(
    snac,
    lengths: list[int],
    ends: dict[int, str] | None = None,
    graphs: CodecGraphs | None = None,
    chunk: int = 1,
    **stage_settings,
):
    """Stream `lengths[rid]` tokens into one stage, a token per request per iteration as the
    LLM sends them (`chunk` tokens: input faster than one window a step, so windows queue up
    behind it), its last frame carrying the finish reason (`ends`, default "length");
    each iteration steps the stage once, and then it steps on while a step does something (a
    step in flight finishes). `graphs`: the stage's codec graph runner (on a CPU, the eager twin);
    `stage_settings`: StreamStage's (overlap, runtime_stops). Returns (frames per rid,
    streams, stage)."""
    network, node = snac
    stage = StreamStage(network, node, PhaseTimer(0, "s", []), capacity=4, **stage_settings)
    stage.graphs = graphs
    streams = {rid: audio_stream(rid, n) for rid, n in enumerate(lengths)}
    for rid, n in enumerate(lengths):
        stage.add_request(AddRequest(rid, [1, 2, 3], max(n, 1), ignore_eos=True))
    out: dict[int, list[TokenFrame]] = {rid: [] for rid in streams}

    def emit(frames):
        for f in frames:
            out[f.rid].append(f)

    for i in range(0, max(lengths, default=0) + 1, chunk):
        frames = []
        for rid, tokens in streams.items():
            if i < len(tokens) or (i == 0 and not tokens):
                last = i + chunk >= len(tokens)
                reason = (ends or {}).get(rid, "length") if last else None
                frames.append(TokenFrame(rid, tokens[i : i + chunk], finish_reason=reason))
        emit(stage.feed(frames))
        stage.step(emit)
    while stage.step(emit):
        pass
    return out, streams, stage


def test_every_stream_length_streams_exactly_its_windows(snac):
    """For every N from 0 to a few windows past the first (N frames, then 0, 1 or 6 tokens
    of an unfinished frame), all in one batch: 2048 x max(0, N - 3) samples, each window's as
    decoding it alone gives, one last frame, nothing after it, no state left."""
    lengths = [7 * frames + extra for frames in range(9) for extra in (0, 1, 6)]
    out, streams, stage = run_stage(snac, lengths)
    for rid, n in enumerate(lengths):
        frames = out[rid]
        assert len(pcm(frames)) == SAMPLES_PER_FRAME * max(0, n // FRAME_TOKENS - 3), n
        assert_same_audio(pcm(frames), reference_pcm(snac, streams[rid]))
        assert_one_last_frame(frames, "length")
        assert sum(1 for f in frames if f.audio) == windows_for(n)  # a frame per window
    assert not stage.streams and stage.runtime.num_requests == 0


def test_a_stream_ending_on_eos_ends_with_stop_after_its_last_window(snac):
    lengths = [13, 28, 33, 35, 49]
    out, streams, _ = run_stage(snac, lengths, ends=dict.fromkeys(range(5), "stop"))
    for rid, n in enumerate(lengths):
        assert len(pcm(out[rid])) == SAMPLES_PER_FRAME * windows_for(n)
        assert_one_last_frame(out[rid], "stop")


def test_the_snac_loop_waits_for_its_input_and_ends_with_it(snac):
    """A stream with no window ready is not done while more may come, even when its budget
    allows no more windows (max_tokens 30: one); once its input ends, with every window
    decoded, it ends at once, with no step."""
    network, node = snac
    stage = StreamStage(network, node, PhaseTimer(0, "s", []), capacity=2)
    tokens, got = audio_stream(3, 35), []
    stage.add_request(AddRequest(7, [1], 100, ignore_eos=False))
    stage.add_request(AddRequest(8, [1], 30, ignore_eos=True))
    assert stage.feed([TokenFrame(7, tokens[:28]), TokenFrame(8, tokens[:28])]) == []
    assert stage.step(got.extend) == 2 and len(pcm(got)) == 2 * SAMPLES_PER_FRAME
    assert stage.step(got.extend) == 0 and {7, 8} <= set(stage.streams)  # waiting for input
    assert stage.feed([TokenFrame(7, tokens[28:34]), TokenFrame(8, tokens[28:29])]) == []
    assert not stage.has_work() and {7, 8} <= set(stage.streams)
    (last,) = stage.feed([TokenFrame(8, tokens[29:30], finish_reason="length")])
    assert last.finish_reason == "length" and not last.audio and 8 not in stage.streams
    assert stage.feed([TokenFrame(7, tokens[34:35], finish_reason="stop")]) == []
    assert stage.has_work()  # the 35th token completes a window: the loop goes on
    assert stage.step(got.extend) == 1
    assert_one_last_frame([f for f in got if f.rid == 7], "stop")
    assert len(pcm([f for f in got if f.rid == 7])) == 2 * SAMPLES_PER_FRAME
    assert not stage.streams and stage.runtime.num_requests == 0


# --- declared policies agree with check_stop (INVARIANTS 2) --------------------------------
@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(0, 60), st.booleans()), min_size=1))
def test_llm_policy_agrees_with_its_check_stop(rows):
    """AR: the loop's count reaches max_tokens - 1, or the EOS token unless ignore_eos."""
    node = OrpheusNode([END_OF_SPEECH])
    assert node.policy_kind is StopKind.AR
    max_tokens = [m for m, _, _ in rows]
    counts = [min(c, m - 1) + 1 for m, c, _ in rows]  # outputs so far, this one included
    tokens = [END_OF_SPEECH if c % 3 == 0 else AUDIO_TOKEN_BASE + c for _, c, _ in rows]
    ignore = [i for _, _, i in rows]
    decided = _runtime(node, "decode", DECODE_LOOP, max_tokens, ignore, [c - 1 for c in counts])
    stopped, by_token, missed = decided.check_stops("decode", np.arange(len(rows)), tokens)
    own = node.check_stop(StopRows.of(range(len(rows)), ["decode"] * len(rows), tokens, counts,
                                      max_tokens, ignore))  # fmt: skip
    assert missed is None
    np.testing.assert_array_equal(stopped, own.stopped)
    np.testing.assert_array_equal(by_token, own.by_token)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 90), st.integers(1, 12)), min_size=1))
def test_snac_policy_agrees_with_its_check_stop(rows):
    """ITER: the windows decoded reach the windows the stream's tokens make."""
    node = SnacNode()
    expected = [t for t, _ in rows]
    decoded = [d for _, d in rows]
    rt = _runtime(node, "window", WINDOW_LOOP, expected, [False] * len(rows), decoded)
    stopped, by_token, _ = rt.check_stops("window", np.arange(len(rows)), np.zeros(len(rows)))
    own = node.check_stop(StopRows.of(range(len(rows)), ["window"] * len(rows), decoded,
                                      decoded, expected, [False] * len(rows)))  # fmt: skip
    np.testing.assert_array_equal(stopped, own.stopped)
    assert not by_token.any() and not own.by_token.any() and not own.end_partition.any()


def _runtime(node, walk, loop, max_tokens, ignore, counts) -> GraphRuntime:
    rt = GraphRuntime(node.graph, capacity=4)
    for w in node.graph.walks:
        rt.declare_stop_policies(w, node.get_stop_policies(w))
    for rid, (m, ig, c) in enumerate(zip(max_tokens, ignore, counts, strict=True)):
        handle = rt.add_request(rid)
        for w, limits in node.stop_limits(m, ig).items():
            rt.register_limits(handle, w, limits)
        rt.iters[loop][handle] = c
    return rt


# --- the codec --------------------------------------------------------------------------
def test_snac_decode_in_a_batch_equals_decoding_each_alone(snac):
    network, _ = snac
    windows = np.array([audio_stream(seed, 28) for seed in range(6)])
    batched = network.decode(window_codes(windows))
    alone = torch.cat([network.decode(window_codes(windows[i : i + 1])) for i in range(6)])
    assert batched.shape == (6, 1, 16 * 512)
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    assert torch.equal(network.decode(window_codes(windows)), batched)  # no fresh noise


def codec_twin(snac, max_windows: int) -> CodecGraphs:
    """The codec graph runner without a stream: each bucket's decode runs eagerly on the
    padded static buffer, computing what its graph replays."""
    network, node = snac
    return CodecGraphs(
        partial(node.pcm, network), node.code_width, max_windows, torch.device("cpu")
    )


def test_a_codec_step_padded_to_its_bucket_decodes_as_the_plain_step(snac):
    """INVARIANTS 41 on the runner's padded path: B windows padded to their bucket with code 0,
    the first B rows kept, against the same windows decoded directly, for B equal to a bucket
    and one past it (buckets 1, 2, 4, 8, 16, 24, 32, 40), steps of changing sizes one after
    another on the same buffers. Equal but for float rounding across batch sizes; a padding
    row reaching a real one, or the wrong rows kept, changes whole windows."""
    _, node = snac
    runner = codec_twin(snac, 40)
    assert runner.buckets == [1, 2, 4, 8, 16, 24, 32, 40]
    windows = np.array([audio_stream(seed, 28) for seed in range(41)])
    for count in (40, 25, 1, 9, 24, 3, 8, 2, 17, 33):
        got = runner.decode(node.codes(windows[:count]))
        assert got.dtype == np.int16 and got.shape == (count, SAMPLES_PER_FRAME)
        assert_same_audio(got, node.decode(snac[0], windows[:count]))
    for count in (0, 41):
        with pytest.raises(ValueError, match="take 1 to 40"):
            runner.decode(node.codes(windows[:count]))


def test_the_stage_streams_the_same_audio_through_the_codec_graphs_path(snac):
    """The stage with the runner (its eager twin, up to 8 windows): 12 streams of 4 to 15
    frames, so steps fall from 12 ready windows (past the largest bucket: eager) through every
    bucket to 1; every stream's audio is the eager stage's."""
    lengths = [7 * frames for frames in range(4, 16)]
    runner = codec_twin(snac, 8)
    sizes: list[int] = []
    launch = runner.launch
    runner.launch = lambda codes, slot: sizes.append(len(codes)) or launch(codes, slot)
    out, _, stage = run_stage(snac, lengths, graphs=runner)
    plain, _, _ = run_stage(snac, lengths)
    assert set(map(runner.bucket_for, sizes)) == {1, 2, 4, 8} and max(sizes) == 8
    for rid in range(len(lengths)):
        assert_same_audio(pcm(out[rid]), pcm(plain[rid]))
    assert not stage.streams


@pytest.mark.parametrize(
    ("graphs", "runtime_stops", "chunk"), [(False, True, 1), (True, False, 1), (False, True, 10)]
)
def test_the_overlapped_stage_emits_the_strict_stages_frames(snac, graphs, runtime_stops, chunk):
    """INVARIANTS 48 at the stage: with `overlap` each step finishes at the next, and every
    stream of 0 to 8 frames (and 1 or 6 tokens of an unfinished one), ending on "length",
    "stop" or "error" (a failed stream's last frame at once, its windows left undecoded), gets
    the strict stage's frames: the same PCM bytes, frames and finish reasons in the same
    order. Their ends arrive while their windows are in flight (the stage steps after its
    feed, as in the worker), and with input in chunks of 10 tokens while windows are still
    left to decode, so a stream's last window may be in the step begun just before the step
    that takes its end finishes. Through the graphs' eager twin (its two pinned input buffers
    in turn) too, and with the model's check_stop deciding (runtime_stops off)."""
    lengths = [7 * frames + extra for frames in range(9) for extra in (0, 1, 6)]
    ends = {rid: ("length", "stop", "error")[rid % 3] for rid in range(len(lengths))}
    runs = {}
    for overlap in (False, True):
        runner = codec_twin(snac, 8) if graphs else None
        runs[overlap] = run_stage(
            snac, lengths, ends, runner, chunk, overlap=overlap, runtime_stops=runtime_stops
        )
    (strict, _, _), (overlapped, _, stage) = runs[False], runs[True]
    assert overlapped == strict
    assert any(len(pcm(frames)) for frames in strict.values())
    assert not stage.streams and stage.runtime.num_requests == 0 and stage.pending is None


def test_window_codes_follow_the_frame_layout():
    frame = [AUDIO_TOKEN_BASE + p * CODEBOOK + 10 * p for p in range(7)]  # code 10p at p
    c0, c1, c2 = window_codes(np.array([frame * 4]))
    assert c0.tolist() == [[0] * 4] and c1.tolist() == [[10, 40] * 4]
    assert c2.tolist() == [[20, 30, 50, 60] * 4]
    with pytest.raises(ValueError, match="outside its position"):
        window_codes(np.array([[AUDIO_TOKEN_BASE + CODEBOOK] * 28]))  # code of position 1 at 0


# --- the worker: both nodes end to end ------------------------------------------------------
def orpheus_worker(**engine):
    scenario = load_scenario("orpheus", "tiny")
    config = replace(scenario.engine, **engine)
    frames: list = []
    worker = build_worker(scenario.model, config, PhaseTimer(0, "o", []), frames.append)
    sent: dict[int, list[int]] = {}  # what the LLM streamed into the codec, per rid
    feed = worker.stages[0].feed

    def recording(step_frames):
        for f in step_frames:
            sent.setdefault(f.rid, []).extend(f.tokens)
        return feed(step_frames)

    worker.stages[0].feed = recording
    return worker, frames, sent


def by_rid(frames) -> dict[int, list[TokenFrame]]:
    out: dict[int, list[TokenFrame]] = {}
    for step in frames:
        for f in step.frames:
            out.setdefault(f.rid, []).append(f)
    return out


@pytest.mark.parametrize("overlap", [False, True])
def test_worker_streams_each_requests_windows_through_both_nodes(snac, overlap):
    lengths = [1, 6, 7, 27, 28, 29, 34, 35, 41, 42]
    worker, frames, sent = orpheus_worker(overlap=overlap, max_rows=8)
    for rid, n in enumerate(lengths):
        seeded = rid % 3 == 0  # some rows sample (seeded), the rest are greedy
        worker.handle(AddRequest(rid, [rid + 1] * (2 + rid), n, ignore_eos=True,
                                 temperature=1.0 if seeded else 0.0, seed=rid if seeded else None))  # fmt: skip
    while worker.iteration():
        pass
    got = by_rid(frames)
    for rid, n in enumerate(lengths):
        tokens = sent[rid]
        low = audio_token_low(np.arange(len(tokens)))
        assert ((np.array(tokens) >= low) & (np.array(tokens) < low + CODEBOOK)).all()  # mask
        assert len(pcm(got[rid])) == SAMPLES_PER_FRAME * windows_for(n), rid
        assert_same_audio(pcm(got[rid]), reference_pcm(snac, tokens[: (n // 7) * 7]))
        assert_one_last_frame(got[rid], "length")
    assert_pools_full(worker)


def test_codec_graphs_are_ignored_on_a_cpu():
    worker, _, _ = orpheus_worker(codec_graphs=True)
    assert worker.stages[0].graphs is None and worker.stages[0].cuda_stream is None


@pytest.mark.parametrize("kernels", ["snake", "fused"])
def test_codec_kernels_decode_with_the_reference_on_a_cpu(snac, kernels):
    """`engine.codec_kernels` reaches the codec's modules through the worker, and on CPU
    tensors they run the torch reference (the Triton kernels are for CUDA tensors), so the
    same samples, bit for bit, as the network built with "torch"."""
    worker, _, _ = orpheus_worker(codec_kernels=kernels)
    network = worker.stages[0].network
    assert network.kernels == kernels
    units = [m for m in network.modules() if isinstance(m, ResidualUnit)]
    assert len(units) == 12 and all(u.fused == (kernels == "fused") for u in units)
    windows = np.array([audio_stream(seed, 28) for seed in range(3)])
    assert torch.equal(network.decode(window_codes(windows)), snac[0].decode(window_codes(windows)))


def test_an_unknown_codec_kernels_setting_is_a_config_error():
    with pytest.raises(ConfigError, match="engine.codec_kernels must be one of torch, snake"):
        orpheus_worker(codec_kernels="triton")


def test_the_codec_sine_reaches_every_snake_and_unit_and_is_checked():
    """engine.codec_sine reaches each Snake and residual unit of the codec through the worker
    (on a CPU they run the torch reference whatever it says); an unknown value is refused."""
    worker, _, _ = orpheus_worker(codec_kernels="folded", codec_sine="approx")
    network = worker.stages[0].network
    assert network.sine == "approx"
    layers = [m for m in network.modules() if isinstance(m, (Snake1d, ResidualUnit))]
    assert len(layers) == 4 + 12 * 3 + 1 and all(m.approx for m in layers)
    exact, _, _ = orpheus_worker(codec_kernels="folded")
    assert not any(getattr(m, "approx", False) for m in exact.stages[0].network.modules())
    with pytest.raises(ConfigError, match="engine.codec_sine must be one of exact, approx"):
        orpheus_worker(codec_sine="fast")


@pytest.mark.parametrize("overlap", [False, True])
def test_an_eos_stream_ends_with_stop_after_its_last_window(overlap):
    """Under the overlapped loop too: the step launched after the EOS step is dropped for
    the stopped row (INVARIANTS 27), and the codec ends after the stream's last window."""
    probe, _, sent = orpheus_worker()
    probe.handle(AddRequest(0, [5, 6, 7], 40, ignore_eos=True, temperature=0))
    while probe.iteration():
        pass
    eos = sent[0][31]  # greedy: the 32nd token (4 frames and 4 tokens) is this id
    scenario = load_scenario("orpheus", "tiny")
    spec = replace(scenario.model, eos_token_ids=[eos])
    config = replace(scenario.engine, overlap=overlap)
    frames: list = []
    worker = build_worker(spec, config, PhaseTimer(0, "o", []), frames.append)
    worker.handle(AddRequest(0, [5, 6, 7], 40, ignore_eos=False, temperature=0))
    while worker.iteration():
        pass
    (stream,) = by_rid(frames).values()
    first = sent[0].index(eos)
    assert len(pcm(stream)) == SAMPLES_PER_FRAME * windows_for(first + 1)
    assert_one_last_frame(stream, "stop")
    assert_pools_full(worker)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_abort_mid_stream_frees_both_nodes(overlap):
    """Under the overlapped loop too: the aborted request's row in the step in flight is
    dropped, no frame follows its abort, and both nodes' state of it is freed at once."""
    worker, frames, _ = orpheus_worker(overlap=overlap)
    for rid in range(3):
        worker.handle(AddRequest(rid, [rid + 3] * 5, 42, ignore_eos=True, temperature=0))
    while not any(f.rid == 1 and f.audio for step in frames for f in step.frames):
        assert worker.iteration()
    assert 1 in worker.stages[0].streams and worker.runtime.has_request(1)
    worker.handle(Abort(1))
    assert not worker.runtime.has_request(1) and 1 not in worker.engine.requests
    assert 1 not in worker.stages[0].streams and not worker.stages[0].runtime.has_request(1)
    ended = len(frames)
    while worker.iteration():
        pass
    stream = by_rid(frames)[1]
    assert stream[-1].finish_reason == "abort"
    assert not any(f.rid == 1 for step in frames[ended:] for f in step.frames)
    assert_one_last_frame(by_rid(frames)[0], "length")
    assert_pools_full(worker)


def stream_to_idle(worker, frames, sent, lengths: list[int], seeded_every: int):
    """Request rid of `lengths[rid]` audio tokens (every `seeded_every`-th sampling, seeded;
    the rest greedy) run to idle on `orpheus_worker`'s worker, its pools full again after: the
    tokens streamed into the codec and each request's frames."""
    for rid, n in enumerate(lengths):
        seeded = rid % seeded_every == 0
        worker.handle(AddRequest(rid, [rid + 1] * (2 + rid), n, ignore_eos=True,
                                 temperature=1.0 if seeded else 0.0, seed=rid if seeded else None))  # fmt: skip
    run_to_idle(worker)
    assert_pools_full(worker)
    return sent, by_rid(frames)


def run_to_idle(worker) -> None:
    """Iterate until the worker says it is idle; it must have nothing in flight then."""
    while worker.iteration():
        pass
    assert worker.stages[0].pending is None and not worker.has_work()


@pytest.mark.parametrize("overlap", [False, True])
def test_codec_overlap_streams_the_strict_stages_frames(overlap):
    """INVARIANTS 48 at the worker: `engine.codec_overlap` on against off, under the strict and
    the overlapped LLM loop; requests of 1 token to 8 frames, ending mid-window and on a
    window's edge, some sampling: the same tokens into the codec, and per request the same
    frames (PCM bytes, finish reasons, in order)."""
    lengths = [1, 6, 7, 21, 27, 28, 29, 34, 35, 41, 42, 56]
    runs = {}
    for codec_overlap in (False, True):
        worker, frames, sent = orpheus_worker(
            overlap=overlap, codec_overlap=codec_overlap, max_rows=8
        )
        assert worker.stages[0].overlap is codec_overlap
        runs[codec_overlap] = stream_to_idle(worker, frames, sent, lengths, seeded_every=3)
    assert runs[True] == runs[False]
    for rid, n in enumerate(lengths):
        assert len(pcm(runs[True][1][rid])) == SAMPLES_PER_FRAME * windows_for(n), rid


def test_the_worker_is_not_idle_while_a_codec_step_is_in_flight():
    """With the LLM done, the codec's last step is still in flight: the worker has work and
    its iteration says so, and the next one delivers the last window and the last frame."""
    worker, frames, _ = orpheus_worker(codec_overlap=True)
    worker.handle(AddRequest(0, [3, 4], 35, ignore_eos=True, temperature=0))
    stage, last_in_flight = worker.stages[0], 0
    while worker.iteration():
        if not worker.engine.requests and stage.pending is not None:
            assert worker.has_work()
            last_in_flight += 1
    assert last_in_flight == 1  # one iteration ended with the LLM done and the codec not
    (stream,) = by_rid(frames).values()
    assert len(pcm(stream)) == SAMPLES_PER_FRAME * windows_for(35)
    assert_one_last_frame(stream, "length")
    assert_pools_full(worker)


@pytest.mark.parametrize(("overlap", "runtime_stops"), [(False, True), (True, False)])
def test_an_abort_while_its_window_is_in_flight_drops_that_window(overlap, runtime_stops):
    """A request aborted while its window is in flight (`engine.codec_overlap`) gets the strict
    stage's frames up to the abort less that window (its row is dropped at the step's finish,
    before the runtime or the model's check_stop sees it), then its abort frame, nothing after
    it, and both nodes freed; the others' frames are the strict stage's exactly."""
    runs = {}
    for codec_overlap in (True, False):  # the overlapped run finds the iteration to abort at
        worker, frames, _ = orpheus_worker(
            overlap=overlap, codec_overlap=codec_overlap, runtime_stops=runtime_stops
        )
        for rid in range(3):
            worker.handle(AddRequest(rid, [rid + 3] * 5, 42, ignore_eos=True, temperature=0))
        if codec_overlap:
            iterations = 0
            while not (worker.stages[0].pending and 1 in worker.stages[0].pending.streams):
                assert worker.iteration()
                iterations += 1
        else:
            for _ in range(iterations):
                assert worker.iteration()
        worker.handle(Abort(1))
        assert not worker.stages[0].holds(1) and not worker.stages[0].runtime.has_request(1)
        aborted = len(frames)
        run_to_idle(worker)
        assert not any(f.rid == 1 for step in frames[aborted:] for f in step.frames)
        assert_pools_full(worker)
        runs[codec_overlap] = by_rid(frames)
    strict, overlapped = runs[False], runs[True]
    assert overlapped[0] == strict[0] and overlapped[2] == strict[2]
    assert overlapped[1][-1].finish_reason == strict[1][-1].finish_reason == "abort"
    assert overlapped[1][:-1] == strict[1][:-2] and strict[1][-2].audio


def assert_pools_full(worker) -> None:
    cache, stage = worker.engine.cache, worker.stages[0]
    assert cache.pages.num_free == cache.pages.size and cache.slots.num_free == cache.slots.size
    assert not worker.engine.requests and worker.runtime.num_requests == 0
    assert not stage.streams and stage.runtime.num_requests == 0
    assert not worker.has_work()


@pytest.mark.parametrize("masked_head", [False, True])
def test_llm_cached_greedy_equals_a_full_forward_under_the_mask(masked_head):
    """INVARIANTS 6 for the Llama network: the worker's greedy tokens are a full-sequence
    forward's (whole vocabulary), the mask applied at each output position, with the head's
    product over the whole vocabulary or over the mask's span alone (`engine.masked_head`)."""
    model = build_model("orpheus", "tiny", 0, "float32", "cpu")
    prompts = [[11, 12, 13], [7] * 9]
    worker, _, sent = orpheus_worker(masked_head=masked_head)
    assert (worker.engine.first_logit > 0) is masked_head
    for rid, prompt in enumerate(prompts):
        worker.handle(AddRequest(rid, prompt, 16, ignore_eos=True, temperature=0))
    while worker.iteration():
        pass
    for rid, prompt in enumerate(prompts):
        seq = list(prompt)
        with torch.inference_mode():
            for i in range(16):
                x = model.model.embed_tokens(torch.tensor(seq))
                cos, sin = model.rotary(torch.arange(len(seq)))
                for layer in model.model.layers:
                    x = layer.forward_full(x, cos, sin)
                logits = model._head(model.model.norm(x[-1:]))[0]
                low = int(audio_token_low(np.array([i]))[0])
                seq.append(low + int(logits[low : low + CODEBOOK].argmax()))
        assert sent[rid] == seq[len(prompt) :]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_masked_head_streams_the_whole_heads_frames(overlap):
    """`engine.masked_head` on against off (the LM head over Orpheus's 28,672 audio codes, or
    over all 156,940 ids), strict and overlapped loops, greedy and seeded rows of 1 token to 8
    frames: the same tokens into the codec and per request the same frames. The windows'
    logits are the same numbers either way, so even the sampled rows draw the same codes."""
    lengths = [1, 7, 21, 28, 29, 35, 42, 56]
    runs = {}
    for masked_head in (False, True):
        worker, frames, sent = orpheus_worker(overlap=overlap, masked_head=masked_head, max_rows=8)
        runs[masked_head] = stream_to_idle(worker, frames, sent, lengths, seeded_every=2)
    assert runs[True] == runs[False]
    assert all(len(runs[True][0][rid]) == n for rid, n in enumerate(lengths))


def test_a_restricted_heads_logits_are_the_whole_heads_columns_of_its_span():
    """`CausalLM.restrict_head(first, end)`: the cached path's logits become the whole head's
    columns [first, end), which `window_logits` reads with `first_id`; the no-cache reference
    keeps the whole vocabulary; a span outside the vocabulary is refused."""
    model = build_model("orpheus", "tiny", 0, "float32", "cpu")
    hidden = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(3))
    ops = TorchOps()
    whole = ops.linear(model.step_head, hidden)
    first, end = OrpheusNode.sampling_span
    model.restrict_head(first, end)
    assert model.step_head.weight.data_ptr() == model.head.weight[first].data_ptr()  # a view
    span = ops.linear(model.step_head, hidden)
    assert span.shape == (5, end - first) and torch.equal(span, whole[:, first:end])
    low = audio_token_low(np.array([0, 3, 6, 13, 700]))
    want, want_low = window_logits(whole, low, CODEBOOK)
    got, got_low = window_logits(span, low, CODEBOOK, first_id=first)
    assert torch.equal(got, want) and torch.equal(got_low, want_low)
    assert model.forward_full(torch.tensor([1, 2, 3])).shape[-1] == model.config.vocab_size
    for bad in ((-1, 10), (10, 10), (0, model.config.vocab_size + 1)):
        with pytest.raises(ValueError, match="head span"):
            model.restrict_head(*bad)


def test_a_span_without_a_mask_or_the_setting_leaves_the_head_whole():
    """The span narrows the head only with the node's mask and `engine.masked_head` both."""
    scenario = load_scenario("orpheus", "tiny")
    span = OrpheusNode.sampling_span
    for masked_head, mask in ((True, None), (False, OrpheusNode.sampling_window)):
        model = build_model("orpheus", "tiny", 0, "float32", "cpu")
        config = replace(scenario.engine, masked_head=masked_head, warmup=False)
        engine = Engine(model, config, logit_mask=mask, logit_span=span)
        assert engine.first_logit == 0 and model.span_head is None

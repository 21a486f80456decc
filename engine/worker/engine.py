"""The engine: model, cache and scheduler, stepped by the worker loop.

`launch` runs one scheduled step (forward + sampling); `PendingStep.wait` is where the host
waits for the device; `step_finished` appends the sampled tokens to their requests before
the postprocess decides stops, so a request that stops on this step is up to date first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from engine.cache import KVCache
from engine.config import ConfigError, EngineConfig, check_one_of
from engine.kernels import build_ops
from engine.layers.sampler import SamplingParams, rows_to, window_logits
from engine.messages import AddRequest
from engine.runtime.postprocess import StepOutput
from engine.worker.graphs import DecodeGraphs
from engine.worker.piecewise import PiecewiseGraphs
from engine.worker.planted import planted_device_delay
from engine.worker.request import Request
from engine.worker.scheduler import ScheduledRow, Scheduler
from engine.worker.step_inputs import StepInputs

log = logging.getLogger("engine.worker")
# engine.state_dtype: the storage of the recurrent-state slots
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def take_rows(values: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """values[rows] without waiting for the GPU: a run of consecutive rows is a view, any
    other choice is gathered by an index sent from pinned memory (`rows_to`). Indexing a
    CUDA tensor by a Python list copies the list from pageable memory, which waits for
    everything queued on the stream first (INVARIANTS 46)."""
    first = rows[0] if rows else 0
    if rows == list(range(first, first + len(rows))):
        return values[first : first + len(rows)]
    return values.index_select(0, rows_to(rows, torch.int64, values.device))


@dataclass
class PendingStep:
    """A launched step: its rows, the device tensors it will produce, and (on CUDA) an event
    after the non-blocking copy of its tokens to pinned host memory."""

    rows: list[ScheduledRow]
    sampled: list[int]  # indices into rows of the rows that sampled a token
    tokens: torch.Tensor  # device [S]
    logprobs: torch.Tensor | None  # device [S] when any sampled row asked for log-probs
    requests: dict[int, Request]  # the engine's live requests, to drop rows removed since
    done: torch.cuda.Event | None = None
    host_tokens: torch.Tensor | None = None  # pinned, valid once `done` has fired
    host_logprobs: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.tokens.is_cuda:  # copy back now, in stream order: a later step may reuse the
            # graph's output buffer, and waiting on the event waits for this step alone
            self.host_tokens = self.tokens.to("cpu", non_blocking=True)
            if self.logprobs is not None:
                self.host_logprobs = self.logprobs.float().to("cpu", non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()

    def wait(self) -> None:
        if self.done is not None:
            self.done.synchronize()

    def finished(self) -> bool:
        """Whether the step (and its tokens' copy) completed: the host may read it now."""
        return self.done is None or self.done.query()

    def feed_index(self) -> dict[int, int]:
        """rid -> index of its token in `tokens`: where the next step reads a token the host
        does not have yet (the overlapped loop)."""
        return {self.rows[i].request.rid: j for j, i in enumerate(self.sampled)}

    def to_host(self) -> StepOutput:
        """The stop check's host copy (the postprocess's `prematerialize`). Rows whose request
        was removed after this step was launched (stopped by the previous step's postprocess,
        or aborted) are dropped: they never reach the postprocess."""
        tokens = self.host_tokens if self.host_tokens is not None else self.tokens.cpu()
        logprobs = self.host_logprobs if self.host_logprobs is not None else self.logprobs
        keep = [
            j for j, i in enumerate(self.sampled)
            if self.requests.get(self.rows[i].request.rid) is self.rows[i].request
        ]  # fmt: skip
        rows = [self.rows[self.sampled[j]] for j in keep]
        tokens = tokens.numpy().astype(np.int64, copy=False)
        if len(keep) < len(self.sampled):
            tokens = tokens[keep]
            logprobs = None if logprobs is None else logprobs[keep]
        return StepOutput(
            rids=np.fromiter((r.request.rid for r in rows), dtype=np.int64, count=len(rows)),
            handles=np.fromiter((r.request.handle for r in rows), dtype=np.int64, count=len(rows)),
            row_walks=[r.walk for r in rows],
            tokens=tokens,
            logprobs=None if logprobs is None else logprobs.float().cpu().numpy(),
            check_stop_buffers={"new_token": tokens},
        )


LogitMask = Callable[[np.ndarray], tuple[np.ndarray, int]]


@dataclass
class Lane:
    """Where a step launches: its ops (attention plans, sampler staging), its step inputs,
    its piecewise runner, and its CUDA stream (None: the current one). The engine's own lane
    runs every step but, with `engine.prefill_stream`, the prefill steps, which launch on a
    lane of their own: nothing staged, planned or captured is shared between the two. ops and
    inputs None: the engine's own (`Engine.ops`, which a benchmark may wrap, and `.inputs`)."""

    ops: object | None
    inputs: StepInputs | None
    piecewise: PiecewiseGraphs | None
    stream: torch.cuda.Stream | None = None


class Engine:
    def __init__(
        self,
        model: torch.nn.Module,
        config: EngineConfig,
        logit_mask: LogitMask | None = None,
        logit_span: tuple[int, int] | None = None,
    ):
        """`logit_mask`: the node's declared mask (NodeSubmodule.sampling_window): every
        sampled row samples only the ids its window allows. `logit_span`: the ids [first,
        end) every window lies in (NodeSubmodule.sampling_span); with `engine.masked_head`
        the model's steps compute logits of those ids alone."""
        if config.kv_pages * config.page_size < config.max_model_len:
            raise ConfigError("engine.kv_pages * page_size must hold one max_model_len request")
        self.model = model
        self.config = config
        self.device = torch.device(config.device)
        param = next(model.parameters())
        check_one_of("engine.state_dtype", config.state_dtype, STATE_DTYPES)
        self.cache = KVCache(
            model.cache_shapes(),
            config.kv_pages,
            config.page_size,
            config.state_slots,
            param.dtype,
            self.device,
            STATE_DTYPES[config.state_dtype],
        )
        self.scheduler = Scheduler(config, self.cache)
        self.first_logit = 0  # the id of the steps' logits' first column
        if config.masked_head and logit_mask is not None and logit_span is not None:
            model.restrict_head(*logit_span)  # before the ops and graphs take the head
            self.first_logit = logit_span[0]
        slots = 2 if config.double_buffer else 1
        max_pages = self.cache.pages_for(config.max_model_len)

        def staged() -> tuple[object, StepInputs]:
            """A lane's ops and step inputs, built from the config."""
            ops = build_ops(
                config.kernels, model, self.device, config.page_size, slots, config.gdn_prefill,
                config.decode_tensor_cores, config.piecewise_gdn, config.gdn_split,
                config.gdn_split_from_tokens, config.dense_kernel, config.triton_launch,
                config.decode_attention, config.pdl, config.gdn_decode,
            )  # fmt: skip
            inputs = StepInputs(
                config.max_tokens_per_step, config.max_rows, max_pages, self.device, slots
            )
            return ops, inputs

        self.ops, self.inputs = staged()
        # engine.prefill_stream on CUDA: the prefill steps' own ops and step inputs (a second
        # FlashInfer workspace, plans and sampler staging), so that a prefill running beside a
        # decode step shares no buffer with it; elsewhere (a CPU runs each step at launch) the
        # prefill lane is the engine's own resources
        side = config.prefill_stream and self.device.type == "cuda"
        prefill_ops, prefill_inputs = staged() if side else (None, None)
        self._check_double_buffering()
        if config.split_mixed:  # two stagings and plans a step: a slot's next use may come
            # before its last copy ran; wait for it there (engine/staging.py, INVARIANTS 64)
            for resource in self._staged():
                resource.fences.wait = True
        self.graphs = self.piecewise = None
        capturable = self.ops.attention_backend is not None  # the CUDA kernels, bf16/fp16
        if config.cuda_graphs and capturable:
            self.graphs = DecodeGraphs(  # a masked node samples its window: no full argmax
                model, self.cache, self.ops, self.inputs, config.max_rows, max_pages,
                greedy=logit_mask is None,
            )  # fmt: skip
        if config.piecewise_graphs and capturable:  # on the prefill lane's resources
            self.piecewise = PiecewiseGraphs(
                model, self.cache, prefill_ops or self.ops, prefill_inputs or self.inputs,
                config.max_tokens_per_step,
            )  # fmt: skip
        # with a prefill stream the piecewise runner is the prefill lane's alone (its static
        # buffers must not serve a decode step beside a prefill): the engine's lane runs a
        # decode step no graph holds eagerly
        self.lane = Lane(None, None, None if side else self.piecewise)
        self.prefill_lane = self.lane
        if config.prefill_stream:
            stream = torch.cuda.Stream(self.device) if side else None
            self.prefill_lane = Lane(prefill_ops, prefill_inputs, self.piecewise, stream)
        self.logit_mask = logit_mask
        self.requests: dict[int, Request] = {}
        self.arrivals = 0  # requests added so far: the next one's arrival order

    def _staged(self) -> list:
        """The resources that stage pinned host memory behind non-blocking copies: each
        declares `force_double_buffer` and keeps its slots' `fences` (engine/staging.py)."""
        resources = (self.inputs, self.ops.attention_backend)
        return [r for r in resources if getattr(r, "force_double_buffer", False)]

    def _check_double_buffering(self) -> None:
        """A resource that declares `force_double_buffer` needs two slots once the host runs
        ahead (the overlapped loop); with one, plan(N+1) may overwrite what N's copy has not
        read. Allowed (the hazard is an arm to compare), never silent."""
        short = [type(r).__name__ for r in self._staged() if r.slots < 2]
        if short and self.config.overlap and self.device.type == "cuda":
            log.warning(
                "engine.overlap with engine.double_buffer=false: %s stage host buffers the "
                "next step may overwrite before they are copied (the staging hazard)",
                ", ".join(short),
            )

    def add_request(self, msg: AddRequest, prompt: list[int]) -> Request:
        params = SamplingParams(msg.temperature, msg.top_p, msg.top_k, msg.seed, msg.logprobs)
        request = Request(msg.rid, prompt, msg.max_tokens, msg.ignore_eos, params, self.arrivals)
        self.arrivals += 1
        self.requests[msg.rid] = request
        self.scheduler.add(request)
        return request

    def remove_request(self, rid: int) -> Request | None:
        self.requests.pop(rid, None)
        return self.scheduler.remove(rid)

    @torch.inference_mode()
    def launch(self, rows: list[ScheduledRow], feed: PendingStep | None = None) -> PendingStep:
        """Stage, plan and launch one step. `feed` is the step still in flight, whose sampled
        tokens are the inputs of rows the host has no token for yet (the overlapped loop);
        they are gathered on the device, never copied to the host first. With
        `engine.prefill_stream` a step of prompt rows alone launches on the prefill lane
        (`launch_prefill`)."""
        if self.config.prefill_stream and all(r.walk == "prefill" for r in rows):
            return self.launch_prefill(rows)
        pending = self._launch(rows, feed, self.lane)
        if self.config.planted_gpu_delay_us:
            planted_device_delay(self.device, self.config.planted_gpu_delay_us)
        return pending

    def mark(self) -> torch.cuda.Event | None:
        """An event after what is queued on the current stream now, for `launch_prefill`'s
        `after` (None where the prefill lane has no stream of its own)."""
        if self.prefill_lane.stream is None:
            return None
        event = torch.cuda.Event()
        event.record()
        return event

    @torch.inference_mode()
    def launch_prefill(
        self, rows: list[ScheduledRow], after: torch.cuda.Event | None = None
    ) -> PendingStep:
        """`engine.prefill_stream`: launch a step of prompt rows on the prefill lane and mark
        its requests `prefilling` until `prefill_finished`. Its stream first waits for `after`
        (default: everything queued on the current stream now): the pages and state slot a
        prompt takes may have been freed by a request whose last steps are queued there, and
        those must have written them before the prompt does (INVARIANTS 65)."""
        for row in rows:
            row.request.prefilling = True
        stream = self.prefill_lane.stream
        if stream is None:
            return self._launch(rows, None, self.prefill_lane)
        if after is None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        else:
            stream.wait_event(after)
        with torch.cuda.stream(stream):  # its PendingStep's copy and event on that stream too
            return self._launch(rows, None, self.prefill_lane)

    def prefill_finished(self, pending: PendingStep) -> None:
        """A prefill step's requests may decode now (its tokens are on the host)."""
        for row in pending.rows:
            row.request.prefilling = False

    def _launch(self, rows, feed: PendingStep | None, lane: Lane) -> PendingStep:
        sampled = [i for i, row in enumerate(rows) if row.samples]
        picked = [rows[i].request for i in sampled]
        params = [r.sampling for r in picked]
        # every sampled row greedy, nothing masked or asked beyond the token: a captured
        # decode step's own argmax is the step's sample
        plain = self.logit_mask is None and all(p.greedy and not p.logprobs for p in params)
        feed_from = feed.tokens if feed is not None else None
        feed_index = feed.feed_index() if feed is not None else None
        decode = self._split_at(rows)
        if decode:
            logits, greedy = self._forward_split(rows, decode, sampled, feed_from, feed_index,
                                                 plain)  # fmt: skip
        else:
            logits, greedy = self._forward(rows, feed_from, feed_index, lane)
        for row in rows:
            row.request.num_cached += row.num_new
        if not picked:  # every row was a prompt chunk that does not end its prompt
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            return PendingStep(rows, sampled, empty, None, self.requests)
        if greedy is not None and plain:
            return PendingStep(rows, sampled, greedy, None, self.requests)
        if len(sampled) < len(rows):
            logits = take_rows(logits, sampled)
        # The sampled token's index in its request's output (its token may not be on the
        # host yet: num_cached, already advanced, counts it).
        output_index = [r.num_cached - len(r.prompt) for r in picked]
        offsets = None
        if self.logit_mask is not None:
            low, width = self.logit_mask(np.array(output_index))
            logits, offsets = window_logits(logits, low, width, self.first_logit)
        # A decode graph's logits are the model's dtype (widened here, past the mask's window:
        # the sampler's math is fp32); any other step's are fp32 already (float() is a no-op).
        tokens, logprobs = (lane.ops or self.ops).sample(logits.float(), params, output_index)
        if offsets is not None:  # an index into the window -> the token id
            tokens = tokens + offsets
        want_logprobs = any(p.logprobs for p in params)
        return PendingStep(
            rows, sampled, tokens, logprobs if want_logprobs else None, self.requests
        )

    def _forward(
        self, rows, feed_from, feed_index, lane: Lane | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One launch of `rows`' forward on `lane` (default: the engine's): each row's
        last-token logits, and when a captured decode step ran, its own argmax of them (else
        None). A decode step replays its graph, any other step the lane's piecewise runner,
        or runs eagerly without graphs."""
        lane = lane or self.lane
        decode = all(r.walk == "decode" for r in rows)
        if lane is self.lane and self.graphs is not None and decode:
            step = self.graphs.replay(rows, feed_from, feed_index)
            greedy = step.tokens[: len(rows)] if step.tokens is not None else None
            return step.logits[: len(rows)], greedy
        if lane.piecewise is not None:
            return lane.piecewise.run(rows, feed_from, feed_index), None
        ops, inputs = lane.ops or self.ops, lane.inputs or self.inputs
        batch = inputs.stage(rows, self.cache, ops, feed_index=feed_index)
        batch.gather_fed_tokens(feed_from)
        ops.begin_step(batch)
        return self.model(batch, self.cache), None

    def _split_at(self, rows: list[ScheduledRow]) -> int:
        """With `engine.split_mixed`, the count of a mixed step's decode rows (the scheduler
        puts them first, the prompt rows after), which launch apart from the prompt rows;
        0: the step launches whole."""
        if not self.config.split_mixed:
            return 0
        decode = next((i for i, r in enumerate(rows) if r.walk != "decode"), len(rows))
        if decode == len(rows) or any(r.walk == "decode" for r in rows[decode:]):
            return 0
        return decode

    def _forward_split(
        self, rows, decode: int, sampled: list[int], feed_from, feed_index, plain: bool
    ):  # fmt: skip
        """`_forward` of a mixed step in two launches, back to back on the stream: the first
        `decode` rows (decode rows, on their graph when captured; fed as the whole step would
        be), then the prompt rows (the host has all their tokens). With `plain` and the
        decode graph's own argmax: (None, the sampled rows' argmax: the graph's, then the
        prompt rows' by `ops`); else (both launches' logits in row order, fp32, None)."""
        head_logits, head_greedy = self._forward(rows[:decode], feed_from, feed_index)
        tail_logits, _ = self._forward(rows[decode:], None, None)
        if plain and head_greedy is not None:  # every decode row samples: sampled[:decode]
            tail = take_rows(tail_logits, [i - decode for i in sampled[decode:]])
            if not len(tail):
                return None, head_greedy
            return None, torch.cat([head_greedy, self.ops.argmax(tail)])
        return torch.cat([head_logits.float(), tail_logits]), None

    def run_step(self) -> tuple[list[ScheduledRow], StepOutput | None]:
        """One step of the strict loop without the runtime: schedule, launch, wait, the host
        copy, the tokens recorded; the start-up warmup's and the step benchmarks'. Nothing
        scheduled: nothing launched, ([], None)."""
        rows = self.scheduler.schedule()
        if not rows:
            return rows, None
        pending = self.launch(rows)
        pending.wait()
        out = pending.to_host()
        self.prefill_finished(pending)
        self.step_finished(out)
        return rows, out

    def step_finished(self, output: StepOutput) -> None:
        for rid, token in zip(output.rids.tolist(), output.tokens.tolist(), strict=True):
            self.requests[rid].tokens.append(token)

    def pool_stats(self) -> dict[str, int]:
        return {
            "free_pages": self.cache.pages.num_free,
            "total_pages": self.cache.pages.size,
            "free_slots": self.cache.slots.num_free,
            "total_slots": self.cache.slots.size,
            "running": len(self.scheduler.running),
            "waiting": len(self.scheduler.waiting),
        }

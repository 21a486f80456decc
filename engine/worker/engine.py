"""The engine: model, cache and scheduler, stepped by the worker loop.

`launch` runs one scheduled step (forward + sampling); `PendingStep.wait` is where the host
waits for the device; `step_finished` appends the sampled tokens to their requests before
the postprocess decides stops, so a request that stops on this step is up to date first.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.cache import KVCache
from engine.config import EngineConfig
from engine.kernels import build_ops
from engine.layers.sampler import SamplingParams, take_rows, window_logits
from engine.messages import AddRequest
from engine.runtime.postprocess import StepOutput
from engine.worker.graphs import DecodeGraphs
from engine.worker.lane import Lane, check_double_buffering, staging
from engine.worker.pending_step import PendingStep
from engine.worker.piecewise import PiecewiseGraphs
from engine.worker.planted import planted_device_delay
from engine.worker.request import Request
from engine.worker.scheduler import ScheduledRow, Scheduler
from engine.worker.step_inputs import StepInputs
from engine.worker.streams import own_streams

# engine.state_dtype (engine/config/cache.py): the storage of the recurrent-state slots
STATE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


LogitMask = Callable[[np.ndarray], tuple[np.ndarray, int]]


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
        self.model = model
        self.config = config
        parts = config.parts
        cache, scheduling, graphs = parts.cache, parts.scheduler, parts.graphs
        self.device = torch.device(parts.device.device)
        param = next(model.parameters())
        self.cache = KVCache(
            model.cache_shapes(),
            cache.kv_pages,
            cache.page_size,
            cache.state_slots,
            param.dtype,
            self.device,
            STATE_DTYPES[cache.state_dtype],
        )
        self.scheduler = Scheduler(scheduling, self.cache)
        self.first_logit = 0  # the id of the steps' logits' first column
        if parts.kernels.masked_head and logit_mask is not None and logit_span is not None:
            model.restrict_head(*logit_span)  # before the ops and graphs take the head
            self.first_logit = logit_span[0]
        if self.device.type == "cuda" and hasattr(model, "rotary"):  # 2 kernels a step, not 8
            model.rotary.tabulate(cache.max_model_len, self.device)
        max_pages = self.cache.pages_for(cache.max_model_len)
        max_tokens, max_rows = scheduling.max_tokens_per_step, scheduling.max_rows

        def staged() -> tuple[object, StepInputs]:
            """A lane's ops and step inputs, built from the config."""
            ops = build_ops(parts.kernels, model, self.device, cache.page_size, graphs.slots)
            inputs = StepInputs(max_tokens, max_rows, max_pages, self.device, graphs.slots)
            return ops, inputs

        self.ops, self.inputs = staged()
        # engine.prefill_stream on CUDA: the prefill steps' own ops and step inputs (a second
        # FlashInfer workspace, plans and sampler staging), so that a prefill running beside a
        # decode step shares no buffer with it; elsewhere (a CPU runs each step at launch) the
        # prefill lane is the engine's own resources
        side = scheduling.prefill_stream and self.device.type == "cuda"
        prefill_ops, prefill_inputs = staged() if side else (None, None)
        # the decode graphs' stream and the prefill lane's: never one CUDA stream (streams.py)
        capture, prefill_stream = own_streams(self.device, 2, self) if side else (None, None)
        check_double_buffering(self.inputs, self.ops, parts.loop.overlap, self.device)
        if scheduling.split_mixed:  # two stagings and plans a step: a slot's next use may come
            # before its last copy ran; wait for it there (engine/staging.py, INVARIANTS 64)
            for resource in staging(self.inputs, self.ops):
                resource.fences.wait = True
        self.graphs = self.piecewise = None
        capturable = self.ops.attention_backend is not None  # the CUDA kernels, bf16/fp16
        if graphs.cuda_graphs and capturable:
            self.graphs = DecodeGraphs(  # a masked node samples its window: no full argmax
                model, self.cache, self.ops, self.inputs, max_rows, max_pages,
                greedy=logit_mask is None, stream=capture,
            )  # fmt: skip
        if graphs.piecewise_graphs and capturable:  # on the prefill lane's resources
            self.piecewise = PiecewiseGraphs(
                model, self.cache, prefill_ops or self.ops, prefill_inputs or self.inputs,
                max_tokens, stream=prefill_stream,
            )  # fmt: skip
        # with a prefill stream the piecewise runner is the prefill lane's alone (its static
        # buffers must not serve a decode step beside a prefill): the engine's lane runs a
        # decode step no graph holds eagerly
        self.lane = Lane(None, None, None if side else self.piecewise)
        self.prefill_lane = self.lane
        if scheduling.prefill_stream:
            self.prefill_lane = Lane(prefill_ops, prefill_inputs, self.piecewise, prefill_stream)
        self.logit_mask = logit_mask
        self.requests: dict[int, Request] = {}
        self.arrivals = 0  # requests added so far: the next one's arrival order

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
        if self.scheduler.config.prefill_stream and all(r.walk == "prefill" for r in rows):
            return self.launch_prefill(rows)
        pending = self._launch(rows, feed, self.lane)
        if delay_us := self.config.parts.loop.planted_gpu_delay_us:
            planted_device_delay(self.device, delay_us)
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
        if not self.scheduler.config.split_mixed:
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

"""Continuous batching: who runs in the next step, and how many tokens each.

Requests join between steps. Admission is oldest first and reserves the request's whole
page budget and a state slot, so a request that does not fit waits rather than failing,
and a younger request never overtakes an older one (no starvation). With `mixing` off a
step is all prefill or all decode; with it on (or `split_mixed`), prefill chunks fill the
decode step's leftover token budget; with `prefill_stream`, `schedule_apart` gives an
iteration's decode rows and prompt rows apart, for two launches on two streams. With
`prefill_hold_steps` N > 0, prompts not yet begun wait up to N steps while other rows decode,
so that arrivals a few steps apart prefill in one step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from engine.cache import KVCache
from engine.config.scheduler import SchedulerConfig
from engine.worker.request import Request


@dataclass
class ScheduledRow:
    request: Request
    num_new: int
    walk: str  # "prefill" or "decode"

    @property
    def samples(self) -> bool:
        """The row ends a prompt (or is a decode row), so the step samples a token for it. A
        decode row whose input token is still on the device (the overlapped loop launched
        this step before the last one's tokens reached the host) reaches past `tokens`."""
        return self.request.num_cached + self.num_new >= len(self.request.tokens)


class Scheduler:
    def __init__(self, config: SchedulerConfig, cache: KVCache):
        self.config = config
        self.cache = cache
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._held = 0  # steps run while some prompt waited, since none last waited

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def remove(self, rid: int) -> Request | None:
        """Take a request out (finished or aborted) and free its pages and slot."""
        for queue in (self.running, self.waiting):
            for i, request in enumerate(queue):
                if request.rid == rid:
                    del queue[i]
                    self._free(request)
                    return request
        return None

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def schedule(self) -> list[ScheduledRow]:
        self._admit()
        tokens_left = self.config.max_tokens_per_step
        decode = [r for r in self.running if r.prefill_done]
        prefill = [r for r in self.running if not r.prefill_done]
        if not prefill:
            self._held = 0
        elif decode and self._hold(prefill):
            prefill = []
        rows: list[ScheduledRow] = []
        if decode and (self.config.mixes or not prefill):
            rows = [ScheduledRow(r, 1, "decode") for r in decode]
            tokens_left -= len(rows)
            if not self.config.mixes:
                return rows
        return rows + self._chunks(prefill, tokens_left)

    def schedule_apart(self, prefill_busy: bool) -> tuple[list[ScheduledRow], list[ScheduledRow]]:
        """`engine.prefill_stream`: this iteration's decode rows and prompt rows, launched
        apart. Decode rows: every running request whose prompt is done and whose prefill step
        is not still in flight (`Request.prefilling`). Prompt rows (none while `prefill_busy`:
        one prefill step in flight at a time): the waiting prompts oldest first within a step's
        tokens, held as `schedule` holds them."""
        self._admit()
        decode = [
            ScheduledRow(r, 1, "decode") for r in self.running if r.prefill_done and not r.prefilling
        ]  # fmt: skip
        if prefill_busy:
            return decode, []
        prefill = [r for r in self.running if not r.prefill_done]
        if not prefill:
            self._held = 0
            return decode, []
        if decode and self._hold(prefill):
            return decode, []
        return decode, self._chunks(prefill, self.config.max_tokens_per_step)

    def _chunks(self, prefill: list[Request], tokens_left: int) -> list[ScheduledRow]:
        """The prompts' next chunks, oldest first, within `tokens_left` tokens."""
        rows = []
        for request in prefill:  # oldest first: running keeps admission order
            if tokens_left <= 0:
                break
            chunk = min(request.pending, tokens_left)
            rows.append(ScheduledRow(request, chunk, "prefill"))
            tokens_left -= chunk
        return rows

    def _hold(self, prefill: list[Request]) -> bool:
        """Whether this step leaves the waiting prompts for a later one (INVARIANTS 53): only
        while rows decode (the caller's), none of them has begun (a begun prompt's chunks go
        on), they add up to less than a step's tokens, and they have waited fewer than
        `prefill_hold_steps` steps. Once released, prompts run until none waits, arrivals
        meanwhile included; the count restarts when none waits."""
        if (
            self._held >= self.config.prefill_hold_steps
            or any(r.num_cached for r in prefill)
            or sum(r.pending for r in prefill) >= self.config.max_tokens_per_step
        ):
            return False
        self._held += 1
        return True

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.config.max_rows:
            request = self.waiting[0]
            pages = self.cache.pages_for(request.reserved_tokens)
            if pages > self.cache.pages.num_free or self.cache.slots.num_free == 0:
                return  # the oldest waits for memory; nobody overtakes it
            self.waiting.popleft()
            request.pages = self.cache.pages.take(pages)
            # Not zeroed: a row with nothing cached never reads its slot (INVARIANTS 44).
            request.slot = self.cache.slots.take(1)[0]
            self.running.append(request)

    def _free(self, request: Request) -> None:
        if request.pages:
            self.cache.pages.give(request.pages)
            request.pages = []
        if request.slot is not None:
            self.cache.slots.give([request.slot])
            request.slot = None

"""The graph runtime's per-request state: handles, walks, loop counts and stop limits.

Requests are addressed by a recycled integer handle; everything the stop check reads is a
column indexed by handle, so checking a step is a gather plus one policy expression.
A handle's limits are cleared on removal: a recycled handle has none until its own are
registered (INVARIANTS 4).
"""

from __future__ import annotations

import numpy as np

from engine.cache import FreeList
from engine.runtime.graph import GraphSpec
from engine.runtime.stops import StopColumns, StopKind, StopLimits, StopPolicy, cap_reached

MAX_EOS = 8  # EOS ids a request may carry; more is a configuration error


class _WalkLimits:
    """Stop limits of one walk, packed in one int64 row per handle so a step gathers them
    with a single take: [cap, registered, stop_token_0, stop_token_1, ...] (padded -1)."""

    CAP, HAS, STOP = 0, 1, 2

    def __init__(self, capacity: int):
        self.packed = np.zeros((capacity, self.STOP + MAX_EOS), dtype=np.int64)
        self.packed[:, self.STOP :] = -1
        self.width = self.STOP + 1  # columns in use: up to the widest stop-token list

    def set(self, handle: int, limits: StopLimits) -> None:
        if len(limits.eos_ids) > MAX_EOS:
            raise ValueError(f"at most {MAX_EOS} EOS ids, got {len(limits.eos_ids)}")
        stop = limits.stop_tokens
        row = self.packed[handle]
        row[self.STOP :] = -1
        row[self.STOP : self.STOP + len(stop)] = stop
        row[self.CAP] = limits.max_iters
        row[self.HAS] = 1
        self.width = max(self.width, self.STOP + len(stop))

    def grow(self, extra: int) -> None:
        more = np.zeros((extra, self.packed.shape[1]), dtype=np.int64)
        more[:, self.STOP :] = -1
        self.packed = np.concatenate([self.packed, more])

    def clear(self, handle: int) -> None:
        self.packed[handle, self.HAS] = 0


class GraphRuntime:
    def __init__(self, graph: GraphSpec, capacity: int):
        self.graph = graph
        self.capacity = capacity
        self._handles = FreeList(capacity)
        self._by_rid: dict[int, int] = {}
        self.rid_of = np.full(capacity, -1, dtype=np.int64)
        self.walk_of: list[str | None] = [None] * capacity
        self.iters = {loop: np.zeros(capacity, dtype=np.int64) for loop in graph.loops}
        self._limits = {walk: _WalkLimits(capacity) for walk in graph.walks}
        self._policies: dict[str, tuple[str, StopPolicy]] = {}

    # --- declarations, once at startup -------------------------------------------------
    def declare_stop_policies(self, walk: str, policies: dict[str, StopPolicy] | None) -> None:
        for loop in policies or {}:
            if self.graph.loops.get(loop) != walk:
                raise ValueError(f"policy for loop {loop!r}, which walk {walk!r} does not run")
        if policies:
            self._policies[walk] = next(iter(policies.items()))  # one loop per walk

    def token_column(self, walk: str | None, buffers: dict[str, np.ndarray]) -> np.ndarray | None:
        """The stop buffer a step's declared policy reads; None when the runtime cannot check
        the step (it mixes walks, its walk declares no policy, or the buffer is missing)."""
        declared = self._policies.get(walk) if walk is not None else None
        return None if declared is None else buffers.get(declared[1].token_column)

    # --- requests ------------------------------------------------------------------------
    def add_request(self, rid: int) -> int:
        if self._handles.num_free == 0:
            self._grow()
        handle = self._handles.take(1)[0]
        self._by_rid[rid] = handle
        self.rid_of[handle] = rid
        self.walk_of[handle] = self.graph.walks[0]
        for counts in self.iters.values():
            counts[handle] = 0
        return handle

    def _grow(self) -> None:
        """Double the handle space; handles in use keep their numbers."""
        old = self.capacity
        self.capacity *= 2
        self._handles.extend(old, self.capacity)
        self.rid_of = np.concatenate([self.rid_of, np.full(old, -1, dtype=np.int64)])
        self.walk_of.extend([None] * old)
        for loop, counts in self.iters.items():
            self.iters[loop] = np.concatenate([counts, np.zeros(old, dtype=np.int64)])
        for table in self._limits.values():
            table.grow(old)

    def register_limits(self, handle: int, walk: str, limits: StopLimits) -> None:
        self._limits[walk].set(handle, limits)

    def remove_request(self, rid: int) -> None:
        handle = self._by_rid.pop(rid)
        for table in self._limits.values():
            table.clear(handle)
        self.rid_of[handle] = -1
        self.walk_of[handle] = None
        self._handles.give([handle])

    def handle(self, rid: int) -> int:
        return self._by_rid[rid]

    def handles(self, rids: np.ndarray) -> np.ndarray:
        return np.fromiter((self._by_rid[int(r)] for r in rids), dtype=np.int64, count=len(rids))

    def has_request(self, rid: int) -> bool:
        return rid in self._by_rid

    @property
    def num_requests(self) -> int:
        return len(self._by_rid)

    # --- the stop check ------------------------------------------------------------------
    def check_stops(
        self, walk: str, handles: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None] | None:
        """(stopped, by_token, missed) for rows of one walk; None when no policy is declared.

        `missed` marks rows whose limits are not registered (None when there are none): the
        model's check_stop decides those (the STOPS break)."""
        declared = self._policies.get(walk)
        if declared is None:
            return None
        loop, policy = declared
        table = self._limits[walk]
        rows = table.packed[:, : table.width].take(handles, axis=0)
        cols = StopColumns(
            self.iters[loop].take(handles), rows[:, table.CAP], rows[:, table.STOP :]
        )
        stopped, by_token = policy.stops(tokens, cols)
        if policy.kind is StopKind.EOS:  # the loop's cap is its budget; the runtime enforces it
            stopped = stopped | cap_reached(cols)
        has = rows[:, table.HAS]
        if has.all():
            return stopped, by_token, None
        has = has.astype(bool)
        return stopped & has, by_token & has, ~has

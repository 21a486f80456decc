"""A fixed pool of integer ids (KV pages, state slots, runtime handles)."""

from __future__ import annotations


class FreeList:
    """Fixed pool of integer ids; lowest ids first so runs are reproducible."""

    def __init__(self, size: int):
        self.size = size
        self._free = list(range(size - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int]:
        if n > len(self._free):
            raise MemoryError(f"asked for {n} ids, {len(self._free)} free")
        return [self._free.pop() for _ in range(n)]

    def extend(self, start: int, stop: int) -> None:
        """Add ids [start, stop) to the pool (they are taken after the current free ones)."""
        self._free[:0] = range(stop - 1, start - 1, -1)
        self.size += stop - start

    def give(self, ids: list[int]) -> None:
        self._free.extend(reversed(ids))
        if len(self._free) > self.size:
            raise AssertionError("an id was freed twice")

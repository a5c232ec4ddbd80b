"""Allocation of zero-copy buffers inside one rank's arena of the group segment.

A buffer's space returns to the arena when the array and every view of it are gone: each buffer is built on its
own memoryview, so numpy's base chain of every view ends at the buffer array, and a weakref finalizer on that
array frees the range.
"""

from __future__ import annotations

import threading

ALIGNMENT = 64  # a cache line: vectorised reductions and copies start aligned


class Arena:
    """First-fit allocator over [start, start + size) with coalescing frees. Thread-safe."""

    def __init__(self, start: int, size: int):
        self.start, self.size = start, size
        self._free: list[tuple[int, int]] = [(start, size)] if size else []
        self._lock = threading.Lock()

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a fresh range of at least `nbytes` (aligned), or None when no free range is large enough."""
        need = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        with self._lock:
            for i, (offset, length) in enumerate(self._free):
                if length >= need:
                    self._free[i : i + 1] = [(offset + need, length - need)] if length > need else []
                    return offset
        return None

    def free(self, offset: int, nbytes: int) -> None:
        need = max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)
        with self._lock:
            blocks = sorted([*self._free, (offset, need)])
            merged: list[tuple[int, int]] = []
            for start, length in blocks:
                if merged and merged[-1][0] + merged[-1][1] == start:
                    merged[-1] = (merged[-1][0], merged[-1][1] + length)
                else:
                    merged.append((start, length))
            self._free = merged

    def contains(self, offset: int, nbytes: int) -> bool:
        return self.start <= offset and offset + nbytes <= self.start + self.size

    def free_bytes(self) -> int:
        with self._lock:
            return sum(length for _, length in self._free)

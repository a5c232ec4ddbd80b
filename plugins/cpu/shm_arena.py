"""Allocation of shared arrays inside one rank's arena of the group segment: zero-copy inputs and large outputs.

A block's space returns to the arena when its array and every view of it are gone: each block is built on its
own memoryview, so numpy's base chain of every view ends at the block's array, and a weakref finalizer on that
array frees the range. The arena's file pages are backed with memory (fallocate) up to a high-water mark that
only grows: backing an already backed range costs milliseconds per 64 MiB, so it is done once.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

ALIGNMENT = 64  # a cache line: vectorised reductions and copies start aligned


class Arena:
    """First-fit allocator over [start, start + size) with coalescing frees. Thread-safe.

    `reserve(offset, length)` backs a range of the segment with memory (raising ConfigurationError when /dev/shm
    is full); `allocate` calls it for whatever part of a new block lies beyond the high-water mark.
    """

    def __init__(self, start: int, size: int, reserve: Callable[[int, int], None]):
        self.start, self.size = start, size
        self._free: list[tuple[int, int]] = [(start, size)] if size else []
        self._lock = threading.Lock()
        self._returned: collections.deque[tuple[int, int]] = collections.deque()  # freed, not yet merged (free)
        self._reserve = reserve
        self._backed_end = start

    def allocate(self, nbytes: int, keep_free: int = 0) -> int | None:
        """Offset of a fresh, backed range of at least `nbytes` (aligned), or None when no free range is large
        enough or taking it would leave less than `keep_free` bytes free. Raises when backing it fails."""
        need = _rounded(nbytes)
        with self._lock:
            self._merge_returned()
            if sum(length for _, length in self._free) - need < keep_free:
                return None
            for i, (offset, length) in enumerate(self._free):
                if length >= need:
                    self._free[i : i + 1] = [(offset + need, length - need)] if length > need else []
                    break
            else:
                return None
            if offset + need > self._backed_end:
                try:
                    self._reserve(self._backed_end, offset + need - self._backed_end)
                except BaseException:
                    self._free_locked(offset, need)
                    raise
                self._backed_end = offset + need
            return offset

    def free(self, offset: int, nbytes: int) -> None:
        """Give a block back. Its callers are finalizers (an output array gone), which a garbage collection may run
        in the middle of this arena's own `allocate` on the same thread: so it never waits for the lock; a block
        returned while the lock is taken is merged by the next call that takes it."""
        self._returned.append((offset, _rounded(nbytes)))
        if self._lock.acquire(blocking=False):
            try:
                self._merge_returned()
            finally:
                self._lock.release()

    def _merge_returned(self) -> None:
        while self._returned:
            self._free_locked(*self._returned.popleft())

    def _free_locked(self, offset: int, need: int) -> None:
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
            self._merge_returned()
            return sum(length for _, length in self._free)


def _rounded(nbytes: int) -> int:
    return max(ALIGNMENT, -(-nbytes // ALIGNMENT) * ALIGNMENT)

"""Gradient buckets on the daemon: an ALL_REDUCE instruction with several inputs reduces them as one flat array.

The flat array lives in the communicator's shared memory where the transport has some (`comm.buffer`: its
all_reduce then reads it in place), and the executor binds the segment outputs that fill the bucket straight
onto views of it (`Segment.place`): the backward pass writes each gradient where the all-reduce reads it, with
no Concat and no copy-in. The results come back as views of the reduced flat array, which the update segment
binds as its inputs: no Split either. Placement only saves copies; every run checks it, and an input found
elsewhere (another program placed that output, a shape changed) is copied in.

    bucket = FlatBucket(comm, ["g/w", "g/b"])
    bucket.plan([((512, 784), np.float32), ((512,), np.float32)])   # before the first run, to place outputs
    reduced_w, reduced_b = bucket([grad_w, grad_b], "mean", async_op=False)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tessel.core.errors import ConfigurationError


class FlatBucket:
    """The flat buffer of one bucket instruction and each tensor's view of it."""

    def __init__(self, comm: Any, names: Sequence[str]):
        self.comm, self.names = comm, tuple(names)
        self.signature: tuple[tuple[tuple[int, ...], np.dtype], ...] = ()
        self.flat: np.ndarray | None = None
        self.views: tuple[np.ndarray, ...] = ()
        self._bounds: tuple[tuple[int, int, tuple[int, ...]], ...] = ()
        self._addresses: tuple[int, ...] = ()

    def plan(self, signature: Sequence[tuple[tuple[int, ...], np.dtype]]) -> None:
        """Lay the tensors (shape, dtype each, one dtype for all) out back to back in a new flat buffer."""
        signature = tuple((tuple(int(d) for d in shape), np.dtype(dtype)) for shape, dtype in signature)
        dtypes = {dtype for _, dtype in signature}
        if len(dtypes) != 1:
            raise ConfigurationError(
                f"the tensors {list(self.names)} of one all_reduce bucket must share a dtype, "
                f"got {sorted(map(str, dtypes))}; put tensors of each dtype in a bucket of their own"
            )
        bounds, offset = [], 0
        for shape, _ in signature:
            size = int(np.prod(shape, dtype=np.int64))
            bounds.append((offset, offset + size, shape))
            offset += size
        self.signature, self._bounds = signature, tuple(bounds)
        self.flat = self._buffer(offset, dtypes.pop())
        self.views = tuple(self.flat[lo:hi].reshape(shape) for lo, hi, shape in bounds)
        self._addresses = tuple(_address(v) for v in self.views)

    def _buffer(self, size: int, dtype: np.dtype) -> np.ndarray:
        make = getattr(self.comm, "buffer", None)
        if make is not None:
            try:
                return make((size,), dtype)
            except ConfigurationError:
                pass  # the shared arena is full: a private buffer works, with a copy inside the all_reduce
        return np.zeros(size, dtype)

    def __call__(self, xs: Sequence[np.ndarray], op: str, async_op: bool) -> Any:
        """All-reduce the tensors (in `names` order); returns their reduced values (or a handle to them)."""
        signature = tuple((x.shape, x.dtype) for x in xs)
        if signature != self.signature:
            self.plan(signature)
        for x, view, address in zip(xs, self.views, self._addresses):
            if _address(x) != address:
                np.copyto(view, x)
        result = self.comm.all_reduce(self.flat, op, async_op=async_op)
        return _Split(result, self._bounds) if async_op else _split(result, self._bounds)


class _Split:
    """A collective's handle whose wait() returns the reduced flat array as the bucket's tensors."""

    def __init__(self, handle: Any, bounds: tuple):
        self.handle, self.bounds = handle, bounds

    def wait(self, timeout: float | None = None) -> list[np.ndarray]:
        return _split(self.handle.wait(timeout), self.bounds)

    def done(self) -> bool:
        return self.handle.done()

    @property
    def started(self) -> int:
        return getattr(self.handle, "started", 0)

    @property
    def finished(self) -> int:
        return getattr(self.handle, "finished", 0)


def _split(flat: np.ndarray, bounds: tuple) -> list[np.ndarray]:
    return [flat[lo:hi].reshape(shape) for lo, hi, shape in bounds]


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]

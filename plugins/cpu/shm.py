"""Collectives between the processes of one host over shared memory: the CPU plugin's intra-host transport.

Every collective is a few rounds of the engine in `shm_channel` (write your half, meet, read the others'):

- all_reduce, small (<= `small_bytes`): one round, every member reduces every member's copy (latency-optimal);
- all_reduce, all_gather and broadcast, large: the pipelines of `shm_pipelines`, which write straight into the
  peers' outputs (bandwidth-optimal). An input made by `buffer()` is read in place (no copy-in);
- reduce_scatter: member i reduces block i's slice of every other member's half and of its own input (one round
  per slice);
- all_gather and broadcast, small; all_to_all, neighbor_exchange: streams of half-sized rounds;
- send/recv: a channel per (sender, receiver) pair, so they need not involve the rest of the group.

The outputs of the pipelines, and any output of RECYCLE_BYTES or more, live in this rank's arena (where `buffer()`
arrays live): peers can write them, and their memory is reused once the caller drops them, where a fresh numpy
array of 32 MiB or more would fault in and zero its pages on every call (measured here: 10-15 ms per 64 MiB, more
than the copy that fills it; glibc's mmap threshold cannot be raised past 32 MiB). They are ordinary numpy arrays
that do not own their memory, and like `buffer()` arrays they keep the group's mapping alive until they are
dropped, also after close(). Outputs take arena space only while half of the arena stays free for `buffer()`;
otherwise they come from numpy and the pipelines take their fallback.

Results are bitwise identical on every member (each element is reduced once, in group-rank order).
Semantics follow MindSpore: all_gather concatenates on dim 0, reduce_scatter gives rank i block i of dim 0,
all_to_all splits on split_dim and concatenates on concat_dim in group-rank order; ranks are group ranks.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from concurrent.futures import Future
from typing import NoReturn

import numpy as np

from tessel.core import collectives
from tessel.core.errors import ConfigurationError
from tessel.core.plugin import Communicator, GroupContext, Handle
from tessel.plugins.cpu import shm_pipelines
from tessel.plugins.cpu.shm_agree import Descriptor
from tessel.plugins.cpu.shm_arena import Arena
from tessel.plugins.cpu.shm_channel import Channel, Engine
from tessel.plugins.cpu.shm_pipelines import BYTE as _BYTE
from tessel.plugins.cpu.shm_pipelines import ceil_div as _ceil

RECYCLE_BYTES = 1 << 20  # outputs from this size on come from the arena (see the module docstring)


def _bytes_of(x: np.ndarray) -> np.ndarray:
    """The C-order bytes of x as a flat uint8 array (a view when x is contiguous)."""
    return np.ascontiguousarray(x).reshape(x.size).view(_BYTE) if x.size else np.empty(0, _BYTE)


class ShmCommunicator(Communicator):
    """Collectives over one group whose members all run on this host. Created by every member (a rendezvous).

    send blocks until the peer's matching recv starts (a rendezvous, so mismatches fail on both sides); to
    exchange in both directions, start one of the two with async_op=True. A neighbor_exchange is a collective:
    every member calls it, with empty lists if it has nothing to send or receive.

    Example (on each of 2 processes, `context` naming both):
        comm = ShmCommunicator(context)
        grad = comm.buffer((1024,), np.float32)   # lives in shared memory: all_reduce reads it in place
        grad[:] = local_gradient
        total = comm.all_reduce(grad, "sum")
        comm.close()
    """

    transport = "shm"
    compute_bound = True  # every byte is copied or reduced by this rank's own threads

    def __init__(self, context: GroupContext):
        super().__init__(context)
        # all_gather (output size) and broadcast from these sizes on take the pipelines: measured crossovers on
        # 2 cores were 256-512 KiB for all_gather and about 1 MiB for broadcast, at 2 and 4 ranks.
        self.gather_bytes = 512 << 10
        self.broadcast_bytes = 1 << 20
        self._engine = Engine(context)
        layout = self._engine.layout
        # all_reduce up to this size takes the one-round algorithm: measured crossovers on 2 cores were about
        # 512 KiB at 2 ranks, 256 KiB at 3, 192 KiB at 4 and 128 KiB at 8 (the one-round work grows with size**2);
        # never more than a rank's slot holds, which a small TESSEL_SHM_CHUNK_KIB makes smaller
        self.small_bytes = min(256 << 10, (768 << 10) // context.size, layout.group_half)
        self._arena = Arena(layout.arena_start(context.group_rank), layout.arena, self._engine.segment.reserve)
        self._problems: dict[tuple[np.dtype, str | None], str] = {}
        self._views: dict[tuple, tuple] = {}

    # ---------------------------------------------------------------------------------------------- public extras

    def buffer(self, shape: Sequence[int] | int, dtype: np.dtype | str = np.float32) -> np.ndarray:
        """A zeroed array in this rank's shared memory; all_reduce of it (or a contiguous view) skips the copy-in.

        Its space returns to the arena when it and all its views are gone.
        """
        engine = self._engine
        engine.usable()
        dtype = np.dtype(dtype)
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        offset = self._arena.allocate(nbytes)
        if offset is None:
            raise ConfigurationError(
                f"group '{self.context.name}': no room for a {nbytes}-byte shared-memory buffer "
                f"({self._arena.free_bytes()} of {self._arena.size} bytes free on rank {self.context.rank}); "
                "free buffers you no longer use or raise TESSEL_SHM_ARENA_MIB before creating the group"
            )
        array = self._array_at(offset, shape, dtype, nbytes)
        array.fill(0)
        return array

    def close(self) -> None:
        """Leave the group: peers still waiting for this rank get PeerFailedError. Idempotent."""
        super().close()
        self._views.clear()
        self._engine.close()

    # ---------------------------------------------------------------------------------------------- outputs

    def _array_at(self, offset: int, shape: tuple[int, ...], dtype: np.dtype, nbytes: int) -> np.ndarray:
        """An array over arena bytes [offset, offset + nbytes) that frees them when it and its views are gone."""
        flat = np.frombuffer(self._engine.segment.raw[offset : offset + nbytes], dtype)
        weakref.finalize(flat, self._arena.free, offset, nbytes).atexit = False
        return flat.reshape(shape)

    def _output(self, shape: tuple[int, ...], dtype: np.dtype, shared: bool = False) -> tuple[np.ndarray, int]:
        """A new uninitialised output and its offset in the segment: in the arena when `shared` (a pipeline's) or
        large, when there is room; -1 when it is private (from numpy)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if nbytes and (shared or nbytes >= RECYCLE_BYTES):
            try:
                offset = self._arena.allocate(nbytes, keep_free=self._arena.size // 2)
            except ConfigurationError:
                offset = None  # /dev/shm is full: a private output works as well
            if offset is not None:
                return self._array_at(offset, shape, dtype, nbytes), offset
        return np.empty(shape, dtype), -1

    # ---------------------------------------------------------------------------------------------- helpers

    def _problem(self, dtype: np.dtype, op: str | None = None) -> str:
        """Why this dtype/op cannot be reduced or moved ('' when fine), cached: it is on the latency path."""
        key = (dtype, op)
        if key not in self._problems:
            try:
                collectives.check(dtype, op)
                self._problems[key] = ""
            except ConfigurationError as error:
                self._problems[key] = str(error)
        return self._problems[key]

    def _half(self, parity: int, nbytes: int, member: int | None = None) -> np.ndarray:
        """The first nbytes of a member's (default: this rank's) group half for this parity, as bytes."""
        layout = self._engine.layout
        member = self.context.group_rank if member is None else member
        return self._engine.segment.array(layout.half(0, member, parity), nbytes, _BYTE)

    def _rows(self, parity: int, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        """size x count view: row m is member m's group half (this parity) from byte `offset` on."""
        layout = self._engine.layout
        start = layout.half(0, 0, parity) + offset
        return self._engine.segment.strided(start, self.size, count, dtype, 2 * layout.group_half)

    def _combine(self, rows: np.ndarray | list[np.ndarray], out: np.ndarray, op: str) -> None:
        """out = rows[0] op rows[1] op ... in group-rank order (the same order on every member)."""
        if len(rows) == 1:
            np.copyto(out, rows[0])
        elif isinstance(rows, np.ndarray) and len(rows) > 2:
            collectives.ufunc(out.dtype, op).reduce(rows, axis=0, out=out)
        else:
            ufunc = collectives.ufunc(out.dtype, op)
            ufunc(rows[0], rows[1], out=out)
            for row in rows[2:]:
                ufunc(out, row, out=out)

    def _raise_everywhere(self, described: Descriptor, channel: Channel | None = None) -> NoReturn:
        """Publish a local problem instead of data: the agreement then raises it on every member alike."""
        self._engine.run(channel or self._engine.group, described, 1)
        raise AssertionError("unreachable: the agreement raises a published problem")

    def _group_rounds(self, nbytes: int) -> int:
        return max(1, _ceil(nbytes, self._engine.layout.group_half))

    # ---------------------------------------------------------------------------------------------- all_reduce

    def _all_reduce(self, x: np.ndarray, op: str) -> np.ndarray:
        x = np.asarray(x)
        problem = self._problem(x.dtype, op)
        described = Descriptor(0, "all_reduce", x.dtype.str, x.shape, op, error=problem)
        if problem:
            self._raise_everywhere(described)
        if x.nbytes <= self.small_bytes:
            return self._all_reduce_small(x, op, described)
        return self._all_reduce_large(x, op, described)

    def _small_views(self, parity: int, dtype: np.dtype, count: int) -> tuple:
        key = (parity, dtype, count)
        views = self._views.get(key)
        if views is None:
            if len(self._views) > 256:
                self._views.clear()
            mine = self._half(parity, count * dtype.itemsize).view(dtype)
            views = self._views[key] = (mine, self._rows(parity, 0, count, dtype))
        return views

    def _all_reduce_small(self, x: np.ndarray, op: str, described: Descriptor) -> np.ndarray:
        out = np.empty(x.shape, x.dtype)

        def write(_: int, parity: int) -> None:
            np.copyto(self._small_views(parity, x.dtype, x.size)[0], x.reshape(x.size))

        def read(_: int, parity: int) -> None:
            flat = out.reshape(x.size)
            self._combine(self._small_views(parity, x.dtype, x.size)[1], flat, op)
            collectives.finish(flat, op, self.size)

        self._engine.run(self._engine.group, described, 1, write, read, reserve=x.nbytes)
        return out

    def _zero_copy_offset(self, x: np.ndarray) -> int:
        if not x.flags.c_contiguous:
            return -1
        offset = _address(x) - self._engine.segment.address
        return offset if self._arena.contains(offset, x.nbytes) else -1

    def _all_reduce_large(self, x: np.ndarray, op: str, described: Descriptor) -> np.ndarray:
        described.offset = self._zero_copy_offset(x)
        out, described.output = self._output((x.size,), x.dtype, shared=True)
        shm_pipelines.all_reduce(self._engine, x.reshape(x.size), out, op, described)
        return out.reshape(x.shape)

    # ---------------------------------------------------------------------------------------------- the others

    def output(self, shape: Sequence[int] | int, dtype: np.dtype | str = np.float32) -> np.ndarray:
        """An uninitialised array in this rank's arena where there is room (else from numpy): an output for
        all_gather_into, which the peers then fill in place."""
        shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        self._engine.usable()
        return self._output(shape, np.dtype(dtype), shared=True)[0]

    def all_gather_into(self, x: np.ndarray, out: np.ndarray) -> np.ndarray:
        """all_gather(x) written into `out` (this rank's output, C-contiguous, size x x's rows; best made by
        `output()`, so the peers push their blocks straight into it). Where `x` already is this rank's block of
        `out` (a view of it), it is not copied again; synchronous, the same collective as all_gather to the
        other members."""
        x = np.asarray(x)
        want = (self.size * x.shape[0], *x.shape[1:]) if x.ndim else None
        if want is None or out.shape != want or out.dtype != x.dtype or not out.flags.c_contiguous:
            raise ConfigurationError(
                f"all_gather_into on group {self.context.name!r}: the output must be C-contiguous of shape {want} "
                f"and dtype {x.dtype}, got {out.shape} {out.dtype}"
            )
        return self._dispatch(False, self._all_gather, x, out)

    def _all_gather(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x)
        problem = self._problem(x.dtype) or ("all_gather needs a tensor with at least one dim" if x.ndim == 0 else "")
        described = Descriptor(0, "all_gather", x.dtype.str, x.shape, error=problem)
        if problem:
            self._raise_everywhere(described)
        data, total, step = _bytes_of(x), x.nbytes, self._engine.layout.group_half
        large = self.size * total >= self.gather_bytes
        if out is None:
            out, described.output = self._output((self.size * x.shape[0], *x.shape[1:]), x.dtype, shared=large)
        else:
            described.output = self._zero_copy_offset(out) if large else -1
        gathered = out.reshape(out.size).view(_BYTE).reshape(self.size, total)
        if large:
            placed = total > 0 and _address(x) == _address(out) + self.group_rank * total
            shm_pipelines.all_gather(self._engine, data, gathered, described, own_placed=placed)
            return out

        def write(index: int, parity: int) -> None:
            lo, hi = index * step, min(total, (index + 1) * step)
            self._half(parity, hi - lo)[:] = data[lo:hi]

        def read(index: int, parity: int) -> None:
            lo, hi = index * step, min(total, (index + 1) * step)
            gathered[:, lo:hi] = self._rows(parity, 0, hi - lo, _BYTE)

        rounds = self._group_rounds(total)
        self._engine.run(self._engine.group, described, rounds, write, read, reserve=min(total, step))
        return out

    def _broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        x = np.asarray(x)
        problem = self._problem(x.dtype)
        if not problem and not 0 <= root < self.size:
            problem = f"broadcast root {root} is not a group rank (0..{self.size - 1}); roots are group ranks"
        described = Descriptor(0, "broadcast", x.dtype.str, x.shape, root=root, error=problem)
        if problem:
            self._raise_everywhere(described)
        data, total, step = _bytes_of(x), x.nbytes, self._engine.layout.group_half
        large = total >= self.broadcast_bytes
        out, described.output = self._output(x.shape, x.dtype, shared=large)
        received = out.reshape(out.size).view(_BYTE) if out.size else np.empty(0, _BYTE)
        if large:
            shm_pipelines.broadcast(self._engine, data, received, root, described)
            return out
        if root == self.group_rank:
            np.copyto(out, x)

        def write(index: int, parity: int) -> None:
            if root == self.group_rank:
                lo, hi = index * step, min(total, (index + 1) * step)
                self._half(parity, hi - lo)[:] = data[lo:hi]

        def read(index: int, parity: int) -> None:
            if root != self.group_rank:
                lo, hi = index * step, min(total, (index + 1) * step)
                received[lo:hi] = self._half(parity, hi - lo, member=root)

        reserve = min(total, step) if root == self.group_rank else 0
        self._engine.run(self._engine.group, described, self._group_rounds(total), write, read, reserve=reserve)
        return out

    def _reduce_scatter(self, x: np.ndarray, op: str) -> np.ndarray:
        x, size = np.asarray(x), self.size
        problem = self._problem(x.dtype, op)
        if not problem and (x.ndim == 0 or x.shape[0] % size):
            problem = (
                f"reduce_scatter needs dim 0 divisible by the group size {size}, got shape {x.shape}; "
                "pad dim 0 to a multiple of the group size"
            )
        described = Descriptor(0, "reduce_scatter", x.dtype.str, x.shape, op, error=problem)
        if problem:
            self._raise_everywhere(described)
        block = x.size // size
        blocks = np.ascontiguousarray(x).reshape(size, block)
        out = self._output((x.shape[0] // size, *x.shape[1:]), x.dtype)[0]
        flat = out.reshape(block)
        step, me = max(1, self._engine.layout.group_half // x.dtype.itemsize // size), self.group_rank

        def write(index: int, parity: int) -> None:
            # Every block but this rank's own, which it reads straight from x.
            lo, hi = index * step, min(block, (index + 1) * step)
            mine = self._half(parity, size * (hi - lo) * x.dtype.itemsize).view(x.dtype).reshape(size, hi - lo)
            mine[:me] = blocks[:me, lo:hi]
            mine[me + 1 :] = blocks[me + 1 :, lo:hi]

        def read(index: int, parity: int) -> None:
            lo, hi = index * step, min(block, (index + 1) * step)
            rows = list(self._rows(parity, me * (hi - lo) * x.dtype.itemsize, hi - lo, x.dtype))
            rows[me] = blocks[me, lo:hi]
            self._combine(rows, flat[lo:hi], op)

        reserve = size * min(block, step) * x.dtype.itemsize
        self._engine.run(self._engine.group, described, max(1, _ceil(block, step)), write, read, reserve=reserve)
        collectives.finish(flat, op, size)
        return out

    def _all_to_all(self, x: np.ndarray, split_dim: int, concat_dim: int) -> np.ndarray:
        x, size = np.asarray(x), self.size
        problem, split_dim, concat_dim = self._all_to_all_problem(x, split_dim, concat_dim)
        described = Descriptor(0, "all_to_all", x.dtype.str, x.shape, split_dim=split_dim, concat_dim=concat_dim)
        described.error = problem
        if problem:
            self._raise_everywhere(described)
        block_shape = (*x.shape[:split_dim], x.shape[split_dim] // size, *x.shape[split_dim + 1 :])
        block_bytes = int(np.prod(block_shape, dtype=np.int64)) * x.dtype.itemsize
        split = x.reshape(*x.shape[:split_dim], size, x.shape[split_dim] // size, *x.shape[split_dim + 1 :])
        blocks = np.ascontiguousarray(np.moveaxis(split, split_dim, 0)).view(_BYTE).reshape(size, block_bytes)
        received = np.empty((size, block_bytes), _BYTE)
        step = max(1, self._engine.layout.group_half // size)

        def write(index: int, parity: int) -> None:
            lo, hi = index * step, min(block_bytes, (index + 1) * step)
            self._half(parity, size * (hi - lo)).reshape(size, hi - lo)[:] = blocks[:, lo:hi]

        def read(index: int, parity: int) -> None:
            lo, hi = index * step, min(block_bytes, (index + 1) * step)
            received[:, lo:hi] = self._rows(parity, self.group_rank * (hi - lo), hi - lo, _BYTE)

        rounds, reserve = max(1, _ceil(block_bytes, step)), size * min(block_bytes, step)
        self._engine.run(self._engine.group, described, rounds, write, read, reserve=reserve)
        return np.concatenate(received.view(x.dtype).reshape(size, *block_shape), axis=concat_dim)

    def _all_to_all_problem(self, x: np.ndarray, split_dim: int, concat_dim: int) -> tuple[str, int, int]:
        """(why not, or ''; the dims made non-negative so that -1 and ndim-1 agree across ranks)."""
        problem = self._problem(x.dtype)
        if problem:
            return problem, split_dim, concat_dim
        if not (-x.ndim <= split_dim < x.ndim and -x.ndim <= concat_dim < x.ndim):
            return f"all_to_all split_dim {split_dim} / concat_dim {concat_dim} out of range for shape {x.shape}", 0, 0
        split_dim, concat_dim = split_dim % x.ndim, concat_dim % x.ndim
        if x.shape[split_dim] % self.size:
            return (
                f"all_to_all needs dim {split_dim} (size {x.shape[split_dim]}) divisible by the group size "
                f"{self.size}, got shape {x.shape}; pad that dim or split another one",
                split_dim,
                concat_dim,
            )
        return "", split_dim, concat_dim

    def _neighbor_exchange(
        self,
        sends: list[np.ndarray],
        send_ranks: list[int],
        recv_ranks: list[int],
        recv_shapes: list[tuple[int, ...]],
        recv_dtype: np.dtype,
    ) -> list[np.ndarray]:
        sends = [np.asarray(s) for s in sends]
        problems = [self._problem(dtype) for dtype in (*(s.dtype for s in sends), recv_dtype)]
        problem = next((p for p in problems if p), "")
        if len(sends) != len(send_ranks) or len(recv_ranks) != len(recv_shapes):
            problem = (
                f"neighbor_exchange got {len(sends)} tensors for {len(send_ranks)} send ranks and "
                f"{len(recv_shapes)} shapes for {len(recv_ranks)} recv ranks; each list needs one entry per peer"
            )
        extra = {
            "send_ranks": [int(r) for r in send_ranks],
            "sends": [[list(s.shape), s.dtype.str] for s in sends],
            "recv_ranks": [int(r) for r in recv_ranks],
            "recv_shapes": [[int(d) for d in shape] for shape in recv_shapes],
            "recv_dtype": recv_dtype.str,
        }
        described = Descriptor(0, "neighbor_exchange", extra=extra, error=problem)
        if problem:
            self._raise_everywhere(described)
        stream = np.concatenate([_bytes_of(s) for s in sends]) if sends else np.empty(0, _BYTE)
        outs: list[np.ndarray] = []
        pieces: list[tuple[int, int, np.ndarray]] = []  # (source, start in its stream, destination bytes)
        step = self._engine.layout.group_half

        def plan(descriptors: list[Descriptor] | None) -> int:
            assert descriptors is not None  # decode=True
            # Allocated only now: the shapes were checked against what the sources send.
            outs.extend(np.empty(shape, recv_dtype) for shape in recv_shapes)
            for out, source, start in zip(outs, recv_ranks, self._exchange_starts(descriptors, recv_ranks)):
                pieces.append((source, start, _bytes_of(out)))
            lengths = [sum(_nbytes(shape, dtype) for shape, dtype in d.extra["sends"]) for d in descriptors]
            return max(1, *(_ceil(n, step) for n in lengths))

        def write(index: int, parity: int) -> None:
            lo, hi = index * step, min(stream.size, (index + 1) * step)
            if hi > lo:
                self._half(parity, hi - lo)[:] = stream[lo:hi]

        def read(index: int, parity: int) -> None:
            window_lo, window_hi = index * step, (index + 1) * step
            for source, start, target in pieces:
                lo, hi = max(start, window_lo), min(start + target.size, window_hi)
                if hi > lo:
                    half = self._half(parity, hi - window_lo, member=source)
                    target[lo - start : hi - start] = half[lo - window_lo :]

        reserve = min(stream.size, step)
        self._engine.run(self._engine.group, described, plan, write, read, decode=True, reserve=reserve)
        return outs

    def _exchange_starts(self, descriptors: list[Descriptor], recv_ranks: list[int]) -> list[int]:
        """Where each received tensor starts in its source's stream (the k-th from a source is its k-th to us)."""
        me, seen, starts = self.group_rank, {}, []
        for source in recv_ranks:
            k = seen[source] = seen.get(source, -1) + 1
            extra = descriptors[source].extra
            sizes = [_nbytes(shape, dtype) for shape, dtype in extra["sends"]]
            to_me = [i for i, rank in enumerate(extra["send_ranks"]) if rank == me]
            starts.append(sum(sizes[: to_me[k]]))
        return starts

    def send(self, x: np.ndarray, peer: int, async_op: bool = False) -> Handle | None:
        """As Communicator.send; an asynchronous send whose receiver already waits for it, with nothing of this
        communicator's in flight, runs here and now: it costs its copy and no wait. On the communicator's thread it
        would first have to be woken and get a core, and where the program computes on every core that took up to
        milliseconds, each a pipeline stage's idle time (the receiver waits for exactly this send)."""
        if async_op and self._receiver_waits(peer):
            return _ran_here(self._send, x, peer)
        return super().send(x, peer, async_op)

    def _receiver_waits(self, peer: int) -> bool:
        if not 0 <= peer < self.size or peer == self.group_rank or not self.idle():
            return False
        engine = self._engine
        return not (engine.closed or engine.failure) and engine.waiting(engine.pair(self.group_rank, peer), peer)

    def _send(self, x: np.ndarray, peer: int) -> None:
        x = np.asarray(x)
        channel = self._engine.pair(self.group_rank, self._peer(peer, "send"))
        described = Descriptor(0, "send", x.dtype.str, x.shape, error=self._problem(x.dtype))
        if described.error:
            self._raise_everywhere(described, channel)
        data, step = _bytes_of(x), self._engine.layout.pair_half
        half = self._engine.layout.half

        def write(index: int, parity: int) -> None:
            lo, hi = index * step, min(data.size, (index + 1) * step)
            self._engine.segment.array(half(channel.index, 0, parity), hi - lo, _BYTE)[:] = data[lo:hi]

        rounds = max(1, _ceil(x.nbytes, step))
        self._engine.run(channel, described, rounds, write=write, reserve=min(x.nbytes, step))

    def _recv(self, shape: tuple[int, ...], dtype: np.dtype, peer: int) -> np.ndarray:
        shape = tuple(int(d) for d in shape)
        channel = self._engine.pair(self._peer(peer, "recv"), self.group_rank)
        described = Descriptor(0, "send", dtype.str, shape, error=self._problem(dtype))
        if not described.error and min(shape, default=0) < 0:
            described.error = f"recv shape {shape} has a negative dim"
        if described.error:
            self._raise_everywhere(described, channel)
        out = np.empty(shape, dtype)
        received, step = _bytes_of(out), self._engine.layout.pair_half
        half = self._engine.layout.half

        def read(index: int, parity: int) -> None:
            lo, hi = index * step, min(received.size, (index + 1) * step)
            received[lo:hi] = self._engine.segment.array(half(channel.index, 0, parity), hi - lo, _BYTE)

        self._engine.run(channel, described, max(1, _ceil(out.nbytes, step)), read=read)
        return out

    def _peer(self, peer: int, what: str) -> int:
        if not 0 <= peer < self.size or peer == self.group_rank:
            raise ConfigurationError(
                f"{what} on group '{self.context.name}' (rank {self.context.rank}): peer {peer} must be another "
                f"group rank in 0..{self.size - 1}; peers are group ranks, not global ranks"
            )
        return peer

    def _barrier(self) -> None:
        self._engine.run(self._engine.group, Descriptor(0, "barrier"), 1)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _ran_here(fn, *args) -> Handle:
    """Run fn(*args) on this thread; its result, or its error, comes from the handle's wait() as an asynchronous
    call's would."""
    future: Future = Future()
    started = time.time_ns()
    try:
        future.set_result(fn(*args))
    except Exception as error:
        future.set_exception(error)
    return Handle(future, [started, time.time_ns()])


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize

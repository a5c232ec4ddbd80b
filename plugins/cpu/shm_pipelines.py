"""The bandwidth-bound collectives of the shared-memory transport: large all_reduce, all_gather and broadcast.

They are written for a host whose ranks share one memory bus and may outnumber its cores, where the cost of a
collective is the bytes every rank copies, so each algorithm copies each byte as few times as it can. Large
outputs live in each rank's arena (`ShmCommunicator._output`), so a rank can write straight into a peer's result;
when some member's output is private (its arena was full) every member takes the fallback through the halves
(the members agree on the offsets in round 0, so they all choose alike).

- all_reduce: pipelined reduce-scatter + all-gather in segments of size * chunk elements. In round s every member
  copies its contribution to segment s into its half (nothing for a zero-copy input), meets the others, then
  reduces its own chunk of segment s from every member straight into its output and pushes that chunk, still in
  its cache, into every peer's output. Fallback: the chunk goes into its next half and everyone copies it out a
  round later. segments + 1 rounds either way; each element is reduced once, in group-rank order, so every
  member gets bitwise the same result.
- all_gather: after the descriptors agree, every member pushes its input into its block of every member's output
  in cache-sized pieces: two rounds whatever the size. Fallback: half-sized rounds through the members' halves.
- broadcast: the root copies its input into its own output a piece per round; the others copy each piece from
  there in the same round. Fallback: through the root's half.

A member never returns while a peer may still read or write its output: the last round is a barrier.

Measured on 2 shared cores (CPU seconds summed over the ranks, the figure least disturbed by other load): a
64 MiB all_reduce of numpy inputs took 112 ms at 4 ranks and 50 ms at 2 before outputs lived in the arena, 70 and
32 ms with pushes into them (a private output cache alone gave 77 and 35; glibc's M_MMAP_MAX=0 gave 82 and 37).
Fewer, larger rounds did not pay even with 4 ranks on 2 cores (1-2 MiB chunks cost as much CPU as 512 KiB ones or
more: a chunk then no longer stays in the cache between its reduction and its pushes), so the chunk stays 512 KiB.
"""

from __future__ import annotations

import numpy as np

from tessel.core import collectives
from tessel.plugins.cpu.shm_agree import Descriptor
from tessel.plugins.cpu.shm_channel import Engine

BYTE = np.dtype(np.uint8)
PUSH_PIECE = 256 << 10  # all_gather copies its input in pieces this size, so that they stay in the cache
BROADCAST_PIECES = 8  # a broadcast moves in this many rounds (the root copies the next while the others copy one)
BROADCAST_PIECE_MIN = 512 << 10


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def all_reduce(engine: Engine, flat: np.ndarray, out: np.ndarray, op: str, described: Descriptor) -> None:
    """out = flat reduced over the group (1-D arrays); described.offset / .output say where they are shared."""
    pipeline = _AllReduce(engine, flat, out, op, described)
    engine.run(engine.group, described, pipeline.segments + 1, pipeline.write, pipeline.read, reserve=pipeline.reserve)


class _AllReduce:
    """The rounds of one large all_reduce (see the module docstring); `write` and `read` are the engine's."""

    def __init__(self, engine: Engine, flat: np.ndarray, out: np.ndarray, op: str, described: Descriptor):
        self.engine, self.flat, self.out, self.op, self.described = engine, flat, out, op, described
        self.layout, self.segment = engine.layout, engine.segment
        self.size, self.me = engine.context.size, engine.me
        self.per_segment = self.size * (self.layout.chunk // flat.dtype.itemsize)
        self.segments = ceil_div(flat.size, self.per_segment)
        self.reserve = self.layout.group_half
        self.reduced_at = self.size * self.layout.chunk  # fallback: a reduced chunk follows the input slice
        self.ufunc = collectives.ufunc(flat.dtype, op)
        self.members: list[tuple[int, int]] = []  # each member's (input, output) offsets, agreed in round 0
        self.push = False

    def bounds(self, index: int, member: int) -> tuple[int, int]:
        """Element range of `member`'s chunk of segment `index`."""
        start = index * self.per_segment
        length = min(self.per_segment, self.flat.size - start)
        return start + member * length // self.size, start + (member + 1) * length // self.size

    def write(self, index: int, parity: int) -> None:
        # Only the chunks the others reduce: this rank reads its own chunk straight from its input.
        if index < self.segments and self.described.offset < 0:
            flat, start = self.flat, index * self.per_segment
            stop = min(flat.size, start + self.per_segment)
            lo, hi = self.bounds(index, self.me)
            mine = self.segment.array(self.layout.half(0, self.me, parity), stop - start, flat.dtype)
            mine[: lo - start] = flat[start:lo]
            mine[hi - start :] = flat[hi:stop]

    def read(self, index: int, parity: int) -> None:
        if index == 0:
            self.members = self.engine.member_offsets(self.engine.group)
            self.push = all(output >= 0 for _, output in self.members)
        if index > 0 and not self.push:  # fallback: copy out the chunks reduced in the previous round
            for member in range(self.size):
                lo, hi = self.bounds(index - 1, member)
                reduced = self.layout.half(0, member, parity) + self.reduced_at
                self.out[lo:hi] = self.segment.array(reduced, hi - lo, self.flat.dtype)
        if index == self.segments:
            return
        lo, hi = self.bounds(index, self.me)
        if not self.push:
            target = self.layout.half(0, self.me, 1 - parity) + self.reduced_at
            self.reduce_chunk(index, parity, self.segment.array(target, hi - lo, self.flat.dtype), lo, hi)
            return
        target = self.out[lo:hi]
        self.reduce_chunk(index, parity, target, lo, hi)
        for step in range(1, self.size):  # peers in rotated order, so that the pushes spread over the outputs
            peer_output = self.members[(self.me + step) % self.size][1]
            self.segment.array(peer_output + lo * target.itemsize, hi - lo, target.dtype)[:] = target

    def reduce_chunk(self, index: int, parity: int, target: np.ndarray, lo: int, hi: int) -> None:
        """target = every member's elements lo:hi combined in group-rank order."""
        operands = [self.operand(member, index, parity, lo, hi) for member in range(self.size)]
        if self.size == 1:
            np.copyto(target, operands[0])
        else:
            self.ufunc(operands[0], operands[1], out=target)
        for more in operands[2:]:
            self.ufunc(target, more, out=target)
        collectives.finish(target, self.op, self.size)

    def operand(self, member: int, index: int, parity: int, lo: int, hi: int) -> np.ndarray:
        """Member's elements lo:hi: from its zero-copy input, this rank's own input, or the member's half."""
        dtype, shared_input = self.flat.dtype, self.members[member][0]
        if shared_input >= 0:
            return self.segment.array(shared_input + lo * dtype.itemsize, hi - lo, dtype)
        if member == self.me:
            return self.flat[lo:hi]
        relative = lo - index * self.per_segment
        return self.segment.array(self.layout.half(0, member, parity) + relative * dtype.itemsize, hi - lo, dtype)


def all_gather(
    engine: Engine, data: np.ndarray, gathered: np.ndarray, described: Descriptor, own_placed: bool = False
) -> None:
    """gathered[m] = member m's data (bytes; gathered is size x data.size, this rank's output); `own_placed`: data
    already is gathered[me] (it is then pushed only to the peers)."""
    pipeline = _AllGather(engine, data, gathered, own_placed)
    reserve = min(data.size, engine.layout.group_half)
    engine.run(engine.group, described, pipeline.rounds, pipeline.write, pipeline.read, reserve=reserve)


class _AllGather:
    """Push: one round after the agreement, then the final barrier. Fallback: round i + 1 moves piece i."""

    def __init__(self, engine: Engine, data: np.ndarray, gathered: np.ndarray, own_placed: bool = False):
        self.engine, self.data, self.gathered, self.own_placed = engine, data, gathered, own_placed
        self.segment, self.layout, self.me = engine.segment, engine.layout, engine.me
        self.step = self.layout.group_half
        self.outputs: list[int] = []  # each member's output offset, agreed in round 0
        self.push = False

    def rounds(self, _: object) -> int:
        self.outputs = [output for _, output in self.engine.member_offsets(self.engine.group)]
        self.push = all(output >= 0 for output in self.outputs)
        return 2 if self.push else 1 + max(1, ceil_div(self.data.size, self.step))

    def window(self, index: int) -> tuple[int, int]:
        return (index - 1) * self.step, min(self.data.size, index * self.step)

    def write(self, index: int, parity: int) -> None:
        if index > 0 and not self.push:
            lo, hi = self.window(index)
            self.segment.array(self.layout.half(0, self.me, parity), hi - lo, BYTE)[:] = self.data[lo:hi]

    def read(self, index: int, parity: int) -> None:
        if self.push and index == 0:
            self.push_everywhere()
        elif not self.push and index > 0:
            lo, hi = self.window(index)
            rows = self.segment.strided(self.layout.half(0, 0, parity), len(self.outputs), hi - lo, BYTE, 2 * self.step)
            self.gathered[:, lo:hi] = rows

    def push_everywhere(self) -> None:
        """Copy this rank's data into its block of every output, a cache-sized piece at a time."""
        size, total, data, raw = len(self.outputs), self.data.size, self.data, self.segment.bytes
        first = 1 if self.own_placed else 0  # this rank's own block of its output already holds its data
        blocks = [self.outputs[(self.me + step) % size] + self.me * total for step in range(first, size)]
        for lo in range(0, total, PUSH_PIECE):
            piece = data[lo : lo + PUSH_PIECE]
            for block in blocks:
                raw[block + lo : block + lo + piece.size] = piece


def broadcast(engine: Engine, data: np.ndarray, received: np.ndarray, root: int, described: Descriptor) -> None:
    """received = the root's data (bytes); on the root, data is its input and received its output."""
    pipeline = _Broadcast(engine, data, received, root, described.output)
    reserve = min(data.size, engine.layout.group_half) if pipeline.through_half else 0
    engine.run(engine.group, described, pipeline.rounds, pipeline.write, pipeline.read, reserve=reserve)


class _Broadcast:
    """Round i: the root copies piece i into its output (fallback: its half), the others copy it from there."""

    def __init__(self, engine: Engine, data: np.ndarray, received: np.ndarray, root: int, output: int):
        self.engine, self.data, self.received, self.root = engine, data, received, root
        self.segment, self.layout, self.is_root = engine.segment, engine.layout, engine.me == root
        self.through_half = False
        if self.is_root:  # the root knows its own output now; the others learn it in round 0
            self.plan(output)
            if self.through_half:
                received[:] = data

    def plan(self, root_output: int) -> None:
        self.root_output = root_output
        self.through_half = root_output < 0
        if self.through_half:
            self.step = self.layout.group_half
        else:
            self.step = max(BROADCAST_PIECE_MIN, ceil_div(self.data.size, BROADCAST_PIECES))

    def rounds(self, _: object) -> int:
        if not self.is_root:
            self.plan(self.engine.member_offsets(self.engine.group)[self.root][1])
        count = max(1, ceil_div(self.data.size, self.step))
        return count if self.through_half else count + 1  # + 1: the root's output is read until the end

    def window(self, index: int) -> tuple[int, int]:
        return index * self.step, min(self.data.size, (index + 1) * self.step)

    def write(self, index: int, parity: int) -> None:
        if self.is_root:
            lo, hi = self.window(index)
            if self.through_half:
                self.segment.array(self.layout.half(0, self.root, parity), hi - lo, BYTE)[:] = self.data[lo:hi]
            else:
                self.received[lo:hi] = self.data[lo:hi]

    def read(self, index: int, parity: int) -> None:
        if not self.is_root:
            lo, hi = self.window(index)
            start = self.layout.half(0, self.root, parity) if self.through_half else self.root_output + lo
            self.received[lo:hi] = self.segment.array(start, hi - lo, BYTE)

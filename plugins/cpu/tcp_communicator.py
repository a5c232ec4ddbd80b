"""Collectives over TCP for one group: agreement first, then the data (MindSpore's semantics, as over shm).

Every call first all-gathers a descriptor of what each member is about to do (tcp_agree); a disagreement raises
CollectiveMismatchError on every member and leaves the group usable. Data up to SMALL_BYTES per member travels
with the descriptors (Bruck's all-gather: ceil(log2 n) rounds, the latency-optimal choice); larger data uses
the ring and chain algorithms of tcp_algorithms. A broken link, an aborted job or the deadline ends any wait
(PeerFailedError / CollectiveTimeoutError) and closes the group's links, so the members still waiting on this
one fail at once instead of at their own deadline.

    comm = TcpTransport("127.0.0.1").communicator(context)
    total = comm.all_reduce(np.ones(4, np.float32))           # [n, n, n, n] on every member
    handle = comm.all_gather(np.arange(2), async_op=True)     # handle.wait() -> [0, 1, 0, 1, ...]
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import EllipsisType

import numpy as np

from tessel.core import collectives
from tessel.core.errors import CollectiveMismatchError, ConfigurationError, PeerFailedError
from tessel.core.plugin import COLLECTIVE_DTYPES, REDUCE_OPS, Communicator, GroupContext
from tessel.plugins.cpu import tcp_algorithms as algorithms
from tessel.plugins.cpu.tcp_agree import (
    Block,
    Descriptor,
    check_agreement,
    check_pair,
    dtype_code,
    gather_blocks,
    neighbor_plan,
    swap_blocks,
)
from tessel.plugins.cpu.tcp_algorithms import LinkTo
from tessel.plugins.cpu.tcp_wire import Clock, Link, as_bytes, exchange, reading

# Per-member payload up to which data rides with the agreement step instead of a ring.
SMALL_BYTES = 64 * 1024


def _from_block(block: Block, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(block.data, dtype=dtype).reshape(shape)


class TcpCommunicator(Communicator):
    """Collectives over one group's TCP links. Collectives run one at a time, in issue order (synchronous calls
    wait for the asynchronous ones issued before them); a send and a recv in opposite directions may overlap."""

    transport = "tcp"

    def __init__(self, context: GroupContext, transport):
        super().__init__(context)
        self._transport = transport
        self._links: dict[tuple[int, str], Link] = {}
        # One lock per channel: collectives share "group"; each direction of a send/recv pair has its own
        # channel (and connection), so a send and a recv between the same two ranks may run at the same time.
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()
        self._seq = 0
        self._pair_seq: dict[str, int] = {}
        self._failure: str | None = None

    # -- plumbing ---------------------------------------------------------------------------------------------

    def _link(self, clock: Clock, peer: int, channel: str) -> Link:
        link = self._links.get((peer, channel))
        if link is None:
            try:
                link = self._transport.connect(self.context, peer, clock, channel)
            except ConfigurationError as exc:  # e.g. a wrong token: other links may hold half a message
                self._failure = f"{type(exc).__name__}: {exc}"
                raise
            self._links[(peer, channel)] = link
        return link

    @contextmanager
    def _call(self, what: str, channel: str = "group") -> Iterator[tuple[Clock, LinkTo]]:
        """Run one call on `channel` (one at a time per channel); yields its clock and its `link_to(peer)`.

        A failure that may leave bytes in flight retires the whole group and closes its links, so the members
        waiting on this one fail at once.
        """
        with self._locks_lock:
            lock = self._locks.setdefault(channel, threading.Lock())
        with lock:
            where = f"{what} on group {self.context.name!r}"
            if self._closed:
                raise ConfigurationError(f"{where}: the communicator is closed; create the group again")
            if self._failure is not None:
                raise PeerFailedError(f"{where}: the group is unusable after an earlier failure ({self._failure})")
            clock = Clock(what, self.context.name, self.context.timeout_s, self.context.abort)
            try:
                yield clock, lambda peer: self._link(clock, peer, channel)
            except (CollectiveMismatchError, ConfigurationError):
                raise  # raised between whole messages: every stream is still in step
            except BaseException as exc:
                self._failure = f"{type(exc).__name__}: {exc}"
                self._close_links()
                raise

    def _agree(self, clock: Clock, link: LinkTo, descriptor: Descriptor, data: memoryview | None = None) -> list[Block]:
        """All-gather descriptors (and small data) and raise CollectiveMismatchError on any disagreement."""
        self._seq += 1
        blocks = gather_blocks(clock, self.context, link, descriptor, data)
        check_agreement(blocks, self.context, clock.what)
        return blocks

    def _describe(self, kind: str, x: np.ndarray | None = None, **fields) -> Descriptor:
        shape = {} if x is None else {"dtype": dtype_code(x.dtype), "meta": tuple(x.shape)}
        return Descriptor(seq=self._seq, kind=kind, **shape, **fields)

    @staticmethod
    def _small(x: np.ndarray) -> bool:
        return x.nbytes <= SMALL_BYTES and x.dtype in COLLECTIVE_DTYPES

    def _check_rank(self, what: str, name: str, rank: int, allow_self: bool = False) -> None:
        if not 0 <= rank < self.size or (rank == self.group_rank and not allow_self):
            mine = "" if allow_self else f", not this rank's own {self.group_rank}"
            raise ConfigurationError(
                f"{what} on group {self.context.name!r}: {name}={rank} must be a group rank in [0, {self.size})"
                f"{mine}; pass group ranks, not global ranks"
            )

    def _needs_dim0(self, what: str, x: np.ndarray, divisible: bool) -> None:
        if x.ndim == 0 or (divisible and x.shape[0] % self.size):
            rule = f"dim 0 divisible by the group size {self.size}" if divisible else "at least one dimension"
            raise ConfigurationError(
                f"{what} on group {self.context.name!r}: the input of shape {x.shape} needs {rule}; reshape or "
                "pad it first"
            )

    @staticmethod
    def _check_op(what: str, op: str) -> None:
        if op not in REDUCE_OPS:
            raise ConfigurationError(f"{what}: unknown reduce op {op!r}; use one of {list(REDUCE_OPS)}")

    # -- collectives ------------------------------------------------------------------------------------------

    def _reduce_blocks(self, blocks: list[Block], x: np.ndarray, op: str, rows: slice | EllipsisType) -> np.ndarray:
        """Reduce rows `rows` of every member's small input, in group-rank order (the same bits everywhere)."""
        out = _from_block(blocks[0], x.dtype, x.shape)[rows].copy()
        for block in blocks[1:]:
            collectives.reduce_into(out, _from_block(block, x.dtype, x.shape)[rows], op)
        collectives.finish(out, op, self.size)
        return out

    def _all_reduce(self, x: np.ndarray, op: str, out: np.ndarray | None = None) -> np.ndarray:
        x = np.asarray(x, order="C")
        self._check_op("all_reduce", op)
        with self._call("all_reduce") as (clock, link):
            small = self._small(x)
            blocks = self._agree(clock, link, self._describe("all_reduce", x, op=op), as_bytes(x) if small else None)
            collectives.check(x.dtype, op)
            if small:
                reduced = self._reduce_blocks(blocks, x, op, ...)
                if out is None:
                    return reduced
                out[...] = reduced
                return out
            reduced = algorithms.ring_all_reduce(clock, self.group_rank, self.size, link, x, op, out)
            out = reduced if out is None else out  # the ring's result is a view of a given output
            collectives.finish(out, op, self.size)
            return out

    def all_reduce_into(self, x: np.ndarray, out: np.ndarray, op: str = "sum") -> np.ndarray:
        """all_reduce(x, op) written into `out` (C-contiguous, x's shape and dtype, not overlapping x), e.g. where
        a later collective reads it in place (daemon/hierarchy.py: the part's all-gather output); synchronous, and
        the same collective as all_reduce to the other members."""
        if out.shape != np.shape(x) or out.dtype != np.asarray(x).dtype or not out.flags.c_contiguous:
            raise ConfigurationError(
                f"all_reduce_into on group {self.context.name!r}: the output must be C-contiguous with the input's "
                f"shape and dtype {np.shape(x)} {np.asarray(x).dtype}, got {out.shape} {out.dtype}"
            )
        return self._dispatch(False, self._all_reduce, x, op, out)

    def _reduce_scatter(self, x: np.ndarray, op: str) -> np.ndarray:
        x = np.asarray(x, order="C")
        self._check_op("reduce_scatter", op)
        with self._call("reduce_scatter") as (clock, link):
            small = self._small(x)
            blocks = self._agree(
                clock, link, self._describe("reduce_scatter", x, op=op), as_bytes(x) if small else None
            )
            collectives.check(x.dtype, op)
            self._needs_dim0("reduce_scatter", x, divisible=True)
            rows = x.shape[0] // self.size
            mine = slice(self.group_rank * rows, (self.group_rank + 1) * rows)
            if small:
                return self._reduce_blocks(blocks, x, op, mine)
            row_elements = x.size // x.shape[0] if x.shape[0] else 0
            bounds = [i * rows * row_elements for i in range(self.size + 1)]
            work = algorithms.ring_reduce_scatter(clock, self.group_rank, self.size, link, x.reshape(-1), bounds, op)
            out = work[bounds[self.group_rank] : bounds[self.group_rank + 1]].reshape((rows, *x.shape[1:])).copy()
            collectives.finish(out, op, self.size)
            return out

    def _all_gather(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, order="C")
        with self._call("all_gather") as (clock, link):
            small = self._small(x)
            blocks = self._agree(clock, link, self._describe("all_gather", x), as_bytes(x) if small else None)
            collectives.check(x.dtype)
            self._needs_dim0("all_gather", x, divisible=False)
            if small:
                return np.concatenate([_from_block(block, x.dtype, x.shape) for block in blocks])
            out = np.empty((self.size * x.shape[0], *x.shape[1:]), x.dtype)
            parts = np.split(out, self.size)
            parts[self.group_rank][...] = x
            algorithms.ring_all_gather(clock, self.group_rank, self.size, link, [as_bytes(p) for p in parts])
            return out

    def _broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        x = np.asarray(x, order="C")
        with self._call("broadcast") as (clock, link):
            small = self._small(x)
            data = as_bytes(x) if small and root == self.group_rank else None
            blocks = self._agree(clock, link, self._describe("broadcast", x, root=root), data)
            collectives.check(x.dtype)
            self._check_rank("broadcast", "root", root, allow_self=True)
            if small:
                return _from_block(blocks[root], x.dtype, x.shape).copy()
            out = x.copy() if root == self.group_rank else np.empty_like(x)
            algorithms.chain_broadcast(clock, self.group_rank, self.size, root, link, as_bytes(out))
            return out

    def _all_to_all(self, x: np.ndarray, split_dim: int, concat_dim: int) -> np.ndarray:
        x = np.asarray(x)
        # Negative dims count from the end, as in MindSpore; out-of-range ones are reported after agreement.
        split, concat = (d + x.ndim if -x.ndim <= d < 0 else d for d in (split_dim, concat_dim))
        with self._call("all_to_all") as (clock, link):
            self._agree(clock, link, self._describe("all_to_all", x, split_dim=split, concat_dim=concat))
            collectives.check(x.dtype)
            if not (0 <= split < x.ndim and 0 <= concat < x.ndim and x.shape[split] % self.size == 0):
                raise ConfigurationError(
                    f"all_to_all on group {self.context.name!r}: input of shape {x.shape} with split_dim={split_dim}"
                    f", concat_dim={concat_dim}: both dims must exist and dim {split_dim} must divide by the group "
                    f"size {self.size}"
                )
            pieces = np.split(x, self.size, axis=split)
            me, others = self.group_rank, [r for r in range(self.size) if r != self.group_rank]
            outgoing = {r: as_bytes(np.asarray(pieces[r], order="C")) for r in others}
            received = {r: np.empty(pieces[r].shape, x.dtype) for r in others}
            at_once = pieces[me].nbytes <= SMALL_BYTES
            incoming = {r: as_bytes(a) for r, a in received.items()}
            algorithms.pairwise_exchange(clock, me, self.size, link, outgoing, incoming, at_once)
            received[me] = pieces[me]
            return np.concatenate([received[r] for r in range(self.size)], axis=concat)

    def _neighbor_exchange(self, sends, send_ranks, recv_ranks, recv_shapes, recv_dtype) -> list[np.ndarray]:
        what = "neighbor_exchange"
        if len(sends) != len(send_ranks) or len(recv_ranks) != len(recv_shapes):
            raise ConfigurationError(
                f"{what}: {len(sends)} tensors for {len(send_ranks)} send_ranks, {len(recv_shapes)} recv_shapes for "
                f"{len(recv_ranks)} recv_ranks; pass one per rank"
            )
        sends = [np.asarray(s, order="C") for s in sends]
        plan = neighbor_plan(
            [(r, dtype_code(s.dtype), s.shape) for r, s in zip(send_ranks, sends)], list(zip(recv_ranks, recv_shapes))
        )
        with self._call(what) as (clock, link):
            self._agree(clock, link, self._describe(what, dtype=dtype_code(recv_dtype), meta=plan))
            collectives.check(recv_dtype)
            me, outputs = self.group_rank, [np.empty(shape, recv_dtype) for shape in recv_shapes]
            to_self = iter(s for r, s in zip(send_ranks, sends) if r == me)
            for rank, out in zip(recv_ranks, outputs):
                if rank == me:
                    out[...] = next(to_self)
            outgoing = [(link(r), [as_bytes(s)]) for r, s in zip(send_ranks, sends) if r != me]
            incoming = [(link(r), reading(as_bytes(o))) for r, o in zip(recv_ranks, outputs) if r != me]
            exchange(clock, outgoing, incoming)
            return outputs

    def _pair_agree(self, clock: Clock, link: Link, kind: str, peer: int, dtype: np.dtype, shape, data=None) -> Block:
        channel = self._channel(kind, peer)
        seq = self._pair_seq.get(channel, 0)
        self._pair_seq[channel] = seq + 1
        mine = Descriptor(seq=seq, kind=kind, dtype=dtype_code(dtype), peer=peer, meta=tuple(shape))
        theirs = swap_blocks(clock, link, mine, data)
        check_pair(mine, theirs.descriptor, peer, self.context, clock.what)
        collectives.check(dtype)
        return theirs

    def _channel(self, kind: str, peer: int) -> str:
        sender, receiver = (self.group_rank, peer) if kind == "send" else (peer, self.group_rank)
        return f"p2p:{sender}->{receiver}"

    def _send(self, x: np.ndarray, peer: int) -> None:
        x = np.asarray(x, order="C")
        self._check_rank("send", "peer", peer)
        with self._call("send", self._channel("send", peer)) as (clock, link_to):
            small, link = self._small(x), link_to(peer)
            self._pair_agree(clock, link, "send", peer, x.dtype, x.shape, as_bytes(x) if small else None)
            if not small:
                exchange(clock, sends=[(link, [as_bytes(x)])])

    def _recv(self, shape: tuple[int, ...], dtype: np.dtype, peer: int) -> np.ndarray:
        self._check_rank("recv", "peer", peer)
        out = np.empty(shape, dtype)
        with self._call("recv", self._channel("recv", peer)) as (clock, link_to):
            link = link_to(peer)
            theirs = self._pair_agree(clock, link, "recv", peer, out.dtype, out.shape)
            if self._small(out):
                out[...] = _from_block(theirs, out.dtype, out.shape)
            else:
                exchange(clock, receives=[(link, reading(as_bytes(out)))])
            return out

    def _barrier(self) -> None:
        with self._call("barrier") as (clock, link):
            self._agree(clock, link, self._describe("barrier"))

    def _close_links(self) -> None:
        links, self._links = list(self._links.values()), {}
        for link in links:
            link.close()

    def close(self) -> None:
        """Close the group's connections (members still using the group see PeerFailedError). Idempotent."""
        super().close()
        self._close_links()

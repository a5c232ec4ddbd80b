"""Hierarchical collectives (Horovod's hierarchical allreduce): a group whose ranks span hosts or plugins runs each
collective in steps, inside each *part* (the group's ranks of one host and one plugin) over that plugin's own fast
transport (shared memory for cpu; NCCL or HCCL for a GPU or Ascend plugin), and across the parts over the host
transport (TCP between hosts, the cpu plugin's). The daemon picks it when it creates a group (`communicator`):

- one part: the plugin's own communicator, as before;
- several parts of one rank each, or a session opened with collectives="flat": one flat group over the host
  transport (there is nothing to do inside a part);
- otherwise a `HierarchicalCommunicator`.

Parts of equal size k (the usual: as many ranks on every host) use every member in the cross step, the i-th member
of each part talking to the i-th members of the others (k cross groups of one member per part):

    all_reduce        reduce_scatter in the part (member i holds the part's sum of chunk i), all_reduce of chunk i
                      in cross group i, all_gather in the part; pipelined in segments (the cross step of one
                      segment runs while the part reduces the next) where the link is the slow step:
                      the first three large all_reduces run whole, the last two timing both steps; the members agree on
                      the slowest figures, and later ones pipeline only if the cross step took over PIPELINE_RATIO x
                      the part's (on a fast link the segments' extra synchronisation costs more than the overlap saves);
                      small buffers: all_reduce in the part, then in the cross group (two latency-bound steps
                      instead of three)
    reduce_scatter    reduce_scatter in the part (member i gets the part's sums of the blocks of every part's i-th
                      member), then reduce_scatter in cross group i
    all_gather        all_gather in cross group i, then in the part (blocks put back in group-rank order)
    broadcast         broadcast in the cross group of the root's position, then in every part from that position
    barrier           part, cross group, part

so each host's link carries an all_reduce's S bytes once each way (a flat ring over 2 hosts of 2 ranks carries
1.5·S), and the steps inside a host run at shared-memory speed. Parts of unequal sizes all-reduce through one
leader per part (all_reduce in the part, all_reduce among the leaders, broadcast in the part); their other
collectives, and all_to_all, neighbor_exchange, send and recv always, run on one flat group over the host transport.

Results equal the flat algorithms' within the rounding of a different summation order (floating point): sums are
taken inside each part first. Mean composes (a mean of equal parts' means), the other ops are exact.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import numpy as np

from tessel.core import collectives
from tessel.core.errors import ConfigurationError
from tessel.core.plugin import CollectivePlugin, Communicator, GroupContext, Peer

# all_reduce up to this size per rank takes two all_reduce steps (part, cross) instead of three: latency dominates.
SMALL_BYTES = 64 << 10
# Larger ones run as a pipeline of segments of this many bytes per member of a part: while segment s crosses the
# hosts (on the cross group's thread), the part reduces segment s + 1 and gathers segment s - 1, so the steps
# inside a host hide behind the link. Big enough that a segment's fixed costs (an agreement round trip) are small
# against its transfer even at 10 Gbit/s, small enough that the pipeline fills quickly.
SEGMENT_BYTES = 512 << 10
# Pipeline only where the cross step took over this many times as long as the steps inside the part. Measured on
# the two-host test bed (2 x 2 ranks, 2 shared cores, load 4-6): the ratio is 1.8-2.3 at 1 Gbit/s, where 512 KiB
# segments run 16 MiB in 145 ms against 180-230 ms whole, and 0.6-0.8 at 10 Gbit/s, where segments ran it in ~107 ms
# against ~71 ms whole (each segment adds three synchronised collectives, and on busy cores each costs switches).
PIPELINE_RATIO = 1.25
TIMED_RUNS = 2  # large all_reduces timed (summed) for that choice, after one untimed
MODES = ("auto", "flat")

log = logging.getLogger(__name__)


def parts_of(peers: Sequence[Peer]) -> list[list[int]]:
    """The group's parts: group ranks with one (host, plugin), parts in order of their first member."""
    parts: dict[tuple[str, str], list[int]] = {}
    for position, peer in enumerate(peers):
        parts.setdefault((peer.host_id, peer.plugin), []).append(position)
    return list(parts.values())


def communicator(
    context: GroupContext, own: CollectivePlugin, host: CollectivePlugin | None, mode: str = "auto"
) -> Communicator:
    """The communicator for `context`'s group on a daemon whose plugin's collectives are `own` and whose host
    transport is `host` (see the module docstring). `mode`: "auto" (or "") or "flat"."""
    mode = mode or "auto"
    if mode not in MODES:
        raise ConfigurationError(f"collectives={mode!r} is not one of {list(MODES)} (TESSEL_COLLECTIVES)")
    parts = parts_of(context.peers)
    if len(parts) == 1:
        return own.new_group(context)
    if host is None:
        plugins = sorted({p.plugin or "?" for p in context.peers})
        raise ConfigurationError(
            f"group {context.name!r} of job {context.job_id!r} spans hosts or plugins ({plugins}) but this daemon "
            "has no host transport to join them: install the cpu plugin (tessel[cpu]) next to this one; its shared "
            "memory and TCP collectives connect the parts"
        )
    if mode == "flat" or max(len(p) for p in parts) == 1:
        return host.new_group(context)
    return HierarchicalCommunicator(context, parts, own, host)


def _sub(context: GroupContext, suffix: str, positions: Sequence[int]) -> GroupContext:
    return dataclasses.replace(
        context,
        name=f"{context.name}/{suffix}",
        ranks=tuple(context.ranks[i] for i in positions),
        peers=tuple(context.peers[i] for i in positions),
    )


class HierarchicalCommunicator(Communicator):
    """Collectives over a group of several parts, in steps (see the module docstring). Made by every member."""

    def __init__(self, context: GroupContext, parts: list[list[int]], own: CollectivePlugin, host: CollectivePlugin):
        super().__init__(context)
        me = context.group_rank
        self.parts = parts
        self.part = next(index for index, part in enumerate(parts) if me in part)
        self.local = parts[self.part].index(me)
        self.even = len({len(part) for part in parts}) == 1
        own_part = parts[self.part]
        made: list[Communicator] = []
        try:
            # Every member makes its part first, then its cross group, then the flat one: creating a shared-memory
            # group waits for its members, and this order has no cycle.
            self.intra = own.new_group(_sub(context, f"part{self.part}", own_part)) if len(own_part) > 1 else None
            made += [self.intra] if self.intra is not None else []
            if self.even:
                self.cross = host.new_group(_sub(context, f"cross{self.local}", [p[self.local] for p in parts]))
            elif self.local == 0:
                self.cross = host.new_group(_sub(context, "leaders", [p[0] for p in parts]))
            else:
                self.cross = None
            made += [self.cross] if self.cross is not None else []
            self.flat = host.new_group(_sub(context, "flat", range(context.size)))
        except BaseException:
            for comm in made:
                comm.close()
            raise
        inner = self.intra.transport if self.intra is not None else "-"
        self.transport = f"hierarchical({inner}+{self.flat.transport})"
        self.compute_bound = bool(getattr(self.intra, "compute_bound", False))
        self.pipeline: bool | None = None  # decided by large all_reduce 1 + TIMED_RUNS (see _all_reduce)
        self._whole_runs = 0  # large all_reduces run whole so far; the first may open connections: not timed
        self._timings = np.zeros(2)  # [cross step, -part steps] seconds, summed over the timed runs

    @property
    def sizes(self) -> tuple[int, int]:
        """(members per part, parts) of an even hierarchy."""
        return len(self.parts[0]), len(self.parts)

    def close(self) -> None:
        super().close()
        for comm in (self.intra, self.cross, self.flat):
            if comm is not None:
                comm.close()

    # ---------------------------------------------------------------------------------------------- all_reduce

    def _all_reduce(self, x: np.ndarray, op: str) -> np.ndarray:
        x = np.asarray(x)
        collectives.check(x.dtype, op)
        if not self.even:
            return self._through_leaders(x, op)
        k, _ = self.sizes
        if x.nbytes <= SMALL_BYTES or x.size < k:
            return self.cross.all_reduce(self.intra.all_reduce(x, op), op)
        flat = np.ascontiguousarray(x).reshape(x.size)
        if self.pipeline is None:
            return self._timed_whole(flat, op, k).reshape(x.shape)
        out = np.empty_like(flat)
        segment = SEGMENT_BYTES if self.pipeline else flat.nbytes
        step = k * max(1, segment // x.itemsize)  # elements per segment, a multiple of k
        bounds = [(lo, min(lo + step, flat.size)) for lo in range(0, flat.size, step)]
        crossing: list[tuple[int, int, object]] = []
        # The part's collectives run here in one fixed order on every member (reduce segment s, then gather
        # segment s - 1), the cross group's on its own thread in segment order: the same sequence on every rank.
        for lo, hi in bounds:
            piece = flat[lo:hi]
            if piece.size % k:
                piece = np.concatenate([piece, np.zeros(k - piece.size % k, flat.dtype)])
            crossing.append((lo, hi, self.cross.all_reduce(self.intra.reduce_scatter(piece, op), op, async_op=True)))
            if len(crossing) > 1:
                self._gather_into(out, *crossing.pop(0))
        for lo, hi, handle in crossing:
            self._gather_into(out, lo, hi, handle)
        return out.reshape(x.shape)

    def _timed_whole(self, flat: np.ndarray, op: str, k: int) -> np.ndarray:
        """The first 1 + TIMED_RUNS large all_reduces: in one piece; all but the first time the part's steps and the
        cross step; after the last, every member takes the agreed figures (below; two small all_reduces, once per
        communicator), so all of them decide alike whether later large all_reduces pipeline."""
        piece = flat if flat.size % k == 0 else np.concatenate([flat, np.zeros(k - flat.size % k, flat.dtype)])
        started = time.perf_counter()
        reduced = self.intra.reduce_scatter(piece, op)
        crossing = time.perf_counter()
        across = self.cross.all_reduce(reduced, op)
        gathering = time.perf_counter()
        out = self.intra.all_gather(across)[: flat.size]
        local_s = (crossing - started) + (time.perf_counter() - gathering)
        self._whole_runs += 1
        if self._whole_runs == 1:
            return out
        self._timings += [gathering - crossing, -local_s]
        if self._whole_runs <= TIMED_RUNS:
            return out
        # The slowest cross step, and the quickest member's part steps: a member's part steps include waiting for
        # the other members (to arrive, to finish their cross step), the quickest one's least.
        figures = self.cross.all_reduce(self.intra.all_reduce(self._timings, "max"), "max") * [1.0, -1.0]
        self.pipeline = bool(figures[0] > PIPELINE_RATIO * figures[1])
        log.info("group %r: cross step %.1f ms, part's steps %.1f ms (%d bytes, %d runs): large all_reduces %s",
                 self.context.name, figures[0] * 1e3, figures[1] * 1e3, flat.nbytes, TIMED_RUNS,
                 f"pipeline in {SEGMENT_BYTES >> 10} KiB segments" if self.pipeline else "run whole")  # fmt: skip
        return out

    def _gather_into(self, out: np.ndarray, lo: int, hi: int, handle) -> None:
        out[lo:hi] = self.intra.all_gather(handle.wait())[: hi - lo]

    def _through_leaders(self, x: np.ndarray, op: str) -> np.ndarray:
        inner = "sum" if op == "mean" else op
        partial = self.intra.all_reduce(x, inner) if self.intra is not None else x
        if self.cross is not None:
            partial = self.cross.all_reduce(partial, inner)
        out = self.intra.broadcast(partial, 0) if self.intra is not None else np.array(partial)
        collectives.finish(out, op, self.size)
        return out

    # ---------------------------------------------------------------------------------------------- the others

    def _reduce_scatter(self, x: np.ndarray, op: str) -> np.ndarray:
        x, size = np.asarray(x), self.size
        collectives.check(x.dtype, op)
        if x.ndim == 0 or x.shape[0] % size:
            raise ConfigurationError(
                f"reduce_scatter on group {self.context.name!r} needs dim 0 divisible by the group size {size}, got "
                f"shape {x.shape}; pad dim 0 to a multiple of the group size"
            )
        if not self.even:
            return self.flat.reduce_scatter(x, op)
        k, count = self.sizes
        blocks = x.reshape(size, x.shape[0] // size, *x.shape[1:])
        ordered = np.empty((k, count, *blocks.shape[1:]), x.dtype)  # [member j][part q] = block of parts[q][j]
        for q, part in enumerate(self.parts):
            ordered[:, q] = blocks[part]
        rows = blocks.shape[1]
        partial = self.intra.reduce_scatter(ordered.reshape(k * count * rows, *x.shape[1:]), op)
        return self.cross.reduce_scatter(partial, op)

    def _all_gather(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim == 0:
            raise ConfigurationError(f"all_gather on group {self.context.name!r} needs a tensor with at least one dim")
        if not self.even:
            return self.flat.all_gather(x)
        k, count = self.sizes
        across = self.cross.all_gather(x)  # [part q] = x of parts[q][local]
        both = self.intra.all_gather(across).reshape(k, count, *x.shape)  # [member j][part q]
        out = np.empty((self.size * x.shape[0], *x.shape[1:]), x.dtype)
        blocks = out.reshape(self.size, *x.shape)
        for q, part in enumerate(self.parts):
            blocks[part] = both[:, q]
        return out

    def _broadcast(self, x: np.ndarray, root: int) -> np.ndarray:
        x = np.asarray(x)
        if not 0 <= root < self.size:
            raise ConfigurationError(
                f"broadcast root {root} is not a group rank of {self.context.name!r} (0..{self.size - 1}); roots "
                "are group ranks"
            )
        if not self.even:
            return self.flat.broadcast(x, root)
        root_part = next(q for q, part in enumerate(self.parts) if root in part)
        position = self.parts[root_part].index(root)
        value = self.cross.broadcast(x, root_part) if position == self.local else x
        return self.intra.broadcast(value, position)

    def _barrier(self) -> None:
        if not self.even:
            self.flat.barrier()
            return
        self.intra.barrier()
        self.cross.barrier()
        self.intra.barrier()

    def _all_to_all(self, x: np.ndarray, split_dim: int, concat_dim: int) -> np.ndarray:
        return self.flat.all_to_all(x, split_dim, concat_dim)

    def _neighbor_exchange(self, sends, send_ranks, recv_ranks, recv_shapes, recv_dtype) -> list[np.ndarray]:
        return self.flat.neighbor_exchange(sends, send_ranks, recv_ranks, recv_shapes, recv_dtype)

    def _send(self, x: np.ndarray, peer: int) -> None:
        self.flat.send(x, peer)

    def _recv(self, shape: tuple[int, ...], dtype: np.dtype, peer: int) -> np.ndarray:
        return self.flat.recv(shape, dtype, peer)

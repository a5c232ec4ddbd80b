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
                      in cross group i, all_gather in the part, either whole (where the transports can, the cross
                      step writes chunk i straight into the all_gather's output, which copies it to the peers only)
                      or pipelined in segments (the cross step of one segment runs while the part reduces the
                      next); or the flat ring over all members.
                      Which of the three (WAYS) is measured, per size class (power of two of the bytes), on the
                      class's first large all_reduces, and the members agree on it (`WayTuner`): on a slow link the
                      segments win, where the cores and not the link are the limit (10 Gbit/s between hosts that
                      share 2 cores) whole or flat may; small buffers: all_reduce in the part, then in the cross
                      group (two latency-bound steps instead of three)
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
from collections.abc import Callable, Sequence

import numpy as np

from tessel.core import collectives
from tessel.core.errors import ConfigurationError
from tessel.core.plugin import CollectivePlugin, Communicator, GroupContext, Peer

# all_reduce up to this size per rank takes two all_reduce steps (part, cross) instead of three: latency dominates.
SMALL_BYTES = 64 << 10
# Larger ones may run as a pipeline of segments of this many bytes per member of a part: while segment s crosses the
# hosts (on the cross group's thread), the part reduces segment s + 1 and gathers segment s - 1, so the steps
# inside a host hide behind the link. Small enough that the pipeline fills quickly; at 1 Gbit/s big enough that a
# segment's fixed costs (the step across hosts agrees on each call and waits for both sides) are small against its
# transfer.
SEGMENT_BYTES = 512 << 10
# Those costs weigh more the faster the link: at 10 Gbit/s a 512 KiB segment crosses in ~0.4 ms. "long segments"
# cut the buffer into LONG_SEGMENTS of at least SEGMENT_BYTES instead. On a lent 16-core machine's test bed (2 x 2
# ranks, 16 MiB, the tuner's best of 3): at 10 Gbit/s whole 17.6-18.6 ms, segments 18.4-21.3, long segments
# 14.1-15.0; at 1 Gbit/s segments 139.1-140.0 ms, long segments 141.4-142.7.
LONG_SEGMENTS = 4
# How a large all_reduce of an even hierarchy may run: "whole" (reduce_scatter in the part, all_reduce across,
# all_gather in the part, each of the whole buffer), "segments" (that, pipelined in SEGMENT_BYTES segments), "long
# segments" (pipelined in LONG_SEGMENTS segments) or "flat" (the flat group's TCP ring over all members). Measured
# on the two-host test bed (2 x 2 ranks, 16 MiB, the 2 cores shared with other work): at 1 Gbit/s segments ~150 ms,
# whole ~200 ms, flat ~220-250 ms (the link is the limit); at 10 Gbit/s segments ~107 ms, whole ~40-250 ms, flat
# ~40-120 ms (the cores are, and their load decides). No figure known before the job (a probed link speed) tells
# which, so each size class measures them.
WAYS = ("whole", "segments", "long segments", "flat")
# Per size class: each way once untimed (connections open, pages fault in), then TUNING_ROUNDS timed rounds of
# every way, each round in another order. A way's figure is its quickest round on a member (load only ever adds
# time, so the minimum is the least noisy estimate of what the way costs), then the slowest member's (every
# member takes the agreed figures, so all choose alike). "whole" is kept unless another way's figure is under
# PREFER x its own; TUNING_EVERY large all_reduces of a class after its choice, the class measures again (timed
# rounds only), so a choice made under a burst of load does not stay for the whole job. The margin was 10 %; on a
# lent 16-core machine (2 x 2 ranks, 16 MiB at 10 Gbit/s) long segments measured 16.4 ms against whole's 18.0 in
# one sitting (9 % quicker: whole kept, and the all_reduce ran at 19.3 ms median) and 14.1-15.0 against
# 17.6-18.6 in another.
TUNING_ROUNDS = 3
PREFER = 0.95
TUNING_EVERY = 2000
TUNING_CALLS = len(WAYS) * (1 + TUNING_ROUNDS)  # large all_reduces of one size class before the first choice
MODES = ("auto", "flat")

log = logging.getLogger(__name__)


def parts_of(peers: Sequence[Peer]) -> list[list[int]]:
    """The group's parts: group ranks with one (host, plugin), parts in order of their first member."""
    parts: dict[tuple[str, str], list[int]] = {}
    for position, peer in enumerate(peers):
        parts.setdefault((peer.host_id, peer.plugin), []).append(position)
    return list(parts.values())


def tuning_way(index: int, warm_up: bool = True) -> tuple[str, bool] | None:
    """(way, timed) of the index-th large all_reduce of a size class while it measures, None once it is done:
    with `warm_up` each way once untimed first; then TUNING_ROUNDS rounds of every way, round r rotated by r."""
    count = len(WAYS)
    if warm_up:
        if index < count:
            return WAYS[index], False
        index -= count
    if index >= count * TUNING_ROUNDS:
        return None
    round_, position = divmod(index, count)
    return WAYS[(position + round_) % count], True


def choose(seconds: Sequence[float], prefer: float = PREFER) -> str:
    """The way to keep, from each way's agreed figure (seconds, in WAYS order): "whole" unless another is quicker
    than `prefer` x its figure."""
    best = int(np.argmin(seconds))
    whole = seconds[WAYS.index("whole")]
    return WAYS[best] if seconds[best] < prefer * whole else "whole"


class WayTuner:
    """Which way (WAYS) each large all_reduce runs, per size class, the same on every member: every member sees
    the same sequence of large all_reduces (a collective's size is the same on all), so the schedule of
    `tuning_way` is the same everywhere, and the choice is made from figures `agree` makes equal on all members
    (the slowest member's: an elementwise max over the group)."""

    def __init__(self, agree: Callable[[np.ndarray], np.ndarray]):
        self._agree = agree
        self._classes: dict[int, dict] = {}

    @staticmethod
    def size_class(nbytes: int) -> int:
        return int(nbytes).bit_length()

    def way(self, nbytes: int) -> tuple[str, bool]:
        """(way, timed) for the next large all_reduce of `nbytes`; timed ones must be `record`ed."""
        state = self._classes.setdefault(
            self.size_class(nbytes), {"calls": 0, "warm_up": True, "best": np.full(len(WAYS), np.inf), "choice": None}
        )
        if state["choice"] is not None:
            state["calls"] += 1
            if state["calls"] <= TUNING_EVERY:
                return state["choice"], False
            state.update(calls=0, warm_up=False, choice=None, best=np.full(len(WAYS), np.inf))
        planned = tuning_way(state["calls"], state["warm_up"])
        if planned is None:  # the last timed one raised before `record` (the group failed): measure again
            state.update(calls=0, warm_up=False, best=np.full(len(WAYS), np.inf))
            planned = tuning_way(0, warm_up=False)
        state["calls"] += 1
        return planned

    def record(self, nbytes: int, way: str, seconds: float) -> str | None:
        """Note a timed large all_reduce; after a class's last, agree and choose (returns the choice)."""
        state = self._classes[self.size_class(nbytes)]
        index = WAYS.index(way)
        state["best"][index] = min(state["best"][index], seconds)
        if tuning_way(state["calls"], state["warm_up"]) is not None:
            return None
        figures = self._agree(state["best"])
        state.update(calls=0, choice=choose(figures))
        timed = ", ".join(f"{way} {seconds * 1e3:.1f} ms" for way, seconds in zip(WAYS, figures))
        log.info("large all_reduces of ~%d bytes: %s (slowest member's best of %d): they run %s", nbytes, timed,
                 TUNING_ROUNDS, state["choice"])  # fmt: skip
        return state["choice"]

    def choice(self, nbytes: int) -> str | None:
        state = self._classes.get(self.size_class(nbytes))
        return None if state is None else state["choice"]


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
        # Its steps inside a part keep a core busy, but the step across parts waits on the link, and that wait is
        # what a collective in flight hides (the thread budget, DaemonCore._may_overlap): compute-bound only where
        # the cross step is too.
        self.compute_bound = bool(getattr(self.flat, "compute_bound", False))
        self.tuner = WayTuner(self._agree_max)
        # Whether the transports can write an all_reduce's result where the part's all_gather reads it (the cpu
        # plugin's can): the same on every member, whose parts and cross groups run the same plugins.
        needed = ((self.intra, "output"), (self.intra, "all_gather_into"), (self.cross, "all_reduce_into"))
        self.in_place = self.even and all(hasattr(comm, method) for comm, method in needed)

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
        way, timed = self.tuner.way(flat.nbytes)
        started = time.perf_counter()
        out = self._run(way, flat, op, k)
        if timed:
            self.tuner.record(flat.nbytes, way, time.perf_counter() - started)
        return out.reshape(x.shape)

    def _agree_max(self, figures: np.ndarray) -> np.ndarray:
        """The elementwise max of `figures` over the group (two small all_reduces), the same on every member."""
        return self.cross.all_reduce(self.intra.all_reduce(np.asarray(figures, np.float64), "max"), "max")

    def _run(self, way: str, flat: np.ndarray, op: str, k: int) -> np.ndarray:
        """A large all_reduce of the 1-d `flat`, one of the WAYS."""
        if way == "flat":
            return self.flat.all_reduce(flat, op)
        if way == "whole":
            piece = flat if flat.size % k == 0 else np.concatenate([flat, np.zeros(k - flat.size % k, flat.dtype)])
            partial = self.intra.reduce_scatter(piece, op)
            if not self.in_place:  # the part's all_gather makes the output: no copy into another fresh buffer
                return self.intra.all_gather(self.cross.all_reduce(partial, op))[: flat.size]
            # The cross step writes this member's chunk where the part's all_gather output keeps it, so the
            # all_gather only pushes it to the other members: a copy of the chunk fewer, per member and call.
            out = self.intra.output(piece.size, piece.dtype)
            mine = out[self.local * partial.size : (self.local + 1) * partial.size]
            self.cross.all_reduce_into(partial, mine, op)
            return self.intra.all_gather_into(mine, out)[: flat.size]
        out = np.empty_like(flat)
        segment = SEGMENT_BYTES if way == "segments" else max(SEGMENT_BYTES, flat.nbytes // (k * LONG_SEGMENTS))
        step = k * max(1, segment // flat.itemsize)  # elements per segment, a multiple of k
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

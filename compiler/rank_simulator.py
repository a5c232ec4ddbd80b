"""Running the rank programs of a whole world in one process, without daemons: for tests and for debugging a
lowering ("what does each rank hold after instruction 7?").

Segments run on a ComputePlugin (ONNX Runtime); collectives are numpy over the ranks' values with the daemons'
semantics (plugins.base.Communicator): AllGather concatenates on dim 0 in group-rank order, ReduceScatter gives
group rank i block i of dim 0, AlltoAll splits split_dim and concatenates concat_dim, root/peer/send/recv ranks
are group ranks. Asynchronous starts do not block; a collective completes once every member has started it
(per group, in issue order); sends are buffered. A world where no rank can move raises with each rank's place.

    stores = simulate([program] * 2, [feeds_rank0, feeds_rank1], CpuCompute(1))
    loss_on_rank_1 = stores[1][program.outputs[0]]
"""

from __future__ import annotations

import functools
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessel.compiler.rank_program import RankProgram
from tessel.errors import CollectiveMismatchError, ConfigurationError
from tessel.plugins.cpu.reduce import finish, ufunc
from tessel.v1 import collective_pb2
from tessel.wire import numpy_dtype

_REDUCE = {
    collective_pb2.SUM: "sum",
    collective_pb2.PROD: "prod",
    collective_pb2.MAX: "max",
    collective_pb2.MIN: "min",
    collective_pb2.MEAN: "mean",
}
_STATE_SUFFIX = "/new"


class _Part:
    """One rank's part in one collective: what it contributed, and its result once the collective completes."""

    def __init__(self, op: Any, values: list[np.ndarray], group_rank: int):
        self.op, self.values, self.group_rank = op, values, group_rank
        self.result: list[np.ndarray] | None = None


class _Rank:
    def __init__(self, rank: int, program: RankProgram, compute: Any, store: dict[str, np.ndarray]):
        self.rank, self.program, self.compute, self.store = rank, program, compute, store
        self.pc = 0
        self.handles: dict[str, tuple[_Part, list[str]]] = {}
        self.started: _Part | None = None  # a synchronous collective this rank is blocked in
        self.executables = {name: compute.compile(s.onnx) for name, s in program.segments.items()}

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.program.instructions)

    def run_segment(self, op: Any) -> None:
        segment, exe = self.program.segments[op.segment], self.executables[op.segment]
        missing = [n for n in exe.input_names if n not in self.store]
        if missing:
            raise ConfigurationError(f"rank {self.rank}: segment {op.segment!r} needs {missing}, not in the store")
        values = self.compute.run(exe, {n: self.store[n] for n in exe.input_names})
        for name, value in zip(exe.output_names, values):
            if name.endswith(_STATE_SUFFIX) and name[: -len(_STATE_SUFFIX)] in segment.state:
                self.store[name[: -len(_STATE_SUFFIX)]] = value
            elif name in op.outputs:
                self.store[name] = value


class World:
    """The ranks of one job, each running its RankProgram."""

    def __init__(self, programs: Sequence[RankProgram], compute: Any):
        self.programs, self.compute = list(programs), compute
        self.size = len(self.programs)

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]], stores: list[dict] | None = None) -> list[dict]:
        """Run every rank's program once from its store plus `feeds[rank]`; returns the stores afterwards."""
        stores = stores if stores is not None else [{} for _ in self.programs]
        for store, feed in zip(stores, feeds):
            store.update({k: np.asarray(v) for k, v in feed.items()})
        ranks = [_Rank(r, p, self.compute, stores[r]) for r, p in enumerate(self.programs)]
        self._posted: dict[tuple, dict[int, _Part]] = defaultdict(dict)
        self._sequence: dict[tuple, int] = defaultdict(int)
        self._mail: dict[tuple, deque] = defaultdict(deque)
        self._receivers: dict[tuple, deque] = defaultdict(deque)
        while not all(r.done for r in ranks):
            moved = [self._advance(r) for r in ranks]
            if not any(moved) and not self._deliver():
                stuck = {r.rank: f"instruction {r.pc}" for r in ranks if not r.done}
                raise ConfigurationError(f"the simulated world is stuck (deadlock) at {stuck}")
        return stores

    def _ranks_of(self, program: RankProgram, group: str) -> tuple[int, ...]:
        return tuple(range(self.size)) if not group else tuple(program.groups[group])

    def _advance(self, rank: _Rank) -> bool:
        moved = False
        while not rank.done:
            ins = rank.program.program.instructions[rank.pc]
            which = ins.WhichOneof("op")
            op = getattr(ins, which)
            if which == "run_segment":
                rank.run_segment(op)
            elif which == "collective":
                if not self._collective(rank, op):
                    return moved
            elif which == "wait":
                part, outputs = rank.handles[op.handle]
                if part.result is None:
                    self._deliver()
                if part.result is None:
                    return moved
                rank.store.update(zip(outputs, part.result))
                del rank.handles[op.handle]
            elif which == "free":
                for name in op.names:
                    rank.store.pop(name, None)
            elif which == "copy":
                rank.store[op.target] = rank.store[op.source].copy()
            else:
                raise ConfigurationError(f"the simulator does not run {which!r} instructions")
            rank.pc += 1
            moved = True
        return moved

    def _collective(self, rank: _Rank, op: Any) -> bool:
        """Start (once) and, for a synchronous one, finish the collective at rank.pc; False while blocked."""
        if rank.started is None:
            ranks = self._ranks_of(rank.program, op.group)
            part = _Part(op, [rank.store[n] for n in op.inputs], ranks.index(rank.rank))
            self._post(ranks, part)
            if op.handle:
                rank.handles[op.handle] = (part, list(op.outputs))
                return True
            rank.started = part
        self._deliver()
        if rank.started.result is None:
            return False
        rank.store.update(zip(op.outputs, rank.started.result))
        rank.started = None
        return True

    def _post(self, ranks: tuple[int, ...], part: _Part) -> None:
        me, kind = ranks[part.group_rank], part.op.kind
        if kind == collective_pb2.SEND:
            self._mail[(ranks, me, ranks[part.op.peer])].append(part.values[0].copy())
            part.result = []
        elif kind == collective_pb2.RECV:
            self._receivers[(ranks, ranks[part.op.peer], me)].append(part)
        else:
            key = (ranks, self._sequence[(ranks, me)])
            self._sequence[(ranks, me)] += 1
            self._posted[key][part.group_rank] = part

    def _deliver(self) -> bool:
        """Complete every collective whose members have all started it; True if any completed."""
        done = False
        for key, waiting in self._receivers.items():
            while waiting and self._mail[key]:
                waiting.popleft().result = [self._mail[key].popleft()]
                done = True
        for key in [k for k, parts in self._posted.items() if len(parts) == len(k[0])]:
            parts = self._posted.pop(key)
            for group_rank, result in enumerate(_compute([parts[i] for i in range(len(parts))], key[0])):
                parts[group_rank].result = result
            done = True
        return done


def _compute(parts: list[_Part], ranks: tuple[int, ...]) -> list[list[np.ndarray]]:
    """Each member's outputs of one collective (numpy, the daemons' semantics)."""
    first = parts[0].op
    for part in parts[1:]:
        if part.op.kind != first.kind or part.op.op != first.op:
            culprit = ranks[part.group_rank]
            raise CollectiveMismatchError(
                f"ranks {ranks[0]} and {culprit} issue different collectives ({first.kind}/{first.op} vs "
                f"{part.op.kind}/{part.op.op}) at the same point of group {ranks}",
                culprit,
                "kind",
            )
    n, kind, xs = len(parts), first.kind, [p.values[0] if p.values else None for p in parts]
    if kind == collective_pb2.ALL_REDUCE:  # several inputs: a bucket, each tensor reduced on its own
        totals = [_reduced([p.values[i] for p in parts], first.op) for i in range(len(parts[0].values))]
        return [[np.array(total) for total in totals] for _ in parts]
    if kind == collective_pb2.REDUCE_SCATTER:
        return [[block] for block in np.split(_reduced(xs, first.op), n, axis=0)]
    if kind == collective_pb2.ALL_GATHER:
        return [[np.concatenate(xs, axis=0)] for _ in parts]
    if kind == collective_pb2.BROADCAST:
        return [[xs[first.root].copy()] for _ in parts]
    if kind == collective_pb2.ALL_TO_ALL:
        blocks = [np.split(x, n, axis=first.split_dim) for x in xs]
        return [[np.concatenate([blocks[j][i] for j in range(n)], axis=first.concat_dim)] for i in range(n)]
    if kind == collective_pb2.NEIGHBOR_EXCHANGE:
        return [_exchange(parts, i) for i in range(n)]
    raise ConfigurationError(f"the simulator does not run collective kind {kind}")


def _reduced(xs: list[np.ndarray], op: int) -> np.ndarray:
    total = np.array(functools.reduce(ufunc(xs[0].dtype, _REDUCE[op]), xs))
    finish(total, _REDUCE[op], len(xs))
    return total


def _exchange(parts: list[_Part], me: int) -> list[np.ndarray]:
    op, received = parts[me].op, []
    for source, shape in zip(op.recv_ranks, op.recv_shapes):
        sender = parts[source].op
        if me not in sender.send_ranks:
            raise ConfigurationError(f"group rank {me} expects a tensor from {source}, which sends it nothing")
        value = parts[source].values[list(sender.send_ranks).index(me)]
        if tuple(value.shape) != tuple(shape.dims) or value.dtype != numpy_dtype(op.recv_dtype):
            raise ConfigurationError(
                f"group rank {me} expects {numpy_dtype(op.recv_dtype)}{tuple(shape.dims)} from {source}, "
                f"which sends {value.dtype}{value.shape}"
            )
        received.append(value.copy())
    return received


def simulate(
    programs: Sequence[RankProgram], feeds: Sequence[Mapping[str, np.ndarray]], compute: Any, runs: int = 1
) -> list[dict[str, np.ndarray]]:
    """Run each rank's program `runs` times (feeding `feeds[rank]` before the first); returns the final stores."""
    world = World(programs, compute)
    stores = world.run(feeds)
    for _ in range(runs - 1):
        world.run([{} for _ in programs], stores)
    return stores

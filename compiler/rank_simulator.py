"""Running a whole world in one process, without daemons: the one in-process simulator, for tests and for
debugging a plan or a lowering ("what does each rank hold after instruction 7?").

`simulate` runs the ranks' RankPrograms; `run_graphs` runs the ranks' graphs (a parallel plan's rank graphs, say)
by lowering each to its rank program first, so both go through the same instructions the daemons run.

Segments run on a ComputePlugin (ONNX Runtime); collectives are numpy over the ranks' values with the daemons'
semantics (tessel.core.collectives): AllGather concatenates on dim 0 in group-rank order, ReduceScatter gives
group rank i block i of dim 0, AlltoAll splits split_dim and concatenates concat_dim, root/peer/send/recv ranks
are group ranks. Asynchronous starts do not block; a collective completes once every member has started it
(per group, in issue order); sends are buffered. A world where no rank can move raises with each rank's place;
so does a run that ends with a message nobody received, a receive nothing matched or a collective never waited for.

Without a compute plugin (`compute=None`) the world runs *dry*: a segment only checks that the store holds its
graph's inputs and stores a placeholder under each of its outputs (the placeholder holds the tensor's name, and a
receive checks that it got the tensor of the name it expects: two ranks whose transfer orders disagree fail).
This is how a pipeline schedule is checked before any rank runs (compiler/pipeline/check.py). With `costs`
(segment name -> seconds) the world also keeps time: each rank's clock advances by its segments' costs and
waits until what it receives was sent (transfers are free); `World.clocks` and `World.busy` then say when each
rank finished and how long it computed. With `track_memory`, `World.peak_bytes` says how many bytes of the tensors
a run made (not those it started from) each rank held at once, at most.

    stores = simulate([program] * 2, [feeds_rank0, feeds_rank1], CpuCompute(1))
    loss_on_rank_1 = stores[1][program.outputs[0]]
    outs = run_graphs([plan.rank_graph(r) for r in range(4)], [plan.local_feeds(feeds, r) for r in range(4)], compute)

The collectives' numpy semantics are tessel.core.collectives, the reference every plugin is tested against.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tessel.compiler.ir import Graph
from tessel.compiler.rank_program import RankProgram, lower_rank_program
from tessel.core import collectives
from tessel.core.errors import CollectiveMismatchError, ConfigurationError
from tessel.core.wire import numpy_dtype, reduce_op_name
from tessel.v1 import collective_pb2

_STATE_SUFFIX = "/new"


class _Part:
    """One rank's part in one collective: what it contributed, and its result once the collective completes
    (`done`: the simulated time it completed)."""

    def __init__(self, op: Any, values: list[np.ndarray], group_rank: int, started: float = 0.0):
        self.op, self.values, self.group_rank, self.started = op, values, group_rank, started
        self.result: list[np.ndarray] | None = None
        self.done = started


class _Rank:
    def __init__(self, rank: int, program: RankProgram, compute: Any, store: dict[str, np.ndarray], costs=None):
        self.rank, self.program, self.compute, self.store = rank, program, compute, store
        self.pc = 0
        self.handles: dict[str, tuple[_Part, list[str]]] = {}
        self.started: _Part | None = None  # a synchronous collective this rank is blocked in
        dry = compute is None
        self.executables = {} if dry else {name: compute.compile(s.onnx) for name, s in program.segments.items()}
        self.costs = costs or {}
        self.clock = self.busy = 0.0
        self.peak = 0  # bytes of the tensors the run made that were alive at once (track_memory)
        self.initial: set[str] = set()

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.program.instructions)

    def run_segment(self, op: Any) -> None:
        cost = self.costs.get(op.segment, 0.0)
        self.clock += cost
        self.busy += cost
        if self.compute is None:
            self._run_dry(op)
            return
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

    def _run_dry(self, op: Any) -> None:
        segment = self.program.segments[op.segment]
        missing = [v.name for v in segment.graph.inputs if v.name not in self.store]
        if missing:
            raise ConfigurationError(
                f"rank {self.rank}: {op.segment} needs {missing}, which nothing before it on this rank made or "
                "received (it waits on itself)"
            )
        for name in op.outputs or segment.outputs:
            self.store[name] = placeholder(name)

    def describe(self, index: int) -> str:
        ins = self.program.program.instructions[index]
        which = ins.WhichOneof("op")
        op = getattr(ins, which)
        if which == "wait":
            part, outputs = self.handles.get(op.handle, (None, []))
            what = f"{outputs[0]!r} " if outputs else ""
            peer = ""
            if part is not None and part.op.kind == collective_pb2.RECV:
                ranks = self.program.groups.get(part.op.group, ())
                peer = f"from rank {ranks[part.op.peer]} " if ranks else ""
            return f"waits for {what}{peer}(instruction {index})"
        if which == "run_segment":
            return f"runs {op.segment} (instruction {index})"
        return f"is in {which} (instruction {index})"


def placeholder(name: str) -> np.ndarray:
    """What a dry world stores for tensor `name`: its name."""
    return np.array(name, dtype=object)


class World:
    """The ranks of one job, each running its RankProgram."""

    def __init__(
        self,
        programs: Sequence[RankProgram],
        compute: Any,
        costs: Mapping[str, float] | None = None,
        track_memory: bool = False,
    ):
        self.programs, self.compute, self.costs = list(programs), compute, costs
        self.size = len(self.programs)
        self.clocks: list[float] = [0.0] * self.size
        self.busy: list[float] = [0.0] * self.size
        self.track_memory = track_memory
        self.peak_bytes: list[int] = [0] * self.size

    def run(self, feeds: Sequence[Mapping[str, np.ndarray]], stores: list[dict] | None = None) -> list[dict]:
        """Run every rank's program once from its store plus `feeds[rank]`; returns the stores afterwards."""
        stores = stores if stores is not None else [{} for _ in self.programs]
        for store, feed in zip(stores, feeds):
            store.update({k: np.asarray(v) for k, v in feed.items()})
        ranks = [_Rank(r, p, self.compute, stores[r], self.costs) for r, p in enumerate(self.programs)]
        for rank in ranks:
            rank.initial = set(rank.store)
        self._posted: dict[tuple, dict[int, _Part]] = defaultdict(dict)
        self._sequence: dict[tuple, int] = defaultdict(int)
        self._mail: dict[tuple, deque] = defaultdict(deque)
        self._receivers: dict[tuple, deque] = defaultdict(deque)
        while not all(r.done for r in ranks):
            moved = [self._advance(r) for r in ranks]
            if not any(moved) and not self._deliver():
                stuck = "; ".join(f"rank {r.rank} {r.describe(r.pc)}" for r in ranks if not r.done)
                raise ConfigurationError(f"the simulated world is stuck (deadlock): {stuck}")
        self._check_finished(ranks)
        self.clocks = [r.clock for r in ranks]
        self.busy = [r.busy for r in ranks]
        self.peak_bytes = [max(p, r.peak) for p, r in zip(self.peak_bytes, ranks)]
        return stores

    def _check_finished(self, ranks: list[_Rank]) -> None:
        """Every message received, every receive matched, every asynchronous collective waited for."""
        for (group, source, target), mail in self._mail.items():
            if mail:
                raise ConfigurationError(
                    f"rank {source} sent {len(mail)} tensor(s) to rank {target} that no receive took (group "
                    f"{group}): every send needs its receive"
                )
        for (group, source, target), waiting in self._receivers.items():
            if waiting:
                raise ConfigurationError(
                    f"rank {target} posted {len(waiting)} receive(s) from rank {source} that nothing sent (group "
                    f"{group}): every receive needs its send"
                )
        for rank in ranks:
            if rank.handles:
                raise ConfigurationError(
                    f"rank {rank.rank} never waited for asynchronous collective(s) {sorted(rank.handles)}"
                )

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
                self._received(rank, part, outputs)
                rank.clock = max(rank.clock, part.done)
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
            if self.track_memory:
                live = sum(int(v.nbytes) for k, v in rank.store.items() if k not in rank.initial)
                rank.peak = max(rank.peak, live)
        return moved

    def _collective(self, rank: _Rank, op: Any) -> bool:
        """Start (once) and, for a synchronous one, finish the collective at rank.pc; False while blocked."""
        if rank.started is None:
            ranks = self._ranks_of(rank.program, op.group)
            part = _Part(op, [rank.store[n] for n in op.inputs], ranks.index(rank.rank), rank.clock)
            self._post(ranks, part)
            if op.handle:
                rank.handles[op.handle] = (part, list(op.outputs))
                return True
            rank.started = part
        self._deliver()
        if rank.started.result is None:
            return False
        self._received(rank, rank.started, list(op.outputs))
        rank.clock = max(rank.clock, rank.started.done)
        rank.started = None
        return True

    def _received(self, rank: _Rank, part: _Part, outputs: list[str]) -> None:
        """Store a completed collective's results; a dry receive must get the tensor of the name it expects."""
        if self.compute is None:
            if part.op.kind == collective_pb2.RECV:
                got = str(part.result[0])
                if got != outputs[0]:
                    ranks = self._ranks_of(rank.program, part.op.group)
                    raise ConfigurationError(
                        f"rank {rank.rank} receives {outputs[0]!r} from rank {ranks[part.op.peer]}, which sends "
                        f"{got!r} first on that channel: the two ranks' transfer orders disagree"
                    )
                rank.store[outputs[0]] = part.result[0]
                return
            rank.store.update((name, placeholder(name)) for name in outputs)
            return
        rank.store.update(zip(outputs, part.result))

    def _post(self, ranks: tuple[int, ...], part: _Part) -> None:
        me, kind = ranks[part.group_rank], part.op.kind
        if kind == collective_pb2.SEND:
            self._mail[(ranks, me, ranks[part.op.peer])].append((part.values[0].copy(), part.started))
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
                receiver = waiting.popleft()
                value, sent = self._mail[key].popleft()
                receiver.result, receiver.done = [value], max(receiver.started, sent)
                done = True
        for key in [k for k, parts in self._posted.items() if len(parts) == len(k[0])]:
            parts = self._posted.pop(key)
            members = [parts[i] for i in range(len(parts))]
            results = _placeholders(members) if self.compute is None else _compute(members, key[0])
            finished = max(p.started for p in members)
            for group_rank, result in enumerate(results):
                parts[group_rank].result, parts[group_rank].done = result, finished
            done = True
        return done


def _placeholders(parts: list[_Part]) -> list[list[np.ndarray]]:
    """A dry collective's results: a placeholder per output, named as the receiving rank names it."""
    return [[placeholder(name) for name in part.op.outputs] for part in parts]


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
    kind, xs = first.kind, [p.values[0] if p.values else None for p in parts]
    if kind == collective_pb2.ALL_REDUCE:  # several inputs: a bucket, each tensor reduced on its own
        op = reduce_op_name(first.op)
        totals = [collectives.reduce([p.values[i] for p in parts], op) for i in range(len(parts[0].values))]
        return [[np.array(total) for total in totals] for _ in parts]
    if kind == collective_pb2.REDUCE_SCATTER:
        return [[block] for block in collectives.reduce_scatter(xs, reduce_op_name(first.op))]
    if kind == collective_pb2.ALL_GATHER:
        return [[whole] for whole in collectives.all_gather(xs)]
    if kind == collective_pb2.BROADCAST:
        return [[x] for x in collectives.broadcast(xs, first.root)]
    if kind == collective_pb2.ALL_TO_ALL:
        return [[x] for x in collectives.all_to_all(xs, first.split_dim, first.concat_dim)]
    if kind == collective_pb2.NEIGHBOR_EXCHANGE:
        received = collectives.neighbor_exchange(
            [p.values for p in parts], [p.op.send_ranks for p in parts], [p.op.recv_ranks for p in parts]
        )
        _check_exchange(parts, received)
        return received
    raise ConfigurationError(f"the simulator does not run collective kind {kind}")


def _check_exchange(parts: list[_Part], received: list[list[np.ndarray]]) -> None:
    """Each received tensor must have the shape and dtype its receiver declared."""
    for me, (part, values) in enumerate(zip(parts, received)):
        op = part.op
        for source, shape, value in zip(op.recv_ranks, op.recv_shapes, values):
            if tuple(value.shape) != tuple(shape.dims) or value.dtype != numpy_dtype(op.recv_dtype):
                raise ConfigurationError(
                    f"group rank {me} expects {numpy_dtype(op.recv_dtype)}{tuple(shape.dims)} from {source}, "
                    f"which sends {value.dtype}{value.shape}"
                )


def simulate(
    programs: Sequence[RankProgram], feeds: Sequence[Mapping[str, np.ndarray]], compute: Any, runs: int = 1
) -> list[dict[str, np.ndarray]]:
    """Run each rank's program `runs` times (feeding `feeds[rank]` before the first); returns the final stores."""
    world = World(programs, compute)
    stores = world.run(feeds)
    for _ in range(runs - 1):
        world.run([{} for _ in programs], stores)
    return stores


def run_graphs(
    graphs: Sequence[Graph], feeds: Sequence[Mapping[str, np.ndarray]], compute: Any
) -> list[list[np.ndarray]]:
    """Run graphs[r] on feeds[r] for every rank r, collectives across ranks; returns each rank's outputs."""
    for rank, (graph, feed) in enumerate(zip(graphs, feeds)):
        missing = [v.name for v in graph.inputs if v.name not in feed]
        if missing:
            raise ConfigurationError(f"rank {rank}: no value for input(s) {missing}")
    programs = [lower_rank_program(graph, world_size=len(graphs)) for graph in graphs]
    stores = World(programs, compute).run(feeds)
    return [[store[name] for name in program.outputs] for program, store in zip(programs, stores)]

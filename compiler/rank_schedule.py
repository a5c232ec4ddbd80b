"""The run order of a rank's nodes, from their dependency graph, so that communication overlaps computation.

A list scheduler: it keeps the set of nodes whose inputs exist and emits, at every point,
1. a collective whose inputs exist and whose turn it is (see below): it starts asynchronously on the daemon
   (unless the local work that could run meanwhile is too little to hide anything: that runs first; and a large
   gather of the graph's inputs waits while another one is in flight, `GATHER_BYTES`);
2. else a local node whose inputs exist, preferring one that leads to the earliest collective still to start (so
   that it starts sooner), then the graph's own order;
3. else it waits for the oldest collective in flight: only now do the readers of its result become ready.
A wait ends the ONNX segment being filled (a `Wait` item), so the work emitted while a collective is in flight runs
as a segment of its own between the collective's start and its wait, and a segment never reads a result that was
not waited for. Several collectives may be in flight at once. With a cost estimate, local work that can run while
collectives are in flight runs there only if it adds up to enough to hide something; less runs after the wait.

Turns: every rank must start a group's collectives in the same order. By default a collective's turn comes after
every collective before it in the graph, an order the same on every rank of a valid program (hand-written ones
included: pipeline stages pair their sends and receives in it); only local work moves. Where the ranks' graphs
are copies of one another (a parallel plan's rank graphs, data parallelism: `spmd_blocks`), the schedule itself is
the same on every rank, so any collective whose inputs exist may start, in the order the schedule makes them
ready: the second copy's first AllReduce of MicroBatchInterleaved starts before the first copy's second one, and a
copy's backward starts its AllReduce without waiting for the other copy's forward. Sends and receives keep their
place among the collectives even then (a peer's different graph pairs them in that order).

The scheduler knows no op by name: a data-parallel step's gradient buckets, the copies of MicroBatchInterleaved and
a semi-auto plan's redistributions all overlap by the same rule.

    items = schedule(graph.nodes, is_collective)                                    # Node | Wait, in run order
    items = schedule(graph.nodes, is_collective, spmd_blocks(graph.nodes, is_collective, is_point_to_point))
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tessel.compiler.ir import Node, Value


@dataclass(frozen=True, eq=False)
class Wait:
    """The point where the result of `collective` (started earlier) is first needed: the segment ends here."""

    collective: Node


def schedule(
    nodes: Sequence[Node],
    is_collective: Callable[[Node], bool],
    blocks: Mapping[Node, int] | None = None,
    cost: Callable[[Node], float] | None = None,
    min_overlap: float = 0.0,
) -> list[Node | Wait]:
    """`nodes` (a topological order) reordered for overlap, with a `Wait` before the first use of each collective
    started earlier (see the module docstring). Nodes read only Values produced by `nodes` or from outside.

    `blocks`: each collective's turn, a number that never decreases along the graph; collectives of one block may
    start in any order, all of them before any of the next block (default: one block each, the graph's order).
    `cost`: a node's estimated seconds; local work that can run while collectives are in flight runs there only if
    it adds up to `min_overlap`."""
    return _Scheduler(nodes, is_collective, blocks, cost, min_overlap).run()


# A collective that reads only the graph's inputs and whose result is this much larger than what it reads (the
# all-gather of a level3 weight block) starts only when no other such collective is in flight: its result is held
# from its start to its wait, and with every block ready from the first instruction on, a level3 step started all
# its gathers at once and held every gathered weight (measured: 16 x 16 MiB beside 48 MiB of weight blocks on each
# of 4 ranks). One in flight still overlaps each gather with the layer before it. Gathers of computed values (level1's
# updated blocks) keep their schedule: capping them too cost level1 at 4 ranks ~250 MiB more (measured).
GATHER_BYTES = 1 << 20


def _growth_bytes(node: Node) -> int:
    """Bytes `node`'s outputs exceed its inputs by (0 where a shape is symbolic)."""

    def size(values) -> int:
        total = 0
        for v in values:
            if any(not isinstance(d, int) for d in v.shape):
                return -1
            total += math.prod(v.shape) * v.dtype.itemsize
        return total

    grown, read = size(node.outputs), size(node.inputs)
    return grown - read if grown >= 0 and read >= 0 else 0


def spmd_blocks(
    nodes: Sequence[Node], is_collective: Callable[[Node], bool], is_point_to_point: Callable[[Node], bool]
) -> dict[Node, int]:
    """Turns for ranks that run copies of one graph: every group collective between two sends or receives in one
    block, each send or receive a block of its own."""
    blocks, block = {}, 0
    for node in nodes:
        if is_collective(node):
            if is_point_to_point(node):
                blocks[node] = block + 1
                block += 2
            else:
                blocks[node] = block
    return blocks


class _Scheduler:
    def __init__(self, nodes, is_collective, blocks, cost, min_overlap):
        self.nodes, self.is_collective, self.cost, self.min_overlap = nodes, is_collective, cost, min_overlap
        self.position = {node: i for i, node in enumerate(nodes)}
        producer: dict[Value, Node] = {out: node for node in nodes for out in node.outputs}
        self.users: dict[Node, list[Node]] = {node: [] for node in nodes}
        self.missing: dict[Node, int] = {}
        self.deps: dict[Node, set[Node]] = {}
        for node in nodes:
            deps = self.deps[node] = {producer[v] for v in node.inputs if v in producer}
            self.missing[node] = len(deps)
            for dep in deps:
                self.users[dep].append(node)
        collectives = [n for n in nodes if is_collective(n)]
        if blocks is None:
            blocks = {c: i for i, c in enumerate(collectives)}
        self.turn = {c: (blocks[c], self.position[c]) for c in collectives}
        self.gathers = {c for c in collectives if not self.deps[c] and _growth_bytes(c) >= GATHER_BYTES}
        self.unstarted = sorted(self.turn.values())  # turns of the collectives not started yet
        self.urgency = _urgency(nodes, self.users, self.turn)
        self.ready: list[tuple[tuple, int, Node]] = []  # local nodes whose inputs exist: (urgency, position, node)
        self.startable: list[tuple[tuple[int, int], Node]] = []  # collectives whose inputs exist, by turn
        # Deferred: local nodes that read only the graph's inputs (parameters, optimizer state) and lead to no
        # collective, such as an optimizer's `beta1 * m`. Run as soon as they could, they would all run before
        # the first wait and hold a weight-sized result each until their reader runs after its wait (measured:
        # 17 x 16 MiB held by a data-parallel Adam step of 128 MiB of weights); they run when their first reader
        # has every other input instead, so each lives only as long as that reader's segment.
        # (Also what such nodes alone read: a constant.)
        never = (float("inf"), float("inf"))
        self.deferred: dict[Node, bool] = {}  # deferred node -> released
        for n in nodes:
            local = not is_collective(n) and self.urgency[n] == never and self.users[n]
            if local and all(d in self.deferred for d in self.deps[n]):
                self.deferred[n] = False
        self.pending = {node: 0 for node in nodes}  # deferred producers of a node not released yet
        for node in self.deferred:
            for user in set(self.users[node]):
                self.pending[user] += 1
        for node in nodes:
            if self.missing[node] == 0 and node not in self.deferred:
                self._arrive(node)
        for node in nodes:
            self._release_for(node)

    def _arrive(self, node: Node) -> None:
        if self.is_collective(node):
            heapq.heappush(self.startable, (self.turn[node], node))
        else:
            heapq.heappush(self.ready, (self.urgency[node], self.position[node], node))

    def _available(self, node: Node) -> None:
        """`node`'s outputs exist: its users may become ready."""
        for user in self.users[node]:
            self.missing[user] -= 1
            if self.missing[user] == 0:
                if self.deferred.get(user) is not False:  # a deferred node arrives when released
                    self._arrive(user)
            else:
                self._release_for(user)

    def _release_for(self, user: Node) -> None:
        """Make `user`'s deferred producers ready once they are all it still waits for (not for a deferred user:
        its own reader releases it, and it its producers)."""
        if user not in self.deferred and self.pending[user] and self.missing[user] == self.pending[user]:
            self._release([dep for dep in self.deps[user] if self.deferred.get(dep) is False])

    def _release(self, nodes: Sequence[Node]) -> None:
        for dep in nodes:
            if self.deferred[dep]:
                continue
            self.deferred[dep] = True
            for other in set(self.users[dep]):
                self.pending[other] -= 1
            self._release([d for d in self.deps[dep] if self.deferred.get(d) is False])
            if self.missing[dep] == 0:
                self._arrive(dep)

    def _may_start(self) -> bool:
        """Whether a collective whose inputs exist is in the block of the earliest turn not taken yet."""
        return bool(self.startable) and self.startable[0][0][0] == self.unstarted[0][0]

    def run(self) -> list[Node | Wait]:
        in_flight: list[Node] = []  # started, not waited for, oldest first
        order: list[Node | Wait] = []
        emitted, decide = 0, False  # decide: whether to overlap the work now ready is still open
        while emitted < len(self.nodes):
            # Too little work to hide anything runs first, in the segment that is open, not after the wait.
            start = self._may_start() and not (self.ready and self.cost is not None and not self._worth_overlapping())
            if start and self.startable[0][1] in self.gathers and any(c in self.gathers for c in in_flight):
                start = False  # one large gather ahead at a time (see GATHER_BYTES)
            if start:
                turn, collective = heapq.heappop(self.startable)
                self.unstarted.remove(turn)
                order.append(collective)
                in_flight.append(collective)
                emitted, decide = emitted + 1, True
            elif self.ready and not (in_flight and decide and not self._worth_overlapping()):
                node = heapq.heappop(self.ready)[2]
                order.append(node)
                self._available(node)
                emitted, decide = emitted + 1, False
            elif in_flight:
                collective = in_flight.pop(0)
                order.append(Wait(collective))
                self._available(collective)
                decide = True
            elif any(not released for released in self.deferred.values()):  # pragma: no cover - a safety net
                self._release([dep for dep, released in self.deferred.items() if not released])
            else:  # pragma: no cover - a graph in topological order always makes progress
                raise ValueError("schedule: the nodes form a cycle or read a value no node produces")
        return order

    def _worth_overlapping(self) -> bool:
        """Whether the local work that can run before any collective in flight completes reaches min_overlap."""
        if self.cost is None:
            return True
        left: dict[Node, int] = {}
        queue = [entry[2] for entry in self.ready]
        total = 0.0
        while queue:
            node = queue.pop()
            total += self.cost(node)
            if total >= self.min_overlap:
                return True
            for user in self.users[node]:
                if not self.is_collective(user):
                    left[user] = left.get(user, self.missing[user]) - 1
                    if left[user] == 0:
                        queue.append(user)
        return False


def _urgency(nodes: Sequence[Node], users: dict[Node, list[Node]], turn: dict[Node, tuple]) -> dict[Node, tuple]:
    """For each node, the turn of the earliest collective that needs it (a turn after every other if none)."""
    never = (float("inf"), float("inf"))
    urgency: dict[Node, tuple] = {}
    for node in reversed(nodes):
        urgency[node] = min([turn.get(node, never), *(urgency[u] for u in users[node])])
    return urgency

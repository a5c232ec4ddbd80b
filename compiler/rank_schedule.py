"""The run order of a rank's nodes, from their dependency graph, so that communication overlaps computation.

A list scheduler: it keeps the set of nodes whose inputs exist and emits, at every point,
1. the next collective, as soon as its inputs exist (it starts asynchronously on the daemon);
2. else a local node whose inputs exist, preferring one that leads to the next collective (so that it starts
   sooner), then the graph's own order;
3. else it waits for the oldest collective in flight: only now do the readers of its result become ready.
A wait ends the ONNX segment being filled (a `Wait` item), so the work emitted while a collective is in flight runs
as a segment of its own between the collective's start and its wait, and a segment never reads a result that was
not waited for. Several collectives may be in flight at once.

Collectives keep the order they have in the graph. Every rank must issue a group's collectives in the same order;
the graph's order already is (SPMD ranks trace the same network, and hand-written programs such as pipeline
stages pair their sends and receives in it), and any reordering that depends only on each rank's own graph
could break that for graphs that differ by rank. Only local work moves.

The scheduler knows no op by name: a data-parallel step's gradient buckets, the copies of MicroBatchInterleaved and
a semi-auto plan's redistributions all overlap by the same rule.

    items = schedule(graph.nodes)      # Node | Wait, in run order
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from tessel.compiler.ir import Node, Value


@dataclass(frozen=True, eq=False)
class Wait:
    """The point where the result of `collective` (started earlier) is first needed: the segment ends here."""

    collective: Node


def schedule(nodes: Sequence[Node], is_collective: Callable[[Node], bool]) -> list[Node | Wait]:
    """`nodes` (a topological order) reordered for overlap, with a `Wait` before the first use of each collective
    started earlier (see the module docstring). Nodes read only Values produced by `nodes` or from outside."""
    position = {node: i for i, node in enumerate(nodes)}
    producer: dict[Value, Node] = {out: node for node in nodes for out in node.outputs}
    users: dict[Node, list[Node]] = {node: [] for node in nodes}
    missing: dict[Node, int] = {}
    for node in nodes:
        deps = {producer[v] for v in node.inputs if v in producer}
        missing[node] = len(deps)
        for dep in deps:
            users[dep].append(node)
    collectives = [node for node in nodes if is_collective(node)]
    urgency = _urgency(nodes, users, {c: i for i, c in enumerate(collectives)})

    ready: list[tuple[int, int, Node]] = []  # local nodes whose inputs all exist: (urgency, position, node)
    blocked: set[Node] = set()  # collectives whose inputs exist, waiting for their turn
    in_flight: list[Node] = []  # started, not waited for, oldest first
    order: list[Node | Wait] = []
    turn = 0  # index of the next collective to start

    def available(node: Node) -> None:
        """`node`'s outputs exist: its users may become ready."""
        for user in users[node]:
            missing[user] -= 1
            if missing[user] == 0:
                if is_collective(user):
                    blocked.add(user)
                else:
                    heapq.heappush(ready, (urgency[user], position[user], user))

    for node in nodes:
        if missing[node] == 0:
            if is_collective(node):
                blocked.add(node)
            else:
                heapq.heappush(ready, (urgency[node], position[node], node))
    emitted = 0
    while emitted < len(nodes):
        if turn < len(collectives) and collectives[turn] in blocked:
            collective = collectives[turn]
            blocked.remove(collective)
            order.append(collective)
            in_flight.append(collective)
            turn, emitted = turn + 1, emitted + 1
        elif ready:
            node = heapq.heappop(ready)[2]
            order.append(node)
            available(node)
            emitted += 1
        elif in_flight:
            collective = in_flight.pop(0)
            order.append(Wait(collective))
            available(collective)
        else:  # pragma: no cover - a graph in topological order always makes progress
            raise ValueError("schedule: the nodes form a cycle or read a value no node produces")
    return order


def _urgency(nodes: Sequence[Node], users: dict[Node, list[Node]], rank: dict[Node, int]) -> dict[Node, int]:
    """For each node, the position of the first collective (in issue order) that needs it; len(rank) if none."""
    urgency: dict[Node, int] = {}
    for node in reversed(nodes):
        own = rank.get(node, len(rank))
        urgency[node] = min([own, *(urgency[u] for u in users[node])])
    return urgency

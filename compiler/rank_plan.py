"""Cutting a graph at its collectives into steps: runs of local nodes (one ONNX segment each) and collectives.

The order comes from the dependency graph (`rank_schedule.schedule`): each collective starts as soon as its inputs
exist, local work that does not need its result runs while it is in flight, and the segment being filled ends
where a result in flight is first needed. Walking that order, local nodes join the open segment; a collective, and
a wait for one, close it. Three kinds of node are placed apart:
- state writes (`Assign`): into the earliest segment that has their value and runs no earlier than the last
  read of the old value, so every read sees the value from before the step (the daemon swaps the buffer in
  when the segment holding the write runs);
- constants (no inputs) read only by local nodes, and selections of the graph's inputs (OpDef.selects: a
  parameter's block, a transposed or reshaped weight, a batch's rows) read only by local nodes: copied into every
  segment that reads them, instead of travelling through the tensor store (a level1 block computed at the start
  of the step was held there until its update);
- collectives: one step each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.rank_schedule import Wait, schedule, spmd_blocks
from tessel.v1 import collective_pb2


@dataclass
class Step:
    """A segment (`nodes`, run as one ONNX model) or one collective (`collective`, with `nodes` empty)."""

    nodes: list[Node] = field(default_factory=list)
    collective: Node | None = None
    phase: int | None = None  # a pipeline stage's: the phase of the schedule the segment runs in

    @property
    def members(self) -> list[Node]:
        return [self.collective] if self.collective is not None else self.nodes

    def reads(self) -> set[Value]:
        return {v for n in self.members for v in n.inputs}


def is_write(node: Node) -> bool:
    return registry.get(node.op).side_effect


def is_collective(node: Node) -> bool:
    return registry.get(node.op).collective is not None


def is_point_to_point(node: Node) -> bool:
    return registry.get(node.op).collective.kind in (collective_pb2.SEND, collective_pb2.RECV)


def plan_steps(graph: Graph, spmd: bool = False, phases: Mapping[Value, int] | None = None) -> list[Step]:
    """The steps of `graph` (collectives expanded, effects aliased: see rank_rewrite) in run order. `spmd`: every
    rank's graph is a copy of this one, so collectives may start in the order their inputs can exist (spmd_blocks).
    `phases`: the graph's order is the run order; a segment also ends where the phase changes (see
    lower_rank_program)."""
    copied = _copyable(graph)
    steps: list[Step] = []
    writes = [node for node in graph.nodes if node not in copied and is_write(node)]
    scheduled = [node for node in graph.nodes if node not in copied and not is_write(node)]
    if phases is not None:
        steps = _in_graph_order(scheduled, phases)
        _place_copies_and_writes(steps, copied, writes)
        return [s for s in steps if s.members]
    blocks = spmd_blocks(scheduled, is_collective, is_point_to_point) if spmd else None
    closed = True  # the next local node opens a new segment
    cost = _seconds(graph)
    for item in schedule(scheduled, is_collective, blocks, cost, MIN_OVERLAP_S):
        if isinstance(item, Wait):
            closed = True
        elif is_collective(item):
            steps.append(Step(collective=item))
            closed = True
        else:
            if closed:
                steps.append(Step())
                closed = False
            steps[-1].nodes.append(item)
    _place_copies_and_writes(steps, copied, writes)
    return [s for s in steps if s.members]


def _place_copies_and_writes(steps: list[Step], copied: dict[Node, None], writes: list[Node]) -> None:
    """Copies first, since a copy may read the state a write targets; then the writes, after every read of their
    targets; then again the copies a placed write reads (its value may be a copy), until nothing moves."""
    _copy_constants(steps, copied)
    for _ in range(len(writes) + 1):
        _place_writes(steps, writes)
        if not _copy_constants(steps, copied):
            return


def _in_graph_order(nodes: list[Node], phases: Mapping[Value, int]) -> list[Step]:
    """Steps in the nodes' order: a collective is a step, local nodes fill a segment until the next collective or
    the next phase (a node not in `phases`, made by a rewrite, has the phase of the node before it)."""
    steps: list[Step] = []
    phase, closed = None, True
    for node in nodes:
        if is_collective(node):
            steps.append(Step(collective=node))
            closed = True
            continue
        mine = phases.get(node.outputs[0], phase) if node.outputs else phase
        if closed or mine != phase:
            steps.append(Step(phase=mine))
            closed = False
        phase = mine
        steps[-1].nodes.append(node)
    return steps


# Local work worth running while a collective is in flight: an asynchronous start, a wait and one more segment cost
# tens of microseconds on the daemon, so less work than this runs after the wait instead.
MIN_OVERLAP_S = 100e-6
# A rough machine for that estimate (one core of the reference CPU), and the size a symbolic dim (the batch) is
# taken to have.
_FLOPS_PER_S, _BYTES_PER_S, _SYMBOL_SIZE = 2e10, 1e10, 32


def _seconds(graph: Graph):
    """A node's estimated run time from its op's cost (flops and bytes), symbolic dims taken as _SYMBOL_SIZE."""
    symbols = {d for n in graph.nodes for v in (*n.inputs, *n.outputs) for d in v.shape if isinstance(d, str)}
    sizes = dict.fromkeys(symbols, _SYMBOL_SIZE)

    def seconds(node: Node) -> float:
        cost = registry.get(node.op).cost(node, sizes)
        return cost.flops / _FLOPS_PER_S + cost.bytes / _BYTES_PER_S

    return seconds


def _copyable(graph: Graph) -> dict[Node, None]:
    """Nodes each reading segment runs itself (in graph order): constants (no inputs), and selections (OpDef.selects)
    of graph inputs and of other such nodes; only where every reader is a local node and no result is a graph
    output."""
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v, []).append(node)
    outputs = set(graph.outputs)
    sources = set(graph.inputs)  # values a copy may read: the graph's inputs and the copies' results
    copyable: dict[Node, None] = {}
    for node in graph.nodes:
        opdef = registry.get(node.op)
        selection = opdef.selects and all(v in sources for v in node.inputs)
        if (
            (selection or not node.inputs)
            and opdef.collective is None
            and not is_write(node)
            and not any(o in outputs for o in node.outputs)
            and all(registry.get(r.op).collective is None for o in node.outputs for r in readers.get(o, ()))
        ):
            copyable[node] = None
            sources.update(node.outputs)
    return copyable


def _bounds(steps: list[Step]) -> tuple[dict[Value, int], dict[Value, int]]:
    """({value: the first step index after its last read}, {value: the first step index where it exists}): a write
    may run from the larger of its target's and its value's (a write's target is not a read of it)."""
    read_until: dict[Value, int] = {}
    made_at: dict[Value, int] = {}
    for i, step in enumerate(steps):
        after = i + 1 if step.collective is not None else i
        for node in step.members:
            for v in node.inputs[1:] if is_write(node) else node.inputs:
                read_until[v] = after
            for out in node.outputs:
                made_at[out] = after
    return read_until, made_at


def _place_writes(steps: list[Step], writes: list[Node]) -> None:
    # Writes may read other state (Assign(a, b) next to Assign(b, c)): repeat until no write runs too early.
    # Writes already placed (by an earlier call) move only if they now run too early.
    mine = set(writes)
    where: dict[Node, int] = {n: i for i, step in enumerate(steps) for n in step.nodes if n in mine}
    for _ in range(len(writes) + 1):
        read_until, made_at = _bounds(steps)  # a write moves only later, so these only grow: repeat until still
        moved = False
        for write in writes:
            lowest = max(read_until.get(write.inputs[0], 0), made_at.get(write.inputs[1], 0))
            if write in where and where[write] >= lowest:
                continue
            if write in where:
                steps[where[write]].nodes.remove(write)
            index = next((i for i in range(lowest, len(steps)) if steps[i].collective is None), None)
            if index is None:
                steps.append(Step())
                index = len(steps) - 1
            steps[index].nodes.append(write)
            where[write], moved = index, True
        if not moved:
            return


def _copy_constants(steps: list[Step], copied: dict[Node, None]) -> bool:
    """Put at the start of every segment the copyable nodes its other nodes read, with the copies those read, in
    graph order, and no others (a write that moved away leaves no copy behind); whether any segment gained one."""
    by_output = {o: node for node in copied for o in node.outputs}
    added = False
    for step in steps:
        if step.collective is None:
            rest = [n for n in step.nodes if n not in copied]
            wanted = [by_output[v] for n in rest for v in n.inputs if v in by_output]
            needed: set[Node] = set()
            while wanted:
                node = wanted.pop()
                if node not in needed:
                    needed.add(node)
                    wanted += [by_output[v] for v in node.inputs if v in by_output]
            added = added or bool(needed - set(step.nodes))
            step.nodes[:] = [node for node in copied if node in needed] + rest
    return added

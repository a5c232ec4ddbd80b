"""Cutting a graph at its collectives into steps: runs of local nodes (one ONNX segment each) and collectives.

The graph's node order is the schedule. Walking it, local nodes join the open segment and a collective closes
it, so work that appears after a collective in the graph runs after it has started: a pass that wants overlap
orders the graph that way (bucket_allreduce puts each bucket's AllReduce right after its last gradient and the
gradient's consumers after the backward). Three kinds of node are placed apart:
- state writes (`Assign`): into the earliest segment that has their value and runs no earlier than the last
  read of the old value, so every read sees the value from before the step (the daemon swaps the buffer in
  when the segment holding the write runs);
- constants (no inputs) read only by local nodes: copied into every segment that reads them, instead of
  travelling through the tensor store;
- collectives: one step each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessel.compiler import registry
from tessel.compiler.ir import Graph, Node, Value


@dataclass
class Step:
    """A segment (`nodes`, run as one ONNX model) or one collective (`collective`, with `nodes` empty)."""

    nodes: list[Node] = field(default_factory=list)
    collective: Node | None = None

    @property
    def members(self) -> list[Node]:
        return [self.collective] if self.collective is not None else self.nodes

    def reads(self) -> set[Value]:
        return {v for n in self.members for v in n.inputs}


def is_write(node: Node) -> bool:
    return registry.get(node.op).side_effect


def plan_steps(graph: Graph) -> list[Step]:
    """The steps of `graph` (collectives expanded, effects aliased: see rank_rewrite) in run order."""
    copied = _copyable_constants(graph)
    steps: list[Step] = []
    writes: list[Node] = []
    for node in graph.nodes:
        if node in copied:
            continue
        if registry.get(node.op).collective is not None:
            steps.append(Step(collective=node))
        elif is_write(node):
            writes.append(node)
        else:
            if not steps or steps[-1].collective is not None:
                steps.append(Step())
            steps[-1].nodes.append(node)
    _place_writes(steps, writes)
    _copy_constants(steps, copied)
    return [s for s in steps if s.members]


def _copyable_constants(graph: Graph) -> dict[Node, None]:
    """Nodes without inputs whose every reader is a local node (and which are no graph output)."""
    readers: dict[Value, list[Node]] = {}
    for node in graph.nodes:
        for v in node.inputs:
            readers.setdefault(v, []).append(node)
    outputs = set(graph.outputs)
    return {
        node: None
        for node in graph.nodes
        if not node.inputs
        and registry.get(node.op).collective is None
        and not is_write(node)
        and not any(o in outputs for o in node.outputs)
        and all(registry.get(r.op).collective is None for o in node.outputs for r in readers.get(o, ()))
    }


def _earliest(steps: list[Step], write: Node) -> int:
    """The first step index where `write` may run: after its value exists and after every read of the target."""
    target, value = write.inputs[0], write.inputs[1]
    lowest = 0
    for i, step in enumerate(steps):
        after = i + 1 if step.collective is not None else i
        for node in step.members:
            if node is write:
                continue
            reads = node.inputs[1:] if is_write(node) else node.inputs  # a write's target is not a read
            if target in reads or value in node.outputs:
                lowest = max(lowest, after)
    return lowest


def _place_writes(steps: list[Step], writes: list[Node]) -> None:
    # Writes may read other state (Assign(a, b) next to Assign(b, c)): repeat until no write runs too early.
    where: dict[Node, int] = {}
    for _ in range(len(writes) + 1):
        moved = False
        for write in writes:
            lowest = _earliest(steps, write)
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


def _copy_constants(steps: list[Step], copied: dict[Node, None]) -> None:
    by_output = {o: node for node in copied for o in node.outputs}
    for step in steps:
        if step.collective is None:
            needed = {by_output[v] for v in step.reads() if v in by_output}
            step.nodes[:0] = [node for node in copied if node in needed]

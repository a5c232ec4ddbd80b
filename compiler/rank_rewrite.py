"""Rebuilding a graph node by node, for the passes around rank lowering: most nodes are kept (their inputs
remapped), a few are replaced by ops emitted in their place, and graph outputs follow the remapping.

    rewriter = Rewriter(graph)
    for node in graph.nodes:
        if wanted(node):
            with rewriter.at(node.source):
                rewriter.alias(node.outputs[0], apply("Neg", rewriter.tensor(node.inputs[0])).value)
        else:
            rewriter.keep(node)
    new_graph = rewriter.build()
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from tessel.compiler import registry
from tessel.compiler.builder import GraphBuilder, SymbolicTensor
from tessel.compiler.ir import Graph, Node, Value


class Rewriter:
    """A new graph over the same inputs; Values of kept nodes are shared with the old graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.builder = GraphBuilder(graph.name)
        self.builder.inputs = list(graph.inputs)
        self._map: dict[Value, Value] = {}

    def get(self, value: Value) -> Value:
        """What `value` of the old graph is in the new one."""
        return self._map.get(value, value)

    def tensor(self, value: Value) -> SymbolicTensor:
        """`value` (remapped) as a SymbolicTensor on the new graph, for emitting ops with `apply`."""
        return SymbolicTensor(self.builder, self.get(value))

    def alias(self, old: Value, new: Value) -> None:
        """From now on, uses of `old` read `new`."""
        self._map[old] = self.get(new)

    def keep(self, node: Node, inputs: Sequence[Value] | None = None) -> None:
        """Append `node` with its inputs remapped (or replaced by `inputs`); its outputs stay the same Values."""
        mapped = tuple(self.get(v) for v in node.inputs) if inputs is None else tuple(inputs)
        same = all(a is b for a, b in zip(mapped, node.inputs))
        self.builder.nodes.append(node if same else replace(node, inputs=mapped))

    @contextmanager
    def at(self, source: str | None) -> Iterator[None]:
        """Nodes emitted inside carry `source` (the user's line of the node they replace)."""
        start = len(self.builder.nodes)
        yield
        nodes = self.builder.nodes
        nodes[start:] = [replace(n, source=source) for n in nodes[start:]]

    def build(self, outputs: Sequence[Value] | None = None) -> Graph:
        """The new graph; `outputs` (old-graph Values) default to the old graph's outputs. Nothing is pruned."""
        values = self.graph.outputs if outputs is None else outputs
        outputs = tuple(map(self.get, values))
        return Graph(tuple(self.builder.inputs), tuple(self.builder.nodes), outputs, self.graph.name)


def expand_collectives(graph: Graph) -> Graph:
    """Rewrite collectives into the form the daemons run (AllGather/ReduceScatter along dim 0 only), with local
    ops around them (see each op's `Collective.expand`)."""
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        spec = registry.get(node.op).collective
        if spec is not None and spec.expand is not None and spec.needs_expand(node):
            with rewriter.at(node.source):
                spec.expand(rewriter, node)
        else:
            rewriter.keep(node)
    return rewriter.build()


def alias_effects(graph: Graph) -> Graph:
    """Make every reader of a state write's result (`Assign` returns its value) read the value itself, and every
    reader of a Send's result read what was sent, so that writes and sends can be scheduled on their own."""
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        rewriter.keep(node)
        spec = registry.get(node.op).collective
        if registry.get(node.op).side_effect:
            rewriter.alias(node.outputs[0], rewriter.get(node.inputs[1]))
        elif spec is not None and spec.alias:
            for out, sent in zip(node.outputs, node.inputs):
                rewriter.alias(out, rewriter.get(sent))
    return rewriter.build()

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

import numpy as np

from tessel.compiler import registry
from tessel.compiler.builder import GraphBuilder, SymbolicTensor
from tessel.compiler.ir import Graph, Node, Value
from tessel.compiler.shapes import is_static, numel


class Rewriter:
    """A new graph over the same inputs; Values of kept nodes are shared with the old graph."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.builder = GraphBuilder(graph.name)
        self.builder.inputs = list(graph.inputs)
        self._map: dict[Value, Value] = {}

    def get(self, value: Value) -> Value:
        """What `value` of the old graph is in the new one (through aliases made since `value`'s own)."""
        while value in self._map and self._map[value] is not value:
            value = self._map[value]
        return value

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


def read_through_identities(graph: Graph) -> Graph:
    """Make every reader of an identity op's result (OpDef.identity: Identity, and Mirror, whose meaning is all in
    its gradient) read the op's input itself, so that no segment returns a copy of a tensor the daemon already
    holds. Data parallelism reads each weight through a Mirror: where the forward and the backward pass use a
    weight in two segments, the first one copied it into its outputs every step (16 MiB for a 2048 x 2048 weight).
    A result the graph returns keeps its node: its store name is the output's, and a returned copy of a parameter
    the step assigns must be the value from before the write. Reading the parameter itself stays correct: a state
    write is placed after every reader of its target (rank_plan)."""
    returned = set(graph.outputs)
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        passes = registry.get(node.op).identity and len(node.inputs) == len(node.outputs) == 1
        if passes and node.outputs[0] not in returned and node.outputs[0].type == node.inputs[0].type:
            rewriter.alias(node.outputs[0], rewriter.get(node.inputs[0]))
        else:
            rewriter.keep(node)
    return rewriter.build()


def merge_duplicates(graph: Graph) -> Graph:
    """One node for nodes of one op with the same attributes, inputs (once merged themselves) and output types: the
    same work written twice, as each of MicroBatchInterleaved's copies scales its loss's seed alike. State writes,
    collectives, ordering nodes and random ops stay as they are."""
    rewriter = Rewriter(graph)
    seen: dict[tuple, Node] = {}
    merged = False
    for node in graph.nodes:
        opdef = registry.get(node.op)
        if opdef.side_effect or opdef.collective is not None or opdef.orders or opdef.random:
            rewriter.keep(node)
            continue
        key = (node.op, node.attrs, tuple(map(rewriter.get, node.inputs)), tuple(v.type for v in node.outputs))
        earlier = seen.setdefault(key, node)
        if earlier is node:
            rewriter.keep(node)
            continue
        merged = True
        for old, new in zip(node.outputs, earlier.outputs):
            rewriter.alias(old, new)
    return rewriter.build() if merged else graph


# Largest result folded into a constant: a loss seed or a count, not a tensor worth keeping out of the model.
FOLD_ELEMENTS = 4096


def fold_value_free(graph: Graph) -> Graph:
    """Replace every node whose result depends on no input's value by the constant it computes: its ONNX lowering
    reads only its inputs' (static) shapes, as a tensor of ones shaped like the loss (autodiff's seed) or the size of
    a dim does. Such a node would otherwise order the schedule for nothing: the backward pass could not start before
    every copy's loss, and with it every forward collective, had been computed."""
    rewriter = Rewriter(graph)
    for node in graph.nodes:
        value = _constant_result(node)
        if value is None:
            rewriter.keep(node)
        else:
            with rewriter.at(node.source):
                rewriter.alias(node.outputs[0], rewriter.builder.constant(value, node.outputs[0].dtype))
    return rewriter.build()


def _constant_result(node: Node) -> np.ndarray | None:
    """The value of `node` when its lowering reads none of its inputs (small, static results only), else None."""
    from tessel.compiler.lower_onnx import LoweringContext, to_onnx

    opdef = registry.get(node.op)
    if not node.inputs or len(node.outputs) != 1 or opdef.side_effect or opdef.collective is not None:
        return None
    values = (*node.inputs, *node.outputs)
    if not all(is_static(v.shape) for v in values) or numel(node.outputs[0].shape) > FOLD_ELEMENTS:
        return None
    inputs = tuple(Value(v.type, f"in{i}") for i, v in enumerate(node.inputs))
    alone = Graph(inputs, (Node(node.op, inputs, node.attrs, node.outputs),), node.outputs, "fold")
    context = LoweringContext(alone)
    opdef.lower(context, alone.nodes[0], [v.name for v in inputs], ["out0"])
    if any(name in proto.input for proto in context.nodes for name in (v.name for v in inputs)):
        return None
    model = to_onnx(alone)
    del model.graph.input[:]  # read by no node
    return np.asarray(_evaluate(model), dtype=node.outputs[0].dtype.numpy)


def _evaluate(model) -> np.ndarray:
    """The one output of an ONNX model that reads no input: numpy for the few ops a value-free lowering uses (a
    constant filled in, reshaped), ONNX's reference evaluator for anything else (it loads every op it knows first,
    a tenth of a second that each rank would pay again)."""
    from onnx import numpy_helper

    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for proto in model.graph.node:
        step = _NUMPY_STEPS.get(proto.op_type)
        attrs = {a.name: a for a in proto.attribute}
        known = proto.domain in ("", "ai.onnx") and len(proto.output) == 1
        if step is None or not known or (proto.op_type == "Constant" and "value" not in attrs):
            from onnx.reference import ReferenceEvaluator

            (result,) = ReferenceEvaluator(model).run(None, {})
            return result
        values[proto.output[0]] = step([values[name] if name else None for name in proto.input], attrs)
    return values[model.graph.output[0].name]


def _constant_of_shape(inputs, attrs):
    from onnx import numpy_helper

    fill = numpy_helper.to_array(attrs["value"].t) if "value" in attrs else np.zeros(1, np.float32)
    return np.full(tuple(int(d) for d in inputs[0]), fill.reshape(-1)[0], dtype=fill.dtype)


def _constant(inputs, attrs):
    from onnx import numpy_helper

    return numpy_helper.to_array(attrs["value"].t)


def _cast(inputs, attrs):
    from onnx import helper

    return inputs[0].astype(helper.tensor_dtype_to_np_dtype(attrs["to"].i))


def _reshape(inputs, attrs):
    x, shape = inputs
    dims = [int(d) for d in shape]
    if not (attrs.get("allowzero") and attrs["allowzero"].i):
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


def _axes(inputs, attrs):
    if len(inputs) > 1 and inputs[1] is not None:
        return tuple(int(a) for a in inputs[1])
    return tuple(attrs["axes"].ints) if "axes" in attrs else None


def _unsqueeze(inputs, attrs):
    x, axes = inputs[0], _axes(inputs, attrs)
    rank = x.ndim + len(axes)
    return x.reshape(_unsqueezed(x.shape, sorted(a % rank for a in axes)))


def _unsqueezed(shape, axes):
    dims = list(shape)
    for axis in axes:
        dims.insert(axis, 1)
    return dims


def _squeeze(inputs, attrs):
    axes = _axes(inputs, attrs)
    return np.squeeze(inputs[0], axis=None if axes is None else tuple(a % inputs[0].ndim for a in axes))


_NUMPY_STEPS = {
    "Identity": lambda inputs, attrs: inputs[0],
    "ConstantOfShape": _constant_of_shape,
    "Constant": _constant,
    "Cast": _cast,
    "Reshape": _reshape,
    "Expand": lambda inputs, attrs: np.broadcast_to(
        inputs[0], np.broadcast_shapes(inputs[0].shape, tuple(int(d) for d in inputs[1]))
    ).copy(),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Concat": lambda inputs, attrs: np.concatenate(inputs, axis=attrs["axis"].i),
    "Add": lambda inputs, attrs: np.add(*inputs),
    "Sub": lambda inputs, attrs: np.subtract(*inputs),
    "Mul": lambda inputs, attrs: np.multiply(*inputs),
}


def op_rewrites(graph: Graph, context: registry.RewriteContext = registry.NOTHING_KNOWN) -> Graph:
    """The rank-graph rewrites the ops' definitions bring (registry.OpDef.rewrite), each applied in turn."""
    for rewrite in registry.rewrites():
        graph = rewrite(graph, context)
    return graph
